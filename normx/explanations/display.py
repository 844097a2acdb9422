"""The colour-scale rule every display of an explanation shares (the terminal table, the demo's page): a row of
scores is scaled by its largest finite magnitude among the units that are not special tokens."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def scale_of(view, rows: Sequence[np.ndarray]) -> float:
    """The largest finite |score| among the view's non-special units over ``rows`` (0 if none); ``view``: an
    :class:`~normx.explanations.result.Explanation` (or anything with its ``tokens`` and ``special``)."""
    keep = [i for i, special in enumerate(view.special) if not special] or list(range(len(view.tokens)))
    values = [np.abs(np.asarray(row, dtype=np.float64)[keep]) for row in rows if len(keep)]
    values = [v[np.isfinite(v)] for v in values]
    return float(max((v.max() for v in values if v.size), default=0.0))
