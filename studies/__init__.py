"""Studies: the commands that produce the published results (docs/results, docs tables) — research, not the
regression suite (that is bench/, the pytest-benchmark suite). Each is a module run from the repository root with
``python -m studies.<folder>.<name> --help``:

- ``generation/``: faithfulness of generation explanations (``faithfulness``), the held-out choice of NormXLogit's
  settings (``study``), peers side by side (``peers``: inseq, Captum, LXT);
- ``parity/``: normx against other implementations run in their own virtualenvs (``attnlrp`` with
  ``lxt_attnlrp``, ``decompx_official``), and normx on a GPU against normx on the CPU (``cuda_check``);
- ``coverage/``: which transformers architectures normx explains (``architectures``, ``decoder_decompx``);
- ``variants/``: the variant search (``search``);
- ``timing/``: one-off timings (``generation_attention``, ``integration_cost``, ``gguf_load``, ``report_load``;
  ``peer_cost`` is the peers study's measuring helper).

Shared settings (data folder, results folder, provenance) live in :mod:`studies.settings`. Studies reach normx
through its public entry points only; data comes from ``--data`` or ``$NORMX_DATA`` (never a machine path).
"""
