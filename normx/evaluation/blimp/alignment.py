"""Alignment of an attribution with known evidence tokens: Dot Product and Average Precision.

Both take the scores of one explanation (``[tokens]``, or ``[layers, tokens]`` for every layer at once), the
evidence token positions and the positions to leave out (the target / mask token), as in the NormXLogit paper's
evaluation (after Mohebbi et al. 2023):

- **Dot Product (DP)**: the scores made a distribution over the remaining tokens, summed at the evidence tokens;
  the attribution mass that lands on the evidence. As the authors' code does, scores that are already shares
  (non-negative, a mixing-map row: GlobEnc, ALTI, Value Zeroing) are divided by their sum, and other scores go
  through a softmax (``normalise="sum"`` / ``"softmax"``). Uniform scores give ``len(evidence) / n``.
- **Average Precision (AP)**: rank the remaining tokens by score, highest first; AP is the mean, over the
  evidence tokens, of the precision at each one's rank. One evidence token ranked r-th gives 1 / r. Tokens with
  equal scores are in no particular order, so AP is its exact expectation over the orders of each tie (all scores
  equal: the mean of 1 / r over r = 1..n for one evidence token), not an artefact of position.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from normx.errors import InvalidInputError


def _kept(scores, evidence: Sequence[int], exclude: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Scores [layers, kept tokens] without the excluded positions, and the evidence's columns among them."""
    values = np.asarray(scores, dtype=np.float64)
    if values.ndim not in (1, 2):
        raise InvalidInputError(f"scores must be [tokens] or [layers, tokens], got shape {values.shape}")
    values = np.atleast_2d(values)
    n = values.shape[1]
    evidence, exclude = sorted(set(int(i) for i in evidence)), set(int(i) for i in exclude)
    if not evidence:
        raise InvalidInputError("no evidence positions given; alignment needs at least one")
    bad = [i for i in evidence if not 0 <= i < n]
    if bad:
        raise InvalidInputError(f"evidence positions {bad} are outside the {n} scored tokens")
    if exclude & set(evidence):
        raise InvalidInputError(f"evidence positions {sorted(exclude & set(evidence))} are also excluded")
    keep = [i for i in range(n) if i not in exclude]
    if not np.isfinite(values[:, keep]).all():
        raise InvalidInputError("scores contain NaN or infinite values")
    columns = np.searchsorted(keep, evidence)
    return values[:, keep], columns


def dot_product(scores, evidence: Sequence[int], exclude: Sequence[int] = (), normalise: str = "softmax"
                ) -> np.ndarray | float:
    """``scores`` over the tokens not in ``exclude`` made a distribution (``"softmax"``, or ``"sum"``: divided by
    their sum, for non-negative shares; all zero: uniform), summed at ``evidence``; one value per layer."""
    values, columns = _kept(scores, evidence, exclude)
    if normalise == "sum":
        if (values < 0).any():
            raise InvalidInputError("normalise='sum' takes non-negative scores (shares); use 'softmax'")
        totals = values.sum(axis=1, keepdims=True)
        probs = np.where(totals > 0, values / np.where(totals > 0, totals, 1.0), 1.0 / values.shape[1])
    elif normalise == "softmax":
        shifted = values - values.max(axis=1, keepdims=True)
        probs = np.exp(shifted)
        probs /= probs.sum(axis=1, keepdims=True)
    else:
        raise InvalidInputError(f"normalise={normalise!r} is not allowed; use 'softmax' or 'sum'")
    out = probs[:, columns].sum(axis=1)
    return float(out[0]) if np.ndim(scores) == 1 else out


def average_precision(scores, evidence: Sequence[int], exclude: Sequence[int] = ()) -> np.ndarray | float:
    """Average precision of the evidence in the ranking of the tokens not in ``exclude``; one value per layer
    (expected over the orders of tied scores)."""
    values, columns = _kept(scores, evidence, exclude)
    out = np.array([_expected_ap(row, columns) for row in values])
    return float(out[0]) if np.ndim(scores) == 1 else out


def _expected_ap(row: np.ndarray, columns: np.ndarray) -> float:
    """AP of one ranking, averaged over the orders of tied tokens.

    For the evidence tokens tied at one score: ``a`` tokens (``b`` of them evidence) score higher and the tie has
    ``g`` tokens, ``h`` of them evidence. Their positions in the tie are a uniformly random h-subset of 1..g, so the
    i-th of them sits at p with probability C(p-1, i-1) C(g-p, h-i) / C(g, h), at rank a + p, with precision
    (b + i) / (a + p) there.
    """
    evidence_scores = row[columns]
    total = 0.0
    for score in np.unique(evidence_scores):
        a = int((row > score).sum())
        b = int((evidence_scores > score).sum())
        g = int((row == score).sum())
        h = int((evidence_scores == score).sum())
        ways = math.comb(g, h)
        for i in range(1, h + 1):
            expected = sum(math.comb(p - 1, i - 1) * math.comb(g - p, h - i) / (a + p) for p in range(i, g - h + i + 1))
            total += (b + i) * expected / ways
    return total / len(columns)
