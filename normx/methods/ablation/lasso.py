"""A small LASSO (coordinate descent, numpy), and ContextCite's surrogate fit on ablation masks.

:func:`lasso` minimises ``(1 / (2 n)) ||y - X w - b||^2 + alpha ||w||_1`` with an unpenalised intercept ``b``, the
objective of scikit-learn's ``Lasso`` (which normx does not depend on). :func:`surrogate` is ContextCite 0.0.4's
``LassoRegression.fit``: the masks standardised (``StandardScaler``: mean 0, population standard deviation 1; a
constant column is left unscaled), the outcome divided by the number of response tokens, ``Lasso(alpha=0.01)``, and
the weights scaled back to 0/1 masks and to the outcome's units.
"""

from __future__ import annotations

import numpy as np


def soft_threshold(value: float, threshold: float) -> float:
    return float(np.sign(value) * max(abs(value) - threshold, 0.0))


def lasso(x: np.ndarray, y: np.ndarray, alpha: float, *, max_iter: int = 10_000, tol: float = 1e-10
          ) -> tuple[np.ndarray, float]:
    """``(w, b)`` minimising ``(1 / (2 n)) ||y - x w - b||^2 + alpha ||w||_1`` (``x`` [n, d], ``y`` [n]), by cyclic
    coordinate descent on the centred problem until no weight moves more than ``tol`` (relative to the largest) in a
    sweep."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    n, d = x.shape
    x_mean, y_mean = x.mean(0), y.mean()
    xc, yc = x - x_mean, y - y_mean
    norms = (xc ** 2).sum(0) / n
    w = np.zeros(d)
    residual = yc.copy()
    for _ in range(max_iter):
        largest_step, largest_w = 0.0, 0.0
        for j in range(d):
            if norms[j] == 0.0:
                continue
            old = w[j]
            rho = xc[:, j] @ residual / n + norms[j] * old
            w[j] = soft_threshold(rho, alpha) / norms[j]
            if w[j] != old:
                residual -= xc[:, j] * (w[j] - old)
            largest_step = max(largest_step, abs(w[j] - old))
            largest_w = max(largest_w, abs(w[j]))
        if largest_step <= tol * max(largest_w, 1.0):
            break
    return w, float(y_mean - x_mean @ w)


def surrogate(masks: np.ndarray, outcomes: np.ndarray, response_tokens: int, alpha: float = 0.01
              ) -> tuple[np.ndarray, float]:
    """ContextCite's linear surrogate: ``(weights [sources], bias)`` such that ``outcome ~ masks @ weights + bias``
    (masks [ablations, sources] of 0/1, 1 = the source kept)."""
    x = np.asarray(masks, np.float64)
    y = np.asarray(outcomes, np.float64) / response_tokens
    mean = x.mean(0)
    scale = x.std(0)
    scale[scale == 0.0] = 1.0
    coef, intercept = lasso((x - mean) / scale, y, alpha)
    weight = coef / scale
    bias = intercept - (mean / scale) @ coef
    return weight * response_tokens, float(bias * response_tokens)
