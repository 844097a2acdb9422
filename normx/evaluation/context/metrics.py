"""The context-attribution scores, as functions of numbers only (no model): the linear datamodeling score (LDS), the
log-probability drop when the top-k sources are removed, and evidence recall.

A method's reading of a context is one score per source, ``s`` [sources]. Under a mask (bool [sources]: True =
kept) it predicts the response's outcome to be ``sum of s over the kept sources`` (ContextCite's linear surrogate,
without its bias, which no Spearman correlation sees). Sources are ranked by descending score; ties keep the earlier
source first (a stable sort), so a constant reading ranks the sources in their order.
"""

from __future__ import annotations

import numpy as np

from normx.errors import InvalidInputError
from normx.evaluation.generation import _mean_ranks


def lds_masks(sources: int, count: int, seed: int, keep: float = 0.5) -> np.ndarray:
    """``count`` random masks (bool [count, sources]), each source kept with probability ``keep``, from
    ``numpy.random.default_rng([seed, sources])``: held out from every method's own ablations (ContextCite's come
    from ``RandomState(seed + i)``)."""
    if sources < 1 or count < 2:
        raise InvalidInputError(f"LDS needs at least one source and two masks, got {sources} and {count}")
    return np.random.default_rng([seed, sources]).random((count, sources)) < keep


def spearman(a, b) -> float:
    """Spearman's rank correlation (ties: mean ranks); 0 when either side is constant."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise InvalidInputError(f"spearman needs two vectors of one length, got {a.shape} and {b.shape}")
    ra, rb = _mean_ranks(a), _mean_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    scale = np.sqrt((ra ** 2).sum() * (rb ** 2).sum())
    return float((ra * rb).sum() / scale) if scale > 0 else 0.0


def lds(scores, masks, outcomes) -> float:
    """The linear datamodeling score of one context: the Spearman correlation over the masks between the predicted
    outcome (the sum of the kept sources' scores) and the actual one (``outcomes`` [masks])."""
    scores, masks = np.asarray(scores, np.float64), np.asarray(masks, bool)
    if masks.ndim != 2 or masks.shape[1] != scores.shape[0]:
        raise InvalidInputError(f"masks {masks.shape} do not match {scores.shape[0]} source scores")
    if not np.isfinite(scores).all():
        raise InvalidInputError("the source scores hold NaN or infinite values")
    return spearman(masks @ scores, outcomes)


def order(scores) -> np.ndarray:
    """Source indices by descending score, ties in source order."""
    return np.argsort(-np.asarray(scores, np.float64), kind="stable")


def removal_mask(scores, k: int) -> np.ndarray:
    """The mask that removes the ``k`` top-scored sources (at most all but one) and keeps the rest."""
    scores = np.asarray(scores, np.float64)
    keep = np.ones(len(scores), bool)
    keep[order(scores)[:min(k, len(scores) - 1)]] = False
    return keep


def evidence_at(scores, evidence, k: int) -> float:
    """1.0 when one of the ``evidence`` sources is among the ``k`` top-scored, else 0.0."""
    return float(bool(set(order(scores)[:k].tolist()) & {int(e) for e in evidence}))


def mean_and_error(values) -> tuple[float, float]:
    """The mean and its standard error (NaN for fewer than two values)."""
    values = np.asarray([v for v in values if v is not None and np.isfinite(v)], np.float64)
    if not len(values):
        return float("nan"), float("nan")
    error = float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")
    return float(values.mean()), error
