"""The one result object: an explanation of one text (or text pair)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from normx.errors import InvalidInputError, LayerOutOfRangeError, UnknownTargetError
from normx.explanations.words import AGGREGATIONS, aggregate, word_units
from normx.models import HeadKind


@dataclass(frozen=True)
class Explanation:
    """Attribution scores for one input.

    ``scores`` has shape [len(labels), len(layers), len(tokens)]: one row per explained label (the predicted one
    by default), per requested layer, per unit (subword token, or word after :meth:`words`). Scores are signed.
    ``groups[j]`` lists the subword-token indices that unit ``j`` covers (``[j]`` at token level).
    ``diagnostics`` holds what a method reports besides scores, each a list with one value per label (e.g.
    ``integrated_gradients``' ``convergence_delta``: sum of attributions minus (f(x) - f(baseline))).
    ``kind`` is the head (``"sequence_classification"``, ``"masked_lm"``, ``"causal_lm"``), ``regression`` whether
    it predicts a score, ``family`` the model family (its adapter's), ``pooled`` the index of the unit whose head
    output is the prediction ([CLS], the last token, the mask token; None once that unit is dropped).
    """

    text: str
    text_pair: str | None
    tokens: list[str]
    offsets: list[tuple[int, int]]
    segments: list[int]
    special: list[bool]
    scores: np.ndarray
    labels: list[str]
    layers: list[int]
    prediction: str | float
    probabilities: dict[str, float]
    method: str
    settings: dict
    warnings: list[str] = field(default_factory=list)
    unit: str = "token"
    groups: list[list[int]] = field(default_factory=list)
    diagnostics: dict = field(default_factory=dict)
    kind: str = "sequence_classification"
    regression: bool = False
    family: str = ""
    pooled: int | None = None

    @property
    def vocabulary(self) -> bool:
        """The labels are vocabulary tokens (masked- or causal-LM heads)."""
        return HeadKind(self.kind).vocabulary

    def __post_init__(self):
        expected = (len(self.labels), len(self.layers), len(self.tokens))
        if tuple(self.scores.shape) != expected:
            raise ValueError(f"scores has shape {tuple(self.scores.shape)}, expected {expected}")
        if not self.groups:
            object.__setattr__(self, "groups", [[i] for i in range(len(self.tokens))])

    # ---- selection -------------------------------------------------------------------------------------------------
    def label_index(self, label: str | int | None = None) -> int:
        if label is None:
            return 0
        if isinstance(label, int) and not isinstance(label, bool):
            if 0 <= label < len(self.labels):
                return label
            raise UnknownTargetError(f"label index {label} is out of range: this explanation has {self.labels}")
        if label in self.labels:
            return self.labels.index(label)
        raise UnknownTargetError(f"label {label!r} is not in this explanation; it has {self.labels}")

    def layer_index(self, layer: int | None = None) -> int:
        if layer is None:
            return len(self.layers) - 1
        if layer in self.layers:
            return self.layers.index(layer)
        raise LayerOutOfRangeError(f"layer {layer} was not computed; this explanation has layers {self.layers}")

    def token_scores(self, label: str | int | None = None, layer: int | None = None) -> np.ndarray:
        """Scores of one label (default: the first, i.e. the target) at one layer (default: the last computed)."""
        return self.scores[self.label_index(label), self.layer_index(layer)]

    @property
    def score(self) -> np.ndarray:
        return self.token_scores()

    # ---- views -----------------------------------------------------------------------------------------------------
    def words(self, how: str = "sum") -> Explanation:
        """A new explanation whose units are words (nltk words aligned by character offsets; special tokens stay
        units of their own), scores aggregated over each word's tokens with ``how`` (sum, mean, max, absmax); see
        :mod:`normx.explanations.words`."""
        if how not in AGGREGATIONS:
            raise InvalidInputError(f"aggregation how={how!r} is not allowed; use one of {tuple(AGGREGATIONS)}")
        if self.unit != "token":
            raise InvalidInputError(f"this explanation is already at {self.unit} level")
        units = word_units(self.text, self.text_pair, self.offsets, self.segments, self.special)
        groups = [members for members, _ in units]
        return replace(self, tokens=[u["token"] or self.tokens[m[0]] for m, u in units],
                       offsets=[u["offsets"] for _, u in units], segments=[u["segment"] for _, u in units],
                       special=[u["special"] for _, u in units], scores=aggregate(self.scores, groups, how),
                       groups=groups, unit="word",
                       pooled=next((j for j, members in enumerate(groups) if self.pooled in members), None),
                       settings=dict(self.settings, word_aggregation=how))

    def without_special(self) -> Explanation:
        """A new explanation without special tokens ([CLS], [SEP], <s>, ...)."""
        keep = [i for i, s in enumerate(self.special) if not s]
        return self._select(keep)

    def _select(self, keep: list[int]) -> Explanation:
        return replace(
            self, tokens=[self.tokens[i] for i in keep], offsets=[self.offsets[i] for i in keep],
            segments=[self.segments[i] for i in keep], special=[self.special[i] for i in keep],
            scores=self.scores[:, :, keep], groups=[self.groups[i] for i in keep],
            pooled=keep.index(self.pooled) if self.pooled in keep else None,
        )

    # ---- export ----------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain JSON-serialisable data. ``scores`` is the main view (first label, last layer)."""
        return {
            "text": self.text,
            "text_pair": self.text_pair,
            "unit": self.unit,
            "tokens": list(self.tokens),
            "offsets": [list(o) for o in self.offsets],
            "segments": list(self.segments),
            "special": list(self.special),
            "scores": _floats(self.score),
            "label": self.labels[0],
            "layer": self.layers[-1],
            "scores_by_label": {
                label: {str(layer): _floats(self.scores[i, j]) for j, layer in enumerate(self.layers)}
                for i, label in enumerate(self.labels)
            },
            "labels": list(self.labels),
            "layers": list(self.layers),
            "prediction": self.prediction if isinstance(self.prediction, str) else float(self.prediction),
            "probabilities": {k: float(v) for k, v in self.probabilities.items()},
            "method": self.method,
            "kind": self.kind,
            "regression": self.regression,
            "family": self.family,
            "pooled": self.pooled,
            "settings": _plain(self.settings),
            "warnings": list(self.warnings),
            "groups": [list(g) for g in self.groups],
            "diagnostics": _plain(self.diagnostics),
        }


def _floats(values) -> list[float | None]:
    return [None if not math.isfinite(v) else float(v) for v in np.asarray(values, dtype=np.float64).tolist()]


def _plain(value):
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN / inf
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, np.generic):
        return value.item()
    return str(value)

