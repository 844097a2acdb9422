"""The word-level view: subword tokens grouped into nltk words through the tokenizer's character offsets.

Special tokens stay separate units (marked ``special``), never dropped. Aggregations: sum, mean, max, absmax
(the value of largest magnitude, sign kept).
"""

from __future__ import annotations

import re

import numpy as np

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


def word_units(text: str, text_pair: str | None, offsets, segments, special) -> list[tuple[list[int], dict]]:
    """The word units of a token-level explanation, in token order: ``(token indices, fields)`` where ``fields``
    has the unit's ``token`` (the word as typed, or the token itself for special tokens and tokens outside any
    word), ``offsets``, ``segment`` and ``special``."""
    texts = {0: text, 1: text_pair}
    spans = {seg: word_spans(t) for seg, t in texts.items() if t is not None}
    units: dict[tuple, list[int]] = {}  # ("word", segment, word index) or ("token", token index) -> token indices
    for i, (start, end) in enumerate(offsets):
        seg = segments[i]
        word = None
        if not special[i] and seg in spans and end > start:
            word = _best_word(spans[seg], start, end)
        key = ("token", i) if word is None else ("word", seg, word)
        units.setdefault(key, []).append(i)
    out = []
    for key, members in sorted(units.items(), key=lambda kv: kv[1][0]):
        if key[0] == "word":
            _, seg, w = key
            a, b = spans[seg][w]
            out.append((members, {"token": texts[seg][a:b], "offsets": (a, b), "segment": seg, "special": False}))
        else:
            i = key[1]
            out.append((members, {"token": None, "offsets": offsets[i], "segment": segments[i],
                                  "special": special[i]}))
    return out


def aggregate(scores: np.ndarray, groups: list[list[int]], how: str) -> np.ndarray:
    """``scores`` [..., tokens] aggregated over each group of token indices with ``how`` (a name in
    :data:`AGGREGATIONS`) -> [..., groups]."""
    return np.stack([AGGREGATIONS[how](scores[..., m]) for m in groups], axis=-1).astype(scores.dtype)


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
