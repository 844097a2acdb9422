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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

READINGS = ("signed", "relative", "magnitude")
TOWARD, AWAY, AMOUNT = (239, 68, 60), (128, 90, 213), (230, 150, 0)  # red, purple, amber


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

    def legend(self) -> str:
        """What the colours of a row on this scale mean (plain text)."""
        if self.reading == "signed":
            return (f"red: pushes toward the label, purple: away from it; full colour at |score| = {self.high:.4g}")
        if self.reading == "relative":
            return (f"darker = higher score, from {self.low:.4g} (no colour) to {self.high:.4g}; the score is a logit "
                    "(times a norm): compare tokens, not signs — the contrast of two labels shows toward / away")
        return f"magnitude (unsigned): darker = larger, full colour at {self.high:.4g}"


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


def contrast_reading(reading: str) -> str:
    """The reading of a difference of two labels' scores: signed, unless the scores do not depend on the label."""
    return "magnitude" if reading == "magnitude" else "signed"


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
