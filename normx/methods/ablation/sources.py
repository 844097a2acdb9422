"""Sources: the parts of a text (sentences, paragraphs, lines, words, tokens) that context attribution scores, as
character spans of the text, and the tokens each covers.

Sentences come from nltk's Punkt splitter, untrained (nothing is downloaded, nothing is read from disk) and given
common English abbreviations, run on each line separately (as ContextCite's partitioner does: a line break always
ends a sentence), then cut where a sentence begins without the marks Punkt reads (transcribed speech without full
stops, a title before a sentence: :func:`_unmarked`). Paragraphs are separated by blank lines, lines by line
breaks, words by white space. Every span is stripped of the white space around it and never empty.

A token belongs to the source its characters overlap most; special tokens, tokens of no characters (a BOS) and
tokens outside the text's region (a chat template's scaffolding) belong to none.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import pairwise

import numpy as np

from normx.errors import InvalidInputError

SPLITS = ("sentences", "paragraphs", "lines", "words")
# common English abbreviations (lower case, without their final period) that do not end a sentence
ABBREVIATIONS = frozenset({
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "ft", "vs", "etc", "e.g", "i.e", "cf", "al", "approx",
    "inc", "ltd", "co", "corp", "dept", "univ", "assn", "bros", "gen", "gov", "sen", "rep", "col", "capt", "lt",
    "sgt", "rev", "hon", "no", "nos", "vol", "vols", "fig", "figs", "eq", "eqs", "ch", "sec", "pp", "ed", "eds",
    "a.m", "p.m", "u.s", "u.k", "u.n", "e.u", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct",
    "nov", "dec", "mon", "tue", "wed", "thu", "fri", "sat", "sun", "est", "ca", "c", "b", "d", "ph.d", "m.d",
})
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")
# words that open an English sentence and are written in lower case inside one: where one follows a lower-case word
# or a digit with no punctuation between (a sentence without its full stop: transcribed speech, a title, a list
# item) or a full stop that Punkt took for an abbreviation's ("Tiffany & Co. There are"), and is not the first word of
# a name or title ("called The Master", "Xbox One": a capitalised word after it), a sentence starts there
_OPENERS = ("The|A|An|It|He|She|They|We|You|This|That|These|Those|There|Here|His|Her|Its|Their|Our|My|Your|In|On|At|"
            "For|From|With|By|As|After|Before|When|While|If|Although|Though|But|And|So|Yet|However|Many|Most|Some|"
            "Several|Each|Both|Also|Still|Later|Today|Now|Then|Generally|Indeed|Under|Across|During|Despite|Since|"
            "Because|Unlike|Instead|Meanwhile|Moreover|Thus|Perhaps|Even|Only|Yes|Well|Oh|What|Why|How|Where|Who|"
            "Was|Were|Is|Are|Do|Did|Can|Could|Would|Should|Will")
_UNMARKED = re.compile(rf"(?<=\S)\s+(?=(?:{_OPENERS})\b(?![-'’])(?!\s+[A-Z0-9]))")
_LOWER_WORD = re.compile(r"(?<!\S)[a-z0-9][a-z0-9'’-]*$")  # a word with no capital and no punctuation after it
# a full stop, then a lower-case word: a sentence ends there after a number or a word of four letters or more that
# is not an abbreviation ("in March 1998. and uh my daughter"; Punkt waits for a capital)
_LOWER_AFTER_STOP = re.compile(r"(?<=[0-9a-z][.!?])\s+(?=[a-z])")
_WORD_BEFORE = re.compile(r"(\S+)[.!?]$")


def _sentence_splitter():
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    splitter = PunktSentenceTokenizer()  # untrained: offline, no punkt data
    splitter._params.abbrev_types.update(ABBREVIATIONS)
    return splitter


def split_text(text: str, how: str = "sentences") -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of ``text``'s sentences, paragraphs, lines or words (``how``), in order,
    stripped of surrounding white space; white space alone gives no span."""
    if how not in SPLITS:
        raise InvalidInputError(f"sources={how!r} is not a way to split a text; use one of {SPLITS}")
    if how == "words":
        return [m.span() for m in re.finditer(r"\S+", text)]
    if how == "paragraphs":
        pieces, start = [], 0
        for m in _PARAGRAPH_BREAK.finditer(text):
            pieces.append((start, m.start()))
            start = m.end()
        pieces.append((start, len(text)))
        return [span for span in (_stripped(text, a, b) for a, b in pieces) if span is not None]
    lines, start = [], 0
    for m in re.finditer(r"\r\n|\n|\r", text):
        lines.append((start, m.start()))
        start = m.end()
    lines.append((start, len(text)))
    lines = [span for span in (_stripped(text, a, b) for a, b in lines) if span is not None]
    if how == "lines":
        return lines
    splitter = _sentence_splitter()
    out = []
    for a, b in lines:
        for s, e in splitter.span_tokenize(text[a:b]):
            for start, end in _unmarked(text, a + s, a + e):
                span = _stripped(text, start, end)
                if span is not None:
                    out.append(span)
    return out


def _unmarked(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """A Punkt sentence ``text[start:end]`` cut where another begins without the marks Punkt reads
    (:data:`_UNMARKED`, :data:`_LOWER_AFTER_STOP`): before a sentence opener after a lower-case word, a digit or a
    full stop, and after a full stop that ends a sentence before a lower-case word."""
    cuts = [m.start() for m in _UNMARKED.finditer(text, start, end)
            if text[m.start() - 1] in ".!?" or _LOWER_WORD.search(text, max(start, m.start() - 40), m.start())]
    cuts += [m.start() for m in _LOWER_AFTER_STOP.finditer(text, start, end) if _ends_sentence(text, m.start())]
    return list(pairwise([start, *sorted(set(cuts)), end]))


def _ends_sentence(text: str, at: int) -> bool:
    """Whether the full stop just before ``at`` ends a sentence: it follows a number, or a word of four letters or
    more that is no abbreviation."""
    word = _WORD_BEFORE.search(text, max(0, at - 40), at)
    if word is None:
        return False
    word = word.group(1).lower().strip("\"'([")
    return word.isdigit() or (len(word) >= 4 and word.isalpha() and word not in ABBREVIATIONS)


_LABEL = re.compile(r"\s*(context|documents?|passages?|sources?|text)\s*:\s*", re.IGNORECASE)
_ASKING = re.compile(r"\s*(question|query|q|answer|a|claim|task|instruction)s?\s*:", re.IGNORECASE)


def question_start(text: str) -> int:
    """Where ``text``'s closing question begins: the run of lines at its end that ask (a ``Question:`` / ``Query:`` /
    ``Answer:`` label, or a line ending in ``?``) or are short (under a quarter of its longest line), as
    ``"Question: ...\nAnswer:"`` after a context; never its first line. ``len(text)`` when none does."""
    lines = split_text(text, "lines")
    longest = max((b - a for a, b in lines), default=0)
    k = len(lines)
    while k > 1:
        a, b = lines[k - 1]
        if not (_ASKING.match(text, a) or text[b - 1] == "?" or 4 * (b - a) < longest):
            break
        k -= 1
    return lines[k][0] if k < len(lines) else len(text)


def auto_split(text: str) -> tuple[str, list[tuple[int, int]]]:
    """``sources="auto"``: the text before its closing question (:func:`question_start`) and after a leading label
    (``Context:``) split into paragraphs when at least two of them hold more than one sentence (documents, passages),
    else into sentences; ``(how, spans)``."""
    end = question_start(text)
    label = _LABEL.match(text, 0, end)  # "Context: ..." / "Documents:": the label is no part of a source
    body = text[label.end() if label else 0:end]
    offset = label.end() if label else 0
    paragraphs = []
    for a, b in split_text(body, "paragraphs"):  # a heading line ("Context:", "Documents:") joins what follows
        if paragraphs and _heading(body, *paragraphs[-1]):
            a = paragraphs.pop()[0]
        paragraphs.append((a, b))
    long = sum(len(split_text(body[a:b], "sentences")) > 1 for a, b in paragraphs)
    how = "paragraphs" if long >= 2 else "sentences"
    spans = paragraphs if how == "paragraphs" else split_text(body, "sentences")
    return how, [(a + offset, b + offset) for a, b in spans]


def _heading(text: str, start: int, end: int) -> bool:
    """One short line ending in a colon."""
    piece = text[start:end]
    return piece.endswith(":") and "\n" not in piece and len(piece) <= 40


def _stripped(text: str, start: int, end: int) -> tuple[int, int] | None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if end > start else None


def token_sources(spans: Sequence[tuple[int, int]], offsets: Sequence[tuple[int, int]], special: Sequence[bool],
                  count: int | None = None) -> list[list[int]]:
    """For each character span, the indices (among the first ``count`` tokens; default all) of the tokens whose
    characters overlap it most (the first such span on a tie); special and empty tokens are in none. A span that no
    token falls in has an empty list. The spans do not overlap one another (sentences, paragraphs, given sources).
    Linear in the tokens and the spans: each token is compared with the spans its characters reach only (found by
    binary search in the spans sorted by their ends), never with every span."""
    count = len(offsets) if count is None else count
    out: list[list[int]] = [[] for _ in spans]
    if not spans or count <= 0:
        return out
    bounds = np.asarray(spans, np.int64).reshape(-1, 2)
    order = np.argsort(bounds[:, 1], kind="stable")  # spans by where they end
    ends, starts = bounds[order, 1], bounds[order, 0]
    tokens = np.asarray(offsets[:count], np.int64).reshape(-1, 2)
    live = (tokens[:, 1] > tokens[:, 0]) & ~np.asarray(special[:count], bool)
    first = np.searchsorted(ends, tokens[:, 0], side="right")  # the first span ending after the token starts
    best = np.full(count, -1, np.int64)
    overlap = np.zeros(count, np.int64)
    active, k = live, first
    while active.any():  # the spans each token reaches, one rank at a time (most tokens reach one or two)
        at = np.minimum(k, len(ends) - 1)
        active = active & (k < len(ends)) & (starts[at] < tokens[:, 1])
        shared = np.minimum(ends[at], tokens[:, 1]) - np.maximum(starts[at], tokens[:, 0])
        better = active & (shared > 0) & ((shared > overlap) | ((shared == overlap) & (order[at] < best)))
        best = np.where(better, order[at], best)
        overlap = np.where(better, shared, overlap)
        k = k + 1
    for token, span in enumerate(best.tolist()):
        if span >= 0:
            out[span].append(token)
    return out


def check_spans(given, what: str = "sources") -> list[list[int]]:
    """Token spans as a user gives them (``[(start, end), ...]``, end exclusive, non-overlapping) -> ``[[start,
    end], ...]``; :class:`InvalidInputError` otherwise."""
    if isinstance(given, str) or not isinstance(given, Sequence) or not given:
        raise InvalidInputError(f"{what} must be one of {(*SPLITS, 'tokens')} or a non-empty list of (start, end) "
                                f"token spans, got {given!r:.80}")
    spans = []
    for span in given:
        ok = isinstance(span, Sequence) and not isinstance(span, str) and len(span) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in span)
        if not ok or not 0 <= span[0] < span[1]:
            raise InvalidInputError(f"each of {what} must be a (start, end) pair of token indices with 0 <= start "
                                    f"< end, got {span!r:.80}")
        spans.append([int(span[0]), int(span[1])])
    ordered = sorted(spans)
    if any(b[0] < a[1] for a, b in pairwise(ordered)):
        raise InvalidInputError(f"{what} overlap: each token may be in one source only, got {spans!r:.120}")
    return spans
