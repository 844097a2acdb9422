"""The recorded ``budgeted`` runs of :mod:`studies.context.budget`'s JSON lines, for the studies that refit them
without running the model again (:mod:`studies.context.prior_strength`, :mod:`studies.context.surrogate_outcome`,
:mod:`studies.context.surrogate_loss`), and their tables pooled."""

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


def pooled(table: dict[str, dict[str, list[float]]]) -> dict[str, list[float]]:
    """Every run's values of ``table`` (run -> key -> LDS per context) pooled by key, in the runs' order."""
    found: dict[str, list[float]] = {}
    for row in table.values():
        for key, values in row.items():
            found.setdefault(key, []).extend(values)
    return found


def run_means(table: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, dict]]:
    """Each run's mean LDS and number of contexts, per key of ``table``."""
    import numpy as np

    return {run: {key: {"mean": float(np.mean(v)), "contexts": len(v)} for key, v in row.items()}
            for run, row in table.items()}
