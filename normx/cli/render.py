"""Text renderings of explanations. Every function returns a string; nothing here prints."""

from __future__ import annotations

import numpy as np

from normx.explanations.result import Explanation
from normx.serving.views import scale_of

_RESET = "\033[0m"


def _colour(value: float, scale: float) -> str:
    """ANSI 24-bit background: green for positive (supports the label), red for negative, stronger = larger."""
    strength = 0.0 if scale <= 0 or not np.isfinite(value) else min(abs(value) / scale, 1.0)
    fade = int(255 - 175 * strength)
    rgb = (fade, 255, fade) if value >= 0 else (255, fade, fade)
    return f"\033[48;2;{rgb[0]};{rgb[1]};{rgb[2]}m\033[38;2;0;0;0m"


def summary(explanation: Explanation) -> str:
    """One line: prediction, its probability (or the regression score), method, label and layer shown."""
    pred = explanation.prediction
    if isinstance(pred, float):
        head = f"prediction: {pred:.4f} (regression)"
    else:
        prob = explanation.probabilities.get(pred)
        head = f"prediction: {pred}" + ("" if prob is None else f" (p={prob:.3f})")
    probs = ", ".join(f"{k}={v:.3f}" for k, v in explanation.probabilities.items())
    parts = [head, f"method: {explanation.method}"]
    if probs:
        parts.append(f"probabilities: {probs}")
    return " | ".join(parts)


def render_table(explanation: Explanation, color: bool = True, max_columns: int = 6) -> str:
    """A table with one row per token (or word) and one column per label x layer, coloured by sign.

    Colours are scaled per column by the largest magnitude among non-special units
    (:func:`~normx.explanations.display.scale_of`).
    With more than ``max_columns`` label x layer columns, the first label's last layers are shown and a line says
    what was left out. Tokens show as the text they cover (byte-level BPE markers such as ``Ġ`` removed).
    """
    every = [(i, j) for i in range(len(explanation.labels)) for j in range(len(explanation.layers))]
    columns = every if len(every) <= max_columns else [(0, j) for j in range(len(explanation.layers))][-max_columns:]
    names = [_column_name(explanation, i, j) for i, j in columns]
    values = [explanation.scores[i, j] for i, j in columns]
    scales = [scale_of(explanation, [v]) for v in values]  # the page's rule: largest |score| of non-special units
    unit = explanation.unit
    shown = [_shown(explanation, k) for k in range(len(explanation.tokens))]
    width = max([len(unit)] + [len(t) for t in shown]) + 2
    col_width = max([10] + [len(n) + 2 for n in names])
    lines = [summary(explanation), ""]
    lines.append(f"{unit:<{width}}" + "".join(f"{n:>{col_width}}" for n in names))
    for k, token in enumerate(shown):
        label = token + (" *" if explanation.special[k] else "")
        row = f"{label:<{width}}"
        for v, scale in zip(values, scales):
            cell = f"{v[k]:>{col_width}.4f}"
            row += f"{_colour(float(v[k]), scale)}{cell}{_RESET}" if color and not explanation.special[k] else cell
        lines.append(row)
    lines.append("")
    if len(columns) < len(every):
        labels = sorted({i for i, _ in every} - {i for i, _ in columns})
        hidden_layers = [str(layer) for j, layer in enumerate(explanation.layers) if (0, j) not in columns]
        left = [f"layers {', '.join(hidden_layers)}"] if hidden_layers else []
        left += [f"labels {', '.join(explanation.labels[i] for i in labels)}"] if labels else []
        lines.append(f"showing {len(columns)} of {len(every)} label x layer columns; left out: {'; '.join(left)} "
                     "(--json has them all)")
    lines.append("* special token. " + _reading(explanation))
    lines.extend(f"warning: {w}" for w in explanation.warnings)
    return "\n".join(lines)


def _reading(explanation: Explanation) -> str:
    """How to read the scores, by kind of explanation."""
    if explanation.regression:
        return ("Regression: scores are not signed support for a label (LogAt / NormXLogit: how far each token's "
                "head output is from the prediction).")
    if explanation.settings.get("label_dependent") is False:
        return "These scores do not depend on the label."
    foil = explanation.settings.get("foil")
    if foil is not None:
        return f"Positive scores favour the label over {foil}, negative ones {foil} over the label."
    return "Positive scores support the label, negative ones oppose it."


def _shown(explanation: Explanation, k: int) -> str:
    """A unit as the text it covers; special tokens (and units without a span) as the token itself."""
    start, end = explanation.offsets[k]
    source = {0: explanation.text, 1: explanation.text_pair}.get(explanation.segments[k])
    if explanation.special[k] or source is None or end <= start:
        return explanation.tokens[k]
    return source[start:end].strip() or explanation.tokens[k]


def _column_name(explanation: Explanation, i: int, j: int) -> str:
    label = explanation.labels[i]
    foil = explanation.settings.get("foil")
    if foil is not None:
        label = f"{label} − {foil}"
    return label if len(explanation.layers) == 1 else f"{label}@L{explanation.layers[j]}"
