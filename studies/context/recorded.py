"""The recorded ``budgeted`` runs of :mod:`studies.context.budget`'s JSON lines, for the studies that refit them
without running the model again (:mod:`studies.context.prior_strength`, :mod:`studies.context.surrogate_outcome`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path


def recorded_runs(files: list[Path], keep: Callable[[str, dict], bool]) -> Iterator[tuple[str, dict, object, object]]:
    """``(run, found, masks, truth)`` for each method entry ``found`` (its ``design``, ``outcomes``, ...) of each
    context that has the real removals (``truth``) where ``keep(spec, found)`` holds and the entry has a design; ``run``
    names the file and spec, ``masks`` are the context's LDS masks, ``truth`` their outcomes."""
    import numpy as np

    from normx.evaluation.context import metrics

    for file in files:
        for line in file.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if not record.get("truth"):
                continue
            masks = metrics.lds_masks(record["sources"], len(record["truth"]), 0)
            truth = np.array(record["truth"])
            for spec, found in record["methods"].items():
                if found.get("design") and keep(spec, found):
                    yield f"{file.name}: {spec}", found, masks, truth
