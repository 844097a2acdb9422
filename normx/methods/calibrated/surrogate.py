"""The ``reread`` family of a calibrated context method: a small per-context surrogate of what removing sources does,
fitted to re-read ablations (:func:`normx.methods.decoder.rereads.masked_rereads`: the prompt read once, the last
rows read again under a few masks with the removed sources hidden and the positions closed up).

The masks (:func:`balanced_masks`): the keep-everything mask, then ``count`` masks that keep each source in half of
them (rounded; an odd count alternates which half) with columns as little correlated as a seeded search over
``SEARCH`` candidates finds (ContextCite's random masks need many draws to be balanced; a handful must be balanced
by design). Deterministic: the same sources and count give the same masks.

The estimate (:func:`ridge_effects`), per response step t: the sources' effects beta_t minimizing

    sum_m w_m (log p_t(m) - c_t - sum_j m_j beta_(t,j))^2 + lambda * ||beta_t||^2

(an intercept c_t unpenalised; the keep-everything mask weighted :data:`FULL_WEIGHT`, the others 1), so that summed
over the steps beta_j is the surrogate's prediction of the drop in the response's log-probability when source j is
removed from half of the context (the regime of ContextCite's masks and of the LDS).

Layer 3 (methods): numpy only.
"""

from __future__ import annotations

import numpy as np

from normx.errors import InvalidInputError

SEARCH = 256  # candidate designs the balanced search draws
RIDGE = 0.5  # lambda, in squared log-probability per unit effect
FULL_WEIGHT = 1.0


def balanced_masks(sources: int, count: int, seed: int = 0) -> np.ndarray:
    """bool [1 + count, sources]: keep everything, then ``count`` balanced masks (see the module's docstring)."""
    if sources < 1 or count < 2:
        raise InvalidInputError(f"re-read masks need at least one source and two masks, got {sources} and {count}")
    rng = np.random.default_rng([seed, 46, sources, count])
    best, score = None, None
    for _ in range(SEARCH):
        design = np.zeros((count, sources), bool)
        for j in range(sources):
            kept = count // 2 + (count % 2) * (j % 2)
            design[rng.permutation(count)[:kept], j] = True
        signed = design * 2.0 - 1.0
        gram = signed.T @ signed
        value = float((gram ** 2).sum() - (np.diag(gram) ** 2).sum())
        if score is None or value < score:
            best, score = design, value
    return np.vstack([np.ones((1, sources), bool), best])


def ridge_effects(masks: np.ndarray, log_p: np.ndarray, lam: float = RIDGE, full_weight: float = FULL_WEIGHT
                  ) -> np.ndarray:
    """beta [sources, steps] float64 from ``log_p`` [M, steps] under ``masks`` (bool [M, sources], row 0 the
    keep-everything mask weighted ``full_weight``)."""
    masks, log_p = np.asarray(masks, bool), np.asarray(log_p, np.float64)
    if masks.ndim != 2 or log_p.ndim != 2 or len(masks) != len(log_p):
        raise InvalidInputError(f"ridge_effects needs masks [M, sources] and outcomes [M, steps], got "
                                f"{masks.shape} and {log_p.shape}")
    sources = masks.shape[1]
    weight = np.ones(len(masks))
    weight[0] = full_weight
    design = np.c_[masks.astype(np.float64), np.ones(len(masks))]
    penalty = np.diag(np.r_[np.full(sources, float(lam)), 0.0])
    solved = np.linalg.solve(design.T @ (weight[:, None] * design) + penalty, design.T @ (weight[:, None] * log_p))
    return solved[:sources]
