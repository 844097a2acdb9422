"""The result of context attribution (:func:`normx.explain_context`): the sources of a context, the response, and a
score per source for the whole response or any part of it, aggregated from the token-level rows of a
:class:`~normx.explanations.generation_result.Generation` by :func:`source_scores` (the one place that says how)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from normx.errors import InvalidInputError
from normx.explanations.generation_result import Generation
from normx.methods.ablation.sources import split_text, token_sources


@dataclass(frozen=True)
class Source:
    """One part of the context: its text, its characters ``[start, end)`` in the context and its tokens
    ``[token_start, token_end)`` in the explained sequence (the prompt's ids)."""

    text: str
    start: int
    end: int
    token_start: int
    token_end: int


def source_scores(rows: np.ndarray, sources: list[Source], reading: str) -> np.ndarray:
    """Each source's score from token-level rows [steps, tokens] (NaN where a step does not see a token): the sum
    over the steps and the source's tokens of the scores, or of their magnitudes for a ``"magnitude"`` reading.
    Signed scores (ablations, Gradient×Input summed, AttnLRP) add up with their signs; relative scores (NormXLogit,
    LogAt: logit-like, zero arbitrary) are summed too, which compares sources of similar length only."""
    values = np.abs(rows) if reading == "magnitude" else rows
    return np.array([np.nansum(values[:, s.token_start:s.token_end], dtype=np.float64) for s in sources])


@dataclass(frozen=True, eq=False)
class ContextAttribution:
    """Which part of a context a response came from.

    ``sources`` are the context's parts (sentences, paragraphs, lines, words, or the texts given), ``generation`` the
    token-level explanation of the response (every step's row over the prompt), ``prompt`` the text given to the
    model (the context in its template, before any chat template). :attr:`scores` is each source's score for the
    whole response, :meth:`attributions` for a part of it, :meth:`top` the sources that mattered most.
    """

    context: str
    query: str | None
    prompt: str
    sources: list[Source]
    generation: Generation
    settings: dict = field(default_factory=dict)

    def __eq__(self, other) -> bool:
        """Equal texts, sources, settings and generations (:class:`Generation`'s equality: arrays as float32, NaN
        equal to NaN), so that ``ContextAttribution.from_json(r.to_json()) == r``."""
        if not isinstance(other, ContextAttribution):
            return NotImplemented
        return (self.context, self.query, self.prompt, list(self.sources)) == \
            (other.context, other.query, other.prompt, list(other.sources)) and \
            json.dumps(self.settings, sort_keys=True, default=str) == \
            json.dumps(other.settings, sort_keys=True, default=str) and self.generation == other.generation

    __hash__ = None

    @property
    def method(self) -> str:
        return self.generation.method

    @property
    def reading(self) -> str:
        return self.generation.settings.get("reading", "signed")

    @property
    def response(self) -> str:
        """The response's text, without special tokens (an end-of-turn token the model wrote is a step of the
        response, with its row, but no text of it)."""
        g = self.generation
        return "".join(g.text[start:end] for (start, end), special in
                       zip(g.offsets[g.prompt_length:], g.special[g.prompt_length:]) if not special)

    @property
    def response_ids(self) -> list[int]:
        return self.generation.token_ids[self.generation.prompt_length:]

    @property
    def response_tokens(self) -> list[str]:
        return self.generation.tokens[self.generation.prompt_length:]

    @property
    def scores(self) -> np.ndarray:
        """[sources] each source's score for the whole response."""
        return self.attributions()

    def attributions(self, start: int | None = None, end: int | None = None) -> np.ndarray:
        """[sources] each source's score for the response tokens ``start .. end - 1`` (indices into the response's
        tokens, as Python slices; default the whole response): :func:`source_scores` over those steps' rows."""
        steps = self.generation.steps
        first, last, stride = slice(start, end).indices(steps)
        if stride != 1 or first >= last:
            raise InvalidInputError(f"attributions({start!r}, {end!r}) selects no response token; the response has "
                                    f"{steps} tokens")
        return source_scores(self.generation.scores[-1][first:last], self.sources, self.reading)

    def response_parts(self, how: str = "sentences") -> list[tuple[str, int, int]]:
        """The response's sentences (or lines, words, paragraphs) as ``(text, start, end)``, start and end token
        indices into the response for :meth:`attributions`."""
        g = self.generation
        text, base = g.continuation, g.offsets[g.prompt_length][0] if g.steps else 0
        spans = [(a + base, b + base) for a, b in split_text(text, how)]
        members = token_sources(spans, g.offsets, [False] * len(g.offsets))
        out = []
        for (a, b), tokens in zip(spans, members):
            tokens = [i - g.prompt_length for i in tokens if i >= g.prompt_length]
            if tokens:
                out.append((g.text[a:b], tokens[0], tokens[-1] + 1))
        return out

    def top(self, k: int = 3, start: int | None = None, end: int | None = None) -> list[tuple[int, str, float]]:
        """The ``k`` sources with the highest scores (for the response tokens ``start .. end - 1``):
        ``(index, text, score)``, highest first."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise InvalidInputError(f"top(k): k must be a whole number >= 1 (the sources to show), got {k!r}")
        scores = self.attributions(start, end)
        order = np.argsort(-scores, kind="stable")[:k]
        return [(int(i), self.sources[i].text, float(scores[i])) for i in order]

    def __repr__(self) -> str:
        lines = [f"ContextAttribution({self.method}, {len(self.sources)} sources, response {self.response!r:.80}"]
        for i, text, score in self.top(min(3, len(self.sources))):
            lines.append(f"  [{i}] {score:+.4g}  {text[:70]!r}")
        return "\n".join(lines) + ")"

    # ---- views and export ----------------------------------------------------------------------------------------
    def to_html(self) -> str:
        """Self-contained HTML: the response, then the context with each source highlighted by its score (hover a
        source for it), in the colour language of every normx view (:mod:`normx.context.html`)."""
        from normx.context.html import context_html

        return context_html(self)

    def _repr_html_(self) -> str:
        return self.to_html()

    def to_captum(self):
        """Captum's ``LLMAttributionResult`` with the sources as input features: ``token_attr`` [response tokens,
        sources] (each step's source scores), ``seq_attr`` the whole response's (:attr:`scores`)."""
        from normx._torch import torch
        from normx.explanations.captum_result import _result_class

        rows = self.generation.scores[-1]
        token_attr = np.stack([source_scores(rows[t:t + 1], self.sources, self.reading)
                               for t in range(self.generation.steps)]).astype(np.float32)
        return _result_class()(
            input_tokens=[s.text for s in self.sources],
            output_tokens=[t.replace("\n", "\\n").strip() for t in self.response_tokens],
            seq_attr=torch.from_numpy(token_attr.sum(0)), token_attr=torch.from_numpy(token_attr),
            output_probs=torch.from_numpy(np.asarray(self.generation.probabilities, dtype=np.float32)))

    def to_dict(self) -> dict:
        """Plain JSON data: the sources (with their scores), the response and the token-level generation."""
        scores = self.scores.tolist()
        return {"context": self.context, "query": self.query, "prompt": self.prompt, "method": self.method,
                "response": self.response, "reading": self.reading,
                "sources": [{"text": s.text, "start": s.start, "end": s.end, "token_start": s.token_start,
                             "token_end": s.token_end, "score": score} for s, score in zip(self.sources, scores)],
                "settings": dict(self.settings), "generation": self.generation.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> ContextAttribution:
        sources = [Source(s["text"], int(s["start"]), int(s["end"]), int(s["token_start"]), int(s["token_end"]))
                   for s in data["sources"]]
        return cls(context=data["context"], query=data.get("query"), prompt=data["prompt"], sources=sources,
                   generation=Generation.from_dict(data["generation"]), settings=dict(data.get("settings", {})))

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, **kwargs)

    @classmethod
    def from_json(cls, text: str) -> ContextAttribution:
        return cls.from_dict(json.loads(text))
