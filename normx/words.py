"""The word-level view: subword tokens grouped into nltk words through the tokenizer's character offsets.

Special tokens stay separate units (marked ``special``), never dropped. Aggregations: sum, mean, max, absmax
(the value of largest magnitude, sign kept).
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from .errors import InvalidInputError
from .result import Explanation

AGGREGATIONS = {
    "sum": lambda s: s.sum(-1),
    "mean": lambda s: s.mean(-1),
    "max": lambda s: s.max(-1),
    "absmax": lambda s: np.take_along_axis(s, np.abs(s).argmax(-1)[..., None], -1)[..., 0],
}
_FALLBACK = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def word_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of nltk's word tokens (Treebank-style: punctuation and clitics split off)."""
    from nltk.tokenize import NLTKWordTokenizer

    try:
        return [(int(a), int(b)) for a, b in NLTKWordTokenizer().span_tokenize(text)]
    except ValueError:  # nltk cannot align some quote patterns; fall back to a plain regex split
        return [m.span() for m in _FALLBACK.finditer(text)]


def to_words(explanation: Explanation, how: str = "sum") -> Explanation:
    """A new :class:`Explanation` whose units are words; scores aggregated over each word's tokens."""
    if how not in AGGREGATIONS:
        raise InvalidInputError(f"aggregation how={how!r} is not allowed; use one of {tuple(AGGREGATIONS)}")
    if explanation.unit != "token":
        raise InvalidInputError(f"this explanation is already at {explanation.unit} level")
    texts = {0: explanation.text, 1: explanation.text_pair}
    spans = {seg: word_spans(text) for seg, text in texts.items() if text is not None}

    # unit key -> token indices; a unit is ("word", segment, word index) or ("token", token index)
    units: dict[tuple, list[int]] = {}
    for i, (start, end) in enumerate(explanation.offsets):
        seg = explanation.segments[i]
        word = None
        if not explanation.special[i] and seg in spans and end > start:
            word = _best_word(spans[seg], start, end)
        key = ("token", i) if word is None else ("word", seg, word)
        units.setdefault(key, []).append(i)

    ordered = sorted(units.items(), key=lambda kv: kv[1][0])
    tokens, offsets, segments, special, groups = [], [], [], [], []
    for key, members in ordered:
        if key[0] == "word":
            _, seg, w = key
            a, b = spans[seg][w]
            tokens.append(texts[seg][a:b])
            offsets.append((a, b))
            segments.append(seg)
            special.append(False)
        else:
            i = key[1]
            tokens.append(explanation.tokens[i])
            offsets.append(explanation.offsets[i])
            segments.append(explanation.segments[i])
            special.append(explanation.special[i])
        groups.append(members)
    scores = np.stack([AGGREGATIONS[how](explanation.scores[:, :, m]) for m in groups], axis=-1)
    return replace(explanation, tokens=tokens, offsets=offsets, segments=segments, special=special,
                   scores=scores.astype(explanation.scores.dtype), groups=groups, unit="word",
                   pooled=next((j for j, members in enumerate(groups) if explanation.pooled in members), None),
                   settings=dict(explanation.settings, word_aggregation=how))


def _best_word(spans: list[tuple[int, int]], start: int, end: int) -> int | None:
    """The word with the largest character overlap with [start, end), or None if none overlaps."""
    best, best_overlap = None, 0
    for w, (a, b) in enumerate(spans):
        if a >= end:
            break
        overlap = min(b, end) - max(a, start)
        if overlap > best_overlap:
            best, best_overlap = w, overlap
    return best
