"""``budgeted``'s surrogate: the sources' weights from masks and the response's log-probability under each, a linear
fit on the log of its negative log-likelihood (Huber's loss, or least squares; towards a one-pass prior where given),
and the fit that reads re-read masks beside the real ones as a covariate (:func:`covariate`)."""

from __future__ import annotations

import numpy as np

from normx.errors import InvalidInputError

RIDGE = 0.01  # the surrogate's ridge penalty on the centred masks (chosen on training contexts: docs/context.md)
PRIOR_RIDGE = 1.0  # with a prior: the penalty on the weights' departure from the scaled prior (docs/context.md)
LOSSES = ("huber", "squares")
HUBER = 1.345  # Huber's corner, in robust standard deviations of the residuals (the usual 95 %-efficient one)
ROUNDS = 20  # reweightings at most (they settle within a few on the designs the budget buys)
TINY_NLL = 1e-6  # a response the model is sure of (log p rounded to 0): its loss, for the log the surrogate fits
COVARIATE_RIDGE = 1.0  # re-reads as a covariate: the ridge on the real masks' corrections (docs/context.md)


def surrogate(masks: np.ndarray, log_p: np.ndarray, prior: np.ndarray | None = None,
              strength: float = PRIOR_RIDGE, loss: str = "huber", corner: float = HUBER,
              ridge: float = RIDGE) -> np.ndarray:
    """The sources' weights from the masks' outcomes ``log_p`` (the response's log-probability under each): the
    linear surrogate (:func:`fit`) of log(-log p), the log of the response's negative log-likelihood, on which a
    source that multiplies the likelihood's loss adds a constant (chosen on training contexts over fitting log p
    itself: docs/context.md). The weights are given in nats of log-probability at the whole context: times the NLL
    there (d log p / d log NLL) of the mask that keeps every source, or without one the masks' geometric mean."""
    nll = np.maximum(-np.asarray(log_p, np.float64), TINY_NLL)
    whole = np.asarray(masks, bool).all(1)
    anchor = nll[whole][0] if whole.any() else float(np.exp(np.log(nll).mean()))
    return anchor * fit(masks, -np.log(nll), prior, strength, loss, corner, ridge)


def fit(masks: np.ndarray, log_p: np.ndarray, prior: np.ndarray | None = None,
        strength: float = PRIOR_RIDGE, loss: str = "huber", corner: float = HUBER, ridge: float = RIDGE) -> np.ndarray:
    """Each source's weight in a surrogate of the response's log-probability (``log_p`` [masks]) linear in the masks.
    Without a ``prior``: a small ridge ``ridge`` (:data:`RIDGE`) for designs cut short; a source kept or removed in
    every mask weighs 0. With one (a score per source): the weights are ``c * prior + d``, the scale ``c`` fitted
    freely and ``d`` shrunk towards 0 by ``strength`` (a ridge towards the scaled prior), so the masks correct the
    prior where they vary the sources and a source no mask varied keeps ``c`` times its prior. ``loss``: ``"huber"``
    (Huber's loss, iteratively reweighted: a mask whose outcome lies more than ``corner`` robust standard deviations
    off the fit counts as if it lay there, so that a few masks far off a linear surrogate do not tilt the order it
    gives every other mask; chosen on training contexts, docs/context.md) or ``"squares"`` (least squares)."""
    if loss not in LOSSES:
        raise InvalidInputError(f"loss={loss!r} is not one of {LOSSES}")
    x = np.asarray(masks, np.float64)
    y = np.asarray(log_p, np.float64)
    live = np.flatnonzero(x.std(0) > 0)
    rows = np.ones(len(y))
    for _ in range(ROUNDS if loss == "huber" else 1):
        weights, residuals = _weighted(x, y, rows, live, prior, strength, ridge)
        scale = 1.4826 * np.median(np.abs(residuals - np.median(residuals)))  # (the residuals' MAD, as a deviation)
        if loss != "huber" or not scale > 0:
            break
        updated = np.minimum(1.0, corner * scale / np.maximum(np.abs(residuals), np.finfo(float).tiny))
        if np.allclose(updated, rows, rtol=0, atol=1e-9):
            break
        rows = updated
    return weights


def _weighted(x: np.ndarray, y: np.ndarray, rows: np.ndarray, live: np.ndarray, prior: np.ndarray | None,
              strength: float, ridge: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`fit`'s weighted least squares (each mask weighted by ``rows``, masks and outcomes centred on their
    weighted means): (the sources' weights, each mask's residual)."""
    share = rows / rows.sum()
    x = x - share @ x
    y = y - share @ y
    root = np.sqrt(rows)[:, None]
    weights = np.zeros(x.shape[1])
    if prior is not None:
        prior = np.asarray(prior, np.float64)
        design = np.column_stack([x @ prior, x[:, live]])  # (the outcome the prior predicts, up to its scale)
        penalty = np.sqrt(strength) * np.eye(len(live) + 1)[1:]  # (the scale is not penalised)
        found = np.linalg.lstsq(np.vstack([design * root, penalty]),
                                np.concatenate([y * root[:, 0], np.zeros(len(live))]), rcond=None)[0]
        weights = found[0] * prior
        weights[live] += found[1:]
    elif len(live):
        xl = x[:, live]
        weights[live] = np.linalg.solve(xl.T @ (xl * rows[:, None]) + ridge * np.eye(len(live)), xl.T @ (rows * y))
    return weights, y - x @ weights


def covariate(masks: np.ndarray, real: np.ndarray, reread: np.ndarray, reread_weights: np.ndarray,
              spread: np.ndarray, strength: float = COVARIATE_RIDGE) -> np.ndarray:
    """The sources' weights on the log of the loss from the real masks (``masks`` [M, columns]: sources, or groups
    of them) and ``real``, their outcomes as :func:`fit` reads them (minus the log of the loss), beside ``reread``,
    the same masks' re-read outcomes, and ``reread_weights``, every source's weight in the surrogate of all the
    re-reads (:func:`fit`): ``real ~ a + b * reread + masks @ d``, the corrections ``d`` shrunk by a ridge
    ``strength``; a source's weight ``b`` times its re-read weight plus its column's correction, shared by the
    ``spread`` [sources, columns] (a group's, by its sources' tokens). The re-reads' surrogate, corrected by the real
    masks where it is off."""
    x = np.asarray(masks, np.float64)
    design = np.hstack([np.ones((len(x), 1)), np.asarray(reread, np.float64)[:, None], x])
    penalty = np.diag([0.0, 0.0] + [strength] * x.shape[1])
    coef = np.linalg.solve(design.T @ design + penalty, design.T @ np.asarray(real, np.float64))
    return coef[1] * np.asarray(reread_weights, np.float64) + np.asarray(spread, np.float64) @ coef[2:]


def group_columns(groups: list[list[int]]) -> list[int]:
    """Each source's group (``groups``: the sources' indices in each, adjacent and in order): a design over the groups
    indexed by it, ``design[:, group_columns(groups)]``, is the same masks over the sources."""
    return [g for g, members in enumerate(groups) for _ in members]


def spread(groups: list[list[int]], sizes) -> np.ndarray:
    """[sources, groups]: each group's weight shared by its sources (``groups``: the sources' indices in each) in
    proportion to their ``sizes`` (tokens)."""
    sizes = np.asarray(sizes, np.float64)
    column = np.array(group_columns(groups))
    order = np.array([j for members in groups for j in members])
    out = np.zeros((len(sizes), len(groups)))
    out[order, column] = sizes[order] / np.bincount(column, sizes[order])[column]
    return out


def log_loss(log_p) -> np.ndarray:
    """The log of the response's negative log-likelihood (at least :data:`TINY_NLL`), from its log-probability."""
    return np.log(np.maximum(-np.asarray(log_p, np.float64), TINY_NLL))


def with_rereads(keeps: np.ndarray, real: np.ndarray, on_sources: np.ndarray, reread: np.ndarray, extra: np.ndarray,
                 spread: np.ndarray, loss: str = "huber") -> np.ndarray:
    """The sources' weights in nats of log-probability at the whole context, from real masks read beside re-reads:
    ``keeps`` [M + 1, columns] (row 0 keeps every column: the whole pass) and ``real`` [M + 1], the response's
    log-probability under each; ``on_sources`` [M + 1, sources], the same masks of the sources; ``reread`` [M + E],
    the re-read log-probabilities of masks 1..M and then of the ``extra`` [E, sources] masks; ``spread`` as
    :func:`covariate`'s. The re-reads' surrogate (:func:`fit`, ``loss``) over every re-read and the whole pass (its
    own re-read), then :func:`covariate` on the real masks."""
    keeps, real, reread = np.asarray(keeps, bool), np.asarray(real, np.float64), np.asarray(reread, np.float64)
    m = len(keeps) - 1
    own = np.concatenate([real[:1], reread[:m]])
    weights = fit(np.vstack([on_sources, extra]), -log_loss(np.concatenate([own, reread[m:]])), loss=loss)
    nll = max(-real[0], TINY_NLL)
    return nll * covariate(keeps, -log_loss(real), -log_loss(own), weights, spread)
