"""Evaluating explanations: faithfulness (AOPC comprehensiveness / sufficiency, accuracy, Pearson;
:mod:`~normx.evaluation.faithfulness`) and evidence alignment on BLiMP (:mod:`~normx.evaluation.blimp`), with their
figures (:mod:`~normx.evaluation.plots`). The ``normx evaluate`` commands are in :mod:`normx.cli`.

Imports ``normx.explanations`` and the layers below it, and ``normx.data``.
"""
