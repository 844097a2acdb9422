"""The result of explaining what a causal language model wrote: every generated token's attribution to the tokens
before it (:func:`normx.explanations.generation.explain_generation`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from normx.errors import InvalidInputError
from normx.explanations.result import Explanation, _floats, _plain, fields_equal, layer_position
from normx.models import HeadKind


@dataclass(frozen=True, eq=False)
class Generation:
    """A prompt, what the model wrote after it, and why, step by step.

    ``tokens`` are the prompt's tokens then the output's as the text each stands for (``" Paris"``, ``"\\n"``),
    ``vocabulary_tokens`` the same tokens as the tokenizer spells them (``"ĠParis"``, ``"Ċ"``) and ``token_ids``
    their ids (as the model read them: the prompt after the chat template, if one was applied); every view (``top``,
    the repr, the CLI, the JSON) shows ``tokens``. Step ``t`` is the generated token at index ``p = prompt_length + t``;
    ``scores[j, t, :p]`` are its scores at layer ``layers[j]`` for the positions ``0 .. p-1`` before it, and
    ``scores[j, t, p:]`` are NaN. ``probabilities[t]`` is the model's probability of that token given the tokens
    before it; ``predictions[t]`` the vocabulary id it ranked first there (the token itself under greedy decoding),
    ``alternatives[t]`` the probabilities of its top tokens there, as ``normx.explain`` reports them.
    """

    prompt: str
    text: str  # the whole sequence, decoded
    token_ids: list[int]
    vocabulary_tokens: list[str]  # the tokenizer's spelling ("ĠParis"); ``tokens`` is the text (" Paris")
    offsets: list[tuple[int, int]]  # character spans of the tokens in ``text``
    special: list[bool]
    prompt_length: int
    scores: np.ndarray  # [layers, steps, len(tokens)] float32, NaN at and after each step's own position
    probabilities: np.ndarray  # [steps]
    predictions: list[int]
    layers: list[int]
    method: str
    settings: dict = field(default_factory=dict)
    family: str = ""
    warnings: list[str] = field(default_factory=list)
    # per step: the probabilities of the model's top tokens there and of the generated one (token -> probability)
    alternatives: list[dict[str, float]] = field(default_factory=list)
    # what the method reports per step (``Method.diagnostics``, e.g. DecompX's decomposition_error): name -> [steps]
    diagnostics: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self):
        expected = (len(self.layers), self.steps, len(self.vocabulary_tokens))
        if tuple(self.scores.shape) != expected:
            raise ValueError(f"scores has shape {tuple(self.scores.shape)}, expected {expected}")
        if not 0 <= self.prompt_length <= len(self.vocabulary_tokens) or \
                len(self.token_ids) != len(self.vocabulary_tokens) or len(self.offsets) != len(self.token_ids):
            raise ValueError("prompt_length and token_ids must fit the tokens")

    def __eq__(self, other) -> bool:
        """Equal fields (:func:`~normx.explanations.result.fields_equal`): arrays as float32, NaN equal to NaN;
        settings and diagnostics as plain JSON data."""
        if not isinstance(other, Generation):
            return NotImplemented
        return fields_equal(self, other)

    __hash__ = None

    def __repr__(self) -> str:
        """A readable summary: the continuation, and per generated token its probability and the earlier tokens it
        drew on most (at the last computed layer), not the arrays."""
        lines = [f"Generation({self.method}, {self.steps} generated tokens after a {self.prompt_length}-token prompt, "
                 f"layer {self.layers[-1]}: {self.continuation!r}"]
        shown = min(self.steps, 8)
        texts = self.tokens
        for t in range(shown):
            top = ", ".join(f"{texts[i]!r} {score:+.3g}" for i, _, score in self.top(t))
            lines.append(f"  step {t} {texts[self.prompt_length + t]!r} p={float(self.probabilities[t]):.3f}"
                         f" <- {top}")
        if self.steps > shown:
            lines.append(f"  ... {self.steps - shown} more steps")
        return "\n".join(lines) + ")"

    # ---- views -----------------------------------------------------------------------------------------------------
    @property
    def steps(self) -> int:
        """The number of generated tokens."""
        return len(self.vocabulary_tokens) - self.prompt_length

    @property
    def tokens(self) -> list[str]:
        """Each token as the text it stands for (``" Paris"``, ``"\\n"``: the tokenizer's own decoding, not its
        vocabulary spelling ``"ĠParis"``, which is :attr:`vocabulary_tokens`); special tokens as their token
        (``"<s>"``)."""
        return [token if special or end <= start else self.text[start:end]
                for token, (start, end), special in zip(self.vocabulary_tokens, self.offsets, self.special)]

    @property
    def texts(self) -> list[str]:
        """The same as :attr:`tokens` (its earlier name)."""
        return self.tokens

    @property
    def generated(self) -> list[int]:
        """The indices of the generated tokens in ``tokens``."""
        return list(range(self.prompt_length, len(self.token_ids)))

    @property
    def continuation(self) -> str:
        """The generated text."""
        return self.text[self.offsets[self.prompt_length][0]:] if self.steps else ""

    @property
    def score(self) -> np.ndarray:
        """[steps, len(tokens)] the scores at the last requested layer."""
        return self.scores[-1]

    def layer_index(self, layer: int | None = None) -> int:
        return layer_position(self.layers, layer, "generation")

    def step_index(self, step: int) -> int:
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not -self.steps <= step < self.steps:
            raise InvalidInputError(f"step {step!r} is out of range: {self.steps} tokens were generated "
                                    f"(steps 0..{self.steps - 1}, or negative from the end)")
        return int(step) % self.steps

    def rows(self, layer: int | None = None) -> list[np.ndarray]:
        """One row per generated token: the row of the token at index ``p`` has ``p`` scores (positions 0..p-1)."""
        j = self.layer_index(layer)
        return [self.scores[j, t, :p] for t, p in enumerate(self.generated)]

    def top(self, step: int, k: int = 3, layer: int | None = None) -> list[tuple[int, str, float]]:
        """The ``k`` tokens generated token ``step`` drew on most: ``(index, token, score)``, highest score first;
        the token as the text it stands for (:attr:`tokens`)."""
        t = self.step_index(step)
        row = self.rows(layer)[t]
        order = np.argsort(-row, kind="stable")[:k]
        tokens = self.tokens
        return [(int(i), tokens[i], float(row[i])) for i in order]

    def step(self, step: int) -> Explanation:
        """Generated token ``step`` as an :class:`Explanation` of the tokens before it, with that token as the
        target: what ``normx.explain`` gives on that prefix with ``target=`` the token (every layer computed), so
        its ``tokens`` and label are in the vocabulary spelling, as an :class:`Explanation`'s are; its repr shows the
        text (:attr:`Explanation.texts`)."""
        t = self.step_index(step)
        p = self.prompt_length + t
        label = self.vocabulary_tokens[p]
        return Explanation(
            text=self.text[:self.offsets[p - 1][1]] if p else "", text_pair=None, tokens=self.vocabulary_tokens[:p],
            offsets=self.offsets[:p], segments=[0] * p, special=self.special[:p],
            scores=np.ascontiguousarray(self.scores[:, t, :p][None]), labels=[label], layers=list(self.layers),
            prediction=self._prediction(t),
            probabilities=dict(self.alternatives[t]) if self.alternatives else {label: float(self.probabilities[t])},
            method=self.method, settings={**self.settings, "target": self.token_ids[p]}, warnings=list(self.warnings),
            kind=HeadKind.CAUSAL_LM.value, family=self.family, pooled=p - 1,
            diagnostics={name: [values[t]] for name, values in self.diagnostics.items()})

    def _prediction(self, t: int) -> str:
        """The token the model ranked first at step ``t``: the first of its alternatives (listed top first), else
        the token of that id in this sequence."""
        if self.alternatives and self.alternatives[t]:
            return next(iter(self.alternatives[t]))
        token_id = self.predictions[t]
        return next((token for tid, token in zip(self.token_ids, self.vocabulary_tokens) if tid == token_id),
                    f"<id {token_id}>")

    # ---- display -------------------------------------------------------------------------------------------------
    def to_html(self) -> str:
        """Self-contained HTML: the prompt and continuation, and a matrix of generated tokens x the tokens before
        them (:func:`normx.explanations.html.generation_html`)."""
        from normx.explanations.html import generation_html

        return generation_html(self)

    def _repr_html_(self) -> str:  # Jupyter
        return self.to_html()

    # ---- export ----------------------------------------------------------------------------------------------------
    def to_captum(self, layer: int | None = None, skip_tokens=None):
        """Captum's ``captum.attr.LLMAttributionResult`` (for its ``plot_token_attr`` / ``plot_seq_attr``): the
        prompt's tokens as input features, the generated tokens as outputs, ``token_attr`` each generated token's
        scores over the prompt, ``seq_attr`` their sum, at ``layer`` (default: the last computed); ``skip_tokens``
        leaves prompt tokens out, as Captum's ``TextTokenInput`` (:mod:`normx.explanations.captum_result`)."""
        from normx.explanations.captum_result import generation_result

        return generation_result(self, layer, skip_tokens)

    def to_dict(self) -> dict:
        """Plain JSON data: ``tokens`` as the text each stands for (:attr:`tokens`), ``vocabulary_tokens`` as the
        tokenizer spells them and ``token_ids``; ``scores`` has one row per generated token (the row of the token at
        index ``p`` has ``p`` entries, for positions 0..p-1) at the last requested layer; ``scores_by_layer`` every
        layer's."""
        by_layer = {str(layer): [_floats(row) for row in self.rows(layer)] for layer in self.layers}
        return {
            "prompt": self.prompt, "text": self.text, "token_ids": list(self.token_ids), "tokens": self.tokens,
            "vocabulary_tokens": list(self.vocabulary_tokens),
            "offsets": [list(o) for o in self.offsets], "special": list(self.special),
            "prompt_length": self.prompt_length, "generated": self.generated, "continuation": self.continuation,
            "scores": by_layer[str(self.layers[-1])], "probabilities": _floats(self.probabilities),
            "predictions": list(self.predictions), "layers": list(self.layers), "scores_by_layer": by_layer,
            "alternatives": [dict(a) for a in self.alternatives],
            "method": self.method, "family": self.family, "settings": _plain(self.settings),
            "warnings": list(self.warnings),
            "diagnostics": {name: _floats(values) for name, values in self.diagnostics.items()},
        }

    @classmethod
    def from_dict(cls, data: dict) -> Generation:
        """The :class:`Generation` that :meth:`to_dict` wrote (``scores_by_layer``, or ``scores`` alone)."""
        tokens, length = list(data.get("vocabulary_tokens", data["tokens"])), int(data["prompt_length"])  # spelled
        layers = [int(layer) for layer in data.get("layers", [0])]
        by_layer = data.get("scores_by_layer") or {str(layers[-1]): data["scores"]}
        scores = np.full((len(layers), len(tokens) - length, len(tokens)), np.nan, dtype=np.float32)
        for j, layer in enumerate(layers):
            for t, row in enumerate(by_layer[str(layer)]):
                scores[j, t, :len(row)] = [np.nan if v is None else v for v in row]
        return cls(
            prompt=data["prompt"], text=data["text"], token_ids=[int(i) for i in data["token_ids"]],
            vocabulary_tokens=tokens,
            offsets=[tuple(o) for o in data["offsets"]], special=[bool(s) for s in data["special"]],
            prompt_length=length, scores=scores,
            probabilities=np.array([np.nan if v is None else v for v in data["probabilities"]], dtype=np.float32),
            predictions=[int(i) for i in data["predictions"]], layers=layers, method=data["method"],
            settings=dict(data.get("settings", {})), family=data.get("family", ""),
            warnings=list(data.get("warnings", [])), alternatives=[dict(a) for a in data.get("alternatives", [])],
            diagnostics={name: [np.nan if v is None else float(v) for v in values]
                         for name, values in data.get("diagnostics", {}).items()})


class Generations(list):
    """What :func:`normx.explain_generation` returns for a list of prompts: a plain list of :class:`Generation`,
    shown in notebooks as their HTML views one after the other."""

    def to_html(self) -> str:
        from normx.explanations.html import generation_html

        return "".join(generation_html(g) for g in self)

    def _repr_html_(self) -> str:
        return self.to_html()
