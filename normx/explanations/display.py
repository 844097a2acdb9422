"""The one colour language every display of scores shares (notebook and file HTML, ``normx show`` reports, the demo,
the terminal): how a row of scores reads, its scale, its colours and the legend that says so.

A method's scores read one of three ways (``Method.reading``, kept in an explanation's ``settings["reading"]``):

- ``"signed"``: the sign says which way a token pushes and 0 means no effect (Gradient×Input summed, Integrated
  Gradients summed, DecompX, and every contrast of two labels): a diverging scale, :data:`TOWARD` for + and
  :data:`AWAY` for −, full colour at the row's largest |score|.
- ``"relative"``: a logit-like score whose zero is arbitrary (NormXLogit and LogAt are the head's logit for the label,
  times a norm): compare tokens, not signs. One colour (:data:`AMOUNT`), from none at the row's lowest score to full
  at its highest.
- ``"magnitude"``: an unsigned amount (norms, gradient norms, l1 / l2-aggregated gradients, mixing shares, random
  baselines, regression distances): one colour (:data:`AMOUNT`) from none at 0 to full at the largest.

Rows are scaled over the units that are not special tokens ([CLS], [SEP], ...: they often dwarf the words).

A contrast of two labels (every view draws it the same way: :func:`default_contrast`, :func:`contrast_title`) is
``A − B`` with the predicted label first, signed, for every label-dependent method (a difference of two labels'
magnitudes is signed too); label-independent scores have none. White-space units show as signs
(:func:`visible_whitespace`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

READINGS = ("signed", "relative", "magnitude")
TOWARD, AWAY, AMOUNT = (239, 68, 60), (128, 90, 213), (230, 150, 0)  # red, purple, amber
READING_NOTES = {  # what a reading means, said once in each key (its colour swatch says what each colour stands for)
    "signed": "signed (0: no effect)",
    "relative": "relative scores (a logit times a norm, whose zero means nothing): compare tokens, not signs; the "
                "contrast of two labels shows toward / away",
    "magnitude": "magnitude (unsigned)",
}
# how a unit that is white space shows in a view: a line break or tab as a sign (never a real break); a token of only
# spaces as middle dots
WHITESPACE_SIGNS = {"\r\n": "⏎", "\n": "⏎", "\r": "⏎", "\t": "⇥"}
SPACE_SIGN = "·"


@dataclass(frozen=True)
class Scale:
    """How to draw a row: its ``reading``, and the scores drawn without colour (``low``) and at full colour
    (``high``; for ``"signed"``, the largest |score|: −high is full :data:`AWAY`)."""

    reading: str = "signed"
    low: float = 0.0
    high: float = 0.0

    def strength(self, value: float) -> float | None:
        """``value`` on the scale: in [−1, 1] for signed rows, [0, 1] otherwise; None if it is not finite."""
        if value is None or not math.isfinite(value):
            return None
        span = self.high - self.low
        if span <= 0:
            return 0.0
        if self.reading == "signed":
            return max(-1.0, min(1.0, value / self.high))
        return max(0.0, min(1.0, (value - self.low) / span))

    def rgba(self, value: float) -> tuple[tuple[int, int, int], float] | None:
        """``(rgb, alpha)`` of a score, or None for no colour (0 strength, NaN)."""
        strength = self.strength(value)
        if not strength:
            return None
        rgb = AMOUNT if self.reading != "signed" else TOWARD if strength > 0 else AWAY
        return rgb, abs(strength)

    def css(self, value: float) -> str:
        """The CSS background of a score."""
        found = self.rgba(value)
        if found is None:
            return "transparent"
        (r, g, b), alpha = found
        return f"rgba({r},{g},{b},{alpha:.3f})"

    def range_text(self) -> str:
        """The scores drawn without colour and at full colour (plain text, numbers only)."""
        if self.reading == "signed":
            return f"full colour at |score| = {self.high:.4g}"
        if self.reading == "relative":
            return f"from {self.low:.4g} (no colour) to {self.high:.4g} (full colour)"
        return f"full colour at {self.high:.4g}"

    def legend(self) -> str:
        """What the colours of a row on this scale mean, said once (plain text): the reading's note and the range."""
        return f"{READING_NOTES[self.reading]}; {self.range_text()}"


def reading_of(explanation) -> str:
    """How an explanation's scores read: ``settings["reading"]`` (what its method said), else inferred (a
    label-independent method or a regression distance: magnitude; a contrast with a foil: signed; else relative)."""
    settings = getattr(explanation, "settings", {}) or {}
    reading = settings.get("reading")
    if reading in READINGS:
        return reading
    if settings.get("label_dependent") is False or getattr(explanation, "regression", False):
        return "magnitude"
    return "signed" if settings.get("foil") is not None else "relative"


def label_dependent(explanation) -> bool:
    """Whether the explanation's scores depend on the label (what its method said, kept in ``settings``; a
    regression head's one output has no other label to compare with)."""
    if getattr(explanation, "regression", False):
        return False
    settings = getattr(explanation, "settings", {}) or {}
    return settings.get("label_dependent") is not False


def contrast_reading(explanation) -> str | None:
    """The reading of a difference of two labels' scores: signed (red toward the first label, purple toward the
    second); None when there is no contrast (label-independent scores, a regression head)."""
    return "signed" if label_dependent(explanation) else None


def default_contrast(explanation, among: Sequence[str] | None = None) -> tuple[str | None, str | None]:
    """The two labels every contrast view shows by default, in the one direction every view uses: the predicted
    label first (label A), then the most probable other one (label B), among ``among`` (default: the labels with a
    probability). ``(None, None)`` when there is no contrast."""
    if not label_dependent(explanation):
        return None, None
    probabilities = getattr(explanation, "probabilities", {}) or {}
    candidates = list(dict.fromkeys(among if among is not None else probabilities))
    if len(candidates) < 2:
        return None, None
    prediction = getattr(explanation, "prediction", None)
    ranked = sorted(candidates, key=lambda label: -probabilities.get(label, -1.0))  # stable: ties in given order
    a = prediction if prediction in candidates else ranked[0]
    return a, next(label for label in ranked if label != a)


def contrast_title(a: str, b: str) -> str:
    """How every contrast view names itself: ``contrast: A − B`` (label A is the predicted one by default)."""
    return f"contrast: {a} − {b}"


def contrast_sides(a: str, b: str) -> tuple[str, str]:
    """What the two colours of a contrast ``A − B`` mean, as every key says it: (red, purple)."""
    return f"toward {a} rather than {b}", f"toward {b} rather than {a}"


def visible_whitespace(text: str) -> str:
    """A unit's text as a view shows it: line breaks and tabs as signs (⏎, ⇥; never a real break), and a unit of
    only spaces as middle dots, so that a white-space token is a visible cell or span."""
    blank = bool(text) and not text.strip()
    for sign, shown in WHITESPACE_SIGNS.items():
        text = text.replace(sign, shown)
    return "".join(SPACE_SIGN if ch.isspace() else ch for ch in text) if blank else text


def _kept(view, rows: Sequence[np.ndarray]) -> np.ndarray:
    keep = [i for i, special in enumerate(view.special) if not special] or list(range(len(view.tokens)))
    values = np.concatenate([np.asarray(row, dtype=np.float64)[keep] for row in rows]) if rows and keep \
        else np.zeros(0)
    return values[np.isfinite(values)]


def scale_of(view, rows: Sequence[np.ndarray]) -> float:
    """The largest finite |score| among the view's non-special units over ``rows`` (0 if none); ``view``: an
    :class:`~normx.explanations.result.Explanation` (or anything with its ``tokens`` and ``special``)."""
    values = _kept(view, rows)
    return float(np.abs(values).max()) if values.size else 0.0


def scale_for(view, rows: Sequence[np.ndarray], reading: str | None = None) -> Scale:
    """The :class:`Scale` of ``rows`` of ``view`` (one scale shared by the rows, so that they compare), read as
    ``reading`` (default: :func:`reading_of` the view)."""
    reading = reading or reading_of(view)
    values = _kept(view, rows)
    if not values.size:
        return Scale(reading)
    if reading == "relative":
        return Scale(reading, float(values.min()), float(values.max()))
    if reading == "magnitude":
        return Scale(reading, 0.0, float(np.abs(values).max()))
    return Scale("signed", 0.0, float(np.abs(values).max()))
