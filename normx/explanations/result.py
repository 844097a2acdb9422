"""The one result object: an explanation of one text (or text pair)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

import numpy as np

from normx.errors import InvalidInputError, LayerOutOfRangeError, UnknownTargetError
from normx.explanations.words import AGGREGATIONS, aggregate, word_units
from normx.models import HeadKind


@dataclass(frozen=True, eq=False)
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

    @property
    def texts(self) -> list[str]:
        """Each unit as the text it covers (``"Paris"`` for the vocabulary's ``"ĠParis"``, ``"ing"`` for ``"##ing"``;
        white space at its ends removed), special tokens and units without a span as the token itself: what the
        repr and the command line show (``tokens`` keeps the tokenizer's spelling, as the JSON does)."""
        sources = {0: self.text, 1: self.text_pair}
        out = []
        for token, (start, end), segment, special in zip(self.tokens, self.offsets, self.segments, self.special):
            source = sources.get(segment)
            covered = "" if special or source is None or end <= start else source[start:end].strip()
            out.append(covered or token)
        return out

    def __post_init__(self):
        expected = (len(self.labels), len(self.layers), len(self.tokens))
        if tuple(self.scores.shape) != expected:
            raise ValueError(f"scores has shape {tuple(self.scores.shape)}, expected {expected}")
        if not self.groups:
            object.__setattr__(self, "groups", np.arange(len(self.tokens))[:, None].tolist())

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
        return layer_position(self.layers, layer, "explanation")

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

    def __eq__(self, other) -> bool:
        """Equal fields; scores equal as float32 arrays (NaN equal to NaN); settings and diagnostics as plain JSON
        data (what :meth:`to_dict` keeps of them)."""
        if not isinstance(other, Explanation):
            return NotImplemented
        return fields_equal(self, other)

    __hash__ = None

    def __repr__(self) -> str:
        """A readable summary: method, prediction, and the tokens with their scores (the first label, the last
        computed layer), not the arrays."""
        label = self.labels[0] if self.labels else None
        head = (f"{self.method}, {self.settings.get('model_class') or self.family}, layer {self.layers[-1]}, "
                f"scores for {label!r}; prediction {self.prediction!r}")
        p = self.probabilities.get(str(self.prediction))
        head += "" if p is None else f" (p={p:.3f})"
        more = f"; {len(self.labels)} labels x {len(self.layers)} layers in .scores" \
            if len(self.labels) > 1 or len(self.layers) > 1 else ""
        return f"Explanation({head}{more}:\n  {token_line(self.texts, self.token_scores())})"

    @classmethod
    def from_dict(cls, data: dict) -> Explanation:
        """The :class:`Explanation` that :meth:`to_dict` wrote (equal to it: ``Explanation.from_dict(e.to_dict())
        == e``); every label's and layer's scores come from ``scores_by_label``."""
        labels, layers = list(data["labels"]), [int(layer) for layer in data["layers"]]
        scores = np.array([[[np.nan if v is None else v for v in data["scores_by_label"][label][str(layer)]]
                            for layer in layers] for label in labels], dtype=np.float32)
        scores = scores.reshape(len(labels), len(layers), len(data["tokens"]))
        prediction = data["prediction"]
        return cls(
            text=data["text"], text_pair=data.get("text_pair"), tokens=list(data["tokens"]),
            offsets=[tuple(o) for o in data["offsets"]], segments=list(data["segments"]),
            special=[bool(s) for s in data["special"]], scores=scores, labels=labels, layers=layers,
            prediction=float(prediction) if data.get("regression") else prediction,
            probabilities={k: float(v) for k, v in data.get("probabilities", {}).items()}, method=data["method"],
            settings=dict(data.get("settings", {})), warnings=list(data.get("warnings", [])),
            unit=data.get("unit", "token"), groups=[list(g) for g in data.get("groups", [])],
            diagnostics=dict(data.get("diagnostics", {})), kind=data.get("kind", "sequence_classification"),
            regression=bool(data.get("regression", False)), family=data.get("family", ""), pooled=data.get("pooled"))

    # ---- display -------------------------------------------------------------------------------------------------
    def to_html(self, layer: int | None = None, words: bool = True) -> str:
        """Self-contained HTML (inline styles, no script): a highlighted view per label at ``layer`` (default: the
        last computed), the contrast of the first two labels, the word view and every layer (collapsed), a legend
        with the scale; see :mod:`normx.explanations.html`."""
        from normx.explanations.html import explanation_html

        return explanation_html(self, layer, words)

    def _repr_html_(self) -> str:  # Jupyter
        return self.to_html()

    # ---- export ----------------------------------------------------------------------------------------------------
    def to_captum(self, layer: int | None = None):
        """Captum's ``captum.attr.LLMAttributionResult`` (for its ``plot_token_attr`` / ``plot_seq_attr``): the units
        as input features, the explained labels as outputs (one ``token_attr`` row each), ``seq_attr`` the first
        label's scores, at ``layer`` (default: the last computed) (:mod:`normx.explanations.captum_result`)."""
        from normx.explanations.captum_result import explanation_result

        return explanation_result(self, layer)

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


def token_line(tokens: list[str], scores, limit: int = 24) -> str:
    """``token:+1.23  token:-0.5 ...`` for a repr: at most ``limit`` tokens (the first and last halves)."""
    cells = [f"{token}:{'nan' if value != value else f'{value:+.3g}'}" for token, value in zip(tokens, scores)]
    if len(cells) > limit:
        cells = [*cells[:limit // 2], f"... ({len(cells) - limit} more)", *cells[-(limit // 2):]]
    return "  ".join(cells)


def layer_position(layers: list[int], layer: int | None, what: str) -> int:
    """Where ``layer`` (None: the last computed) is in a result's ``layers``; :class:`LayerOutOfRangeError` naming
    the layers there are."""
    if layer is None:
        return len(layers) - 1
    if layer in layers:
        return layers.index(layer)
    raise LayerOutOfRangeError(f"layer {layer} was not computed; this {what} has layers {layers}")


def fields_equal(a, b) -> bool:
    """Whether two result dataclasses of one type hold the same data: arrays equal as float32 (NaN equal to NaN),
    ``settings`` and ``diagnostics`` as the plain JSON data their ``to_dict`` keeps, ``offsets`` as tuples, the rest
    with ``==``."""
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
            if x.shape != y.shape or not np.array_equal(x, y, equal_nan=True):
                return False
        elif f.name in ("settings", "diagnostics"):
            if _plain(x) != _plain(y):
                return False
        elif f.name == "offsets":
            if [tuple(o) for o in x] != [tuple(o) for o in y]:
                return False
        elif x != y:
            return False
    return True


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


class Explanations(list):
    """What :func:`normx.explain` returns for a list of texts: a plain list of :class:`Explanation`, shown in
    notebooks as their HTML views one after the other."""

    def to_html(self) -> str:
        from normx.explanations.html import explanations_html

        return explanations_html(self)

    def _repr_html_(self) -> str:
        return self.to_html()
