"""Text renderings of explanations. Every function returns a string; nothing here prints."""

from __future__ import annotations

from normx.explanations.display import Scale, reading_of, scale_for
from normx.explanations.result import Explanation

_RESET = "\033[0m"


def _colour(value: float, scale: Scale) -> str:
    """ANSI 24-bit background in the shared colour language (:mod:`normx.explanations.display`): the score's colour
    blended into white by its strength on the column's scale."""
    found = scale.rgba(value)
    rgb, alpha = found if found is not None else ((255, 255, 255), 0.0)
    r, g, b = (round(255 + (c - 255) * alpha * 0.85) for c in rgb)
    return f"\033[48;2;{r};{g};{b}m\033[38;2;0;0;0m"


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
    """A table with one row per token (or word) and one column per label x layer, coloured in the shared colour
    language (:mod:`normx.explanations.display`: signed scores red / purple, relative and unsigned ones amber),
    each column on its own scale over the units that are not special tokens.
    With more than ``max_columns`` label x layer columns, the first label's last layers are shown and a line says
    what was left out. Tokens show as the text they cover (byte-level BPE markers such as ``Ġ`` removed).
    """
    every = [(i, j) for i in range(len(explanation.labels)) for j in range(len(explanation.layers))]
    columns = every if len(every) <= max_columns else [(0, j) for j in range(len(explanation.layers))][-max_columns:]
    names = [_column_name(explanation, i, j) for i, j in columns]
    values = [explanation.scores[i, j] for i, j in columns]
    reading = reading_of(explanation)
    scales = [scale_for(explanation, [v], reading) for v in values]  # the shared rule (special tokens excluded)
    unit = explanation.unit
    shown = explanation.texts
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
    lines.append("* special token. " + _reading(explanation, color))
    lines.extend(f"warning: {w}" for w in explanation.warnings)
    return "\n".join(lines)


def _reading(explanation: Explanation, color: bool = True) -> str:
    """How to read the scores, by how the method's scores read; their colours only where the table has them (piped
    or ``--no-color`` output is read by the numbers and their signs)."""
    reading = reading_of(explanation)
    if explanation.regression:
        return ("Regression: scores are not signed support for a label (LogAt / NormXLogit: how far each token's "
                "head output is from the prediction); " + ("darker = larger." if color else "larger = further."))
    if reading == "magnitude":
        dependent = "" if explanation.settings.get("label_dependent", True) else " and do not depend on the label"
        return f"Scores are unsigned magnitudes{dependent}: " + ("darker = larger." if color else "larger = more.")
    foil = explanation.settings.get("foil")
    if reading == "signed":
        if foil is not None:
            return (f"Red: favours the label over {foil}; purple: {foil} over the label." if color else
                    f"Positive: favours the label over {foil}; negative: {foil} over the label.")
        return ("Red: pushes toward the label; purple: away from it; stronger = larger |score|." if color else
                "Positive: pushes toward the label; negative: away from it; larger |score| = stronger.")
    return ("Scores are relative (a logit times a norm: their zero means nothing): compare tokens, not signs"
            + ("; darker = higher." if color else "; higher = more.")
            + " For toward / away, explain with --foil LABEL (a contrast of two labels is signed).")


def _column_name(explanation: Explanation, i: int, j: int) -> str:
    label = explanation.labels[i]
    foil = explanation.settings.get("foil")
    if foil is not None:
        label = f"{label} − {foil}"
    return label if len(explanation.layers) == 1 else f"{label}@L{explanation.layers[j]}"
