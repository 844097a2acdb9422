"""The faithfulness metrics: per-K curve values (confidence drop, accuracy, Pearson) and their AOPC."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from normx.errors import InvalidInputError
from normx.evaluation.faithfulness.perturbation import K_VALUES

CLASSIFICATION_METRICS = ("confidence_drop", "accuracy")
REGRESSION_METRICS = ("pearson",)


PARTIAL = (0.1, 0.4)  # the partial AOPC: the first perturbation steps, where a ranking's top matters most


def aopc(curve: Sequence[float], ks: Sequence[float] = K_VALUES, within: tuple[float, float] | None = None) -> float:
    """The area over the perturbation curve as reported: the mean of ``curve`` over 0 < K < 1 (K = 10 ... 90 %);
    ``within=(low, high)``: over low <= K <= high only (e.g. :data:`PARTIAL`, K = 10 ... 40 %)."""
    low, high = within or (1e-9, 1 - 1e-9)
    values = [v for v, k in zip(curve, ks) if 0 < k < 1 and low - 1e-9 <= k <= high + 1e-9]
    if len(values) == 0 or len(curve) != len(ks):
        raise InvalidInputError(f"need one value per K ({len(ks)}) and at least one K strictly between 0 and 1")
    return float(np.mean(values))


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's r; NaN when either side is constant (e.g. every input perturbed to the same sequence)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    dx, dy = x - x.mean(), y - y.mean()
    denominator = math.sqrt(float((dx * dx).sum()) * float((dy * dy).sum()))
    return float((dx * dy).sum() / denominator) if denominator > 0 else float("nan")


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def classification_values(original: np.ndarray, perturbed: np.ndarray, gold: np.ndarray | None
                          ) -> dict[str, np.ndarray]:
    """Per-example values [N, K] from the logits of the original inputs [N, C] and the perturbed ones [N, K, C]:
    the confidence drop and (with gold labels) whether the perturbed prediction is right (0 / 1)."""
    p0 = softmax(original)
    predicted = p0.argmax(-1)
    rows = np.arange(len(predicted))
    probs = softmax(perturbed)
    values = {"confidence_drop": p0[rows, predicted][:, None] - probs[rows, :, predicted]}
    if gold is not None:
        values["accuracy"] = (probs.argmax(-1) == gold[:, None]).astype(np.float64)
    return values


def classification_curves(original: np.ndarray, perturbed: np.ndarray, gold: np.ndarray | None
                          ) -> dict[str, np.ndarray]:
    """Per-K curves (the per-example values averaged over examples)."""
    return {metric: values.mean(0) for metric, values in classification_values(original, perturbed, gold).items()}


def example_aopcs(values: np.ndarray, ks: Sequence[float] = K_VALUES) -> np.ndarray:
    """Per-example AOPCs [N]: the rows of ``values`` [N, K] averaged over 0 < K < 1."""
    middle = [j for j, k in enumerate(ks) if 0 < k < 1]
    return np.asarray(values, dtype=np.float64)[:, middle].mean(1)


def mean_and_error(per_example: np.ndarray) -> tuple[float, float]:
    """The mean of per-example values and its standard error (standard deviation / sqrt(N); NaN for one value)."""
    per_example = np.asarray(per_example, dtype=np.float64)
    if len(per_example) < 2:
        return float(per_example.mean()) if len(per_example) else float("nan"), float("nan")
    return float(per_example.mean()), float(per_example.std(ddof=1) / math.sqrt(len(per_example)))


def standard_error(values: np.ndarray, ks: Sequence[float] = K_VALUES) -> float:
    """The standard error of the AOPC over examples: per-example AOPCs (rows of ``values`` [N, K] averaged over
    0 < K < 1), their standard deviation / sqrt(N). NaN for a single example."""
    return mean_and_error(example_aopcs(values, ks))[1]


def regression_curves(perturbed: np.ndarray, gold: np.ndarray) -> dict[str, np.ndarray]:
    predictions = perturbed[..., 0]  # [N, K]
    return {"pearson": np.array([pearson(predictions[:, j], gold) for j in range(predictions.shape[1])])}
