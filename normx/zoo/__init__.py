"""The model zoo: named models that load with no network (a base from PyPI plus a small trained adapter and head
shipped in ``presets_data/``), how each is trained (recipes, training, the BLiMP masked-LM objective), and
``load_model``, which takes a preset name or anything :mod:`normx.models.loading` loads.

Imports ``normx.models`` and ``normx.data`` (the training sets); nothing that explains.
"""
