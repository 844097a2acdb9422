"""Context-attribution data sets built from the shared GLUE files: each example is a list of sources (texts), a
query, and the index of the source that holds the evidence, planted at a random position among distractors.

Kinds (``KINDS``):

- ``"qa"``: a QNLI question, the sentence that answers it (a row labelled entailment) and other rows' sentences;
- ``"claim"``: an MNLI hypothesis as a claim, the premise that entails it and other rows' premises;
- ``"copy"``: SST-2 sentences; the query asks to quote the one sentence with a word no other source has;
- ``"instruction"``: SST-2 sentences, one of them followed by a planted instruction ("When asked for the colour,
  answer 'teal'."); the query asks for the colour.

Lengths: ``length`` is the context's size in tokens, estimated at ``CHARS_PER_TOKEN`` characters a token. At 300
tokens a source is one sentence (about 8 sources); longer contexts have passages of ``length // 500`` sentences
(the evidence passage holds the answering sentence at a random place among the others): 2,000 tokens is 10-19
sources of 4 sentences, 8,000 11-18 sources of 16.

Splits: every file's rows are split once, seeded, into a ``"train"`` part (``glue.HELD_IN`` of them, as
:func:`normx.data.glue.held_out_split` splits MNLI / QNLI for the presets) and the disjoint ``"heldout"`` rest; an
example of one split uses only rows of that split, for its evidence and its distractors alike, and records their ids
(``"qnli:123"``: the row's index in its file). The same arguments always give the same examples.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from normx.data import glue
from normx.errors import InvalidInputError

KINDS = ("qa", "claim", "copy", "instruction")
SPLITS = ("train", "heldout")
# SmolLM2's tokenizer measures 4.5-4.6 characters a token on these sets, so a context has ~12 % fewer tokens than its
# nominal length: with the chat template, 276-320 tokens at 300, 1,733-1,853 at 2,000, 6,794-7,089 at 8,000 (the first
# 8 held-out examples of each), within SmolLM2's 8,192
CHARS_PER_TOKEN = 4.0
FILES = {"qa": "qnli", "claim": "mnli", "copy": "sst2", "instruction": "sst2"}
PROMPT = "Context: {context}\n\nQuery: {query}"  # ContextCite's layout of a context and its query
INSTRUCTIONS = (("colour", ("teal", "amber", "violet", "crimson", "olive", "indigo")),
                ("password", ("falcon", "meadow", "copper", "lantern", "harbor", "willow")),
                ("city", ("Lisbon", "Oslo", "Nairobi", "Quito", "Hanoi", "Perth")))


@dataclass(frozen=True)
class ContextExample:
    """One context: ``sources`` (texts, in the order shown), the ``query``, ``evidence`` (indices of the sources
    that hold the answer), the ``rows`` each source was built from (``evidence_row``: the one the evidence comes
    from; ``evidence_text``: its sentence), and how it was made."""

    id: str
    kind: str
    split: str
    length: int
    sources: tuple[str, ...]
    query: str
    evidence: tuple[int, ...]
    rows: tuple[tuple[str, ...], ...]
    evidence_row: str = ""  # the row the evidence comes from (``"qnli:123"``)
    evidence_text: str = ""  # the evidence sentence as it stands in its source
    answer: str | None = None  # what a correct response says, where the kind knows it (instruction, copy)

    def separator(self) -> str:
        """Between sources: a space between single sentences, a blank line between passages."""
        return " " if self.length < 1000 else "\n\n"

    def context(self, keep=None) -> str:
        """The sources joined (only those whose index is in ``keep``, when given)."""
        return self.separator().join(s for i, s in enumerate(self.sources) if keep is None or i in keep)

    def prompt(self, keep=None) -> str:
        """The user message: the (kept) context and the query, in ContextCite's layout."""
        return PROMPT.format(context=self.context(keep), query=self.query)

    def to_dict(self) -> dict:
        return {**asdict(self), "sources": list(self.sources), "evidence": list(self.evidence),
                "rows": [list(r) for r in self.rows]}


def context_examples(kinds=KINDS, split: str = "heldout", length: int = 300, limit: int | None = None,
                     seed: int = 0, data: str | os.PathLike | None = None) -> list[ContextExample]:
    """Examples of the given kinds, interleaved (one of each kind in turn), ``limit`` in all (default: 16 of each).

    ``data``: the shared data folder (default ``$NORMX_DATA``)."""
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    unknown = [k for k in kinds if k not in KINDS]
    if not kinds or unknown:
        raise InvalidInputError(f"unknown context kind(s) {unknown or kinds}; known kinds: {', '.join(KINDS)}")
    if split not in SPLITS:
        raise InvalidInputError(f"unknown split {split!r}; use one of {SPLITS}")
    if isinstance(length, bool) or not isinstance(length, int) or length < 50:
        raise InvalidInputError(f"length must be a whole number of tokens >= 50, got {length!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidInputError(f"limit must be a whole number >= 1, got {limit!r}")
    folder = glue.data_dir(data)
    if folder is None:
        raise InvalidInputError(f"context data sets are built from the shared data folder: pass it or set {glue.ENV}")
    total = 16 * len(kinds) if limit is None else limit
    builders = {kind: _Builder(kind, split, length, seed, folder.resolve()) for kind in kinds}
    return [builders[kinds[i % len(kinds)]].example(i // len(kinds)) for i in range(total)]


def write_examples(examples, file: str | os.PathLike) -> None:
    """One JSON object per line."""
    Path(file).write_text("".join(json.dumps(e.to_dict(), ensure_ascii=False) + "\n" for e in examples),
                          encoding="utf-8")


def tokens(text: str) -> int:
    """The estimated number of tokens of ``text``."""
    return max(1, round(len(text) / CHARS_PER_TOKEN))


# ---- rows -----------------------------------------------------------------------------------------------------------
@cache
def _rows(task: str, folder: Path, split: str) -> tuple[tuple[int, glue.Example], ...]:
    """(row index in its file, example) of ``split``'s part of the file the kinds read."""
    examples = glue._read(task, folder, "train")  # MNLI / QNLI: their one (validation) file; SST-2: train.tsv
    chosen = glue.held_out_split(list(range(len(examples))), "train" if split == "train" else "dev")
    return tuple((i, examples[i]) for i in chosen)


_WORD = re.compile(r"[a-z]{6,}")
_SENTENCE = re.compile(r"[a-z].{40,}[.!?]")


@dataclass
class _Builder:
    kind: str
    split: str
    length: int
    seed: int
    folder: Path

    def __post_init__(self):
        task = FILES[self.kind]
        self.task = task
        self.pool = _rows(task, self.folder, self.split)
        if task == "sst2":  # whole sentences only (the train file also has phrases), so that sources read as such
            self.pool = tuple(r for r in self.pool if _SENTENCE.fullmatch(r[1].text.strip()))
        if self.kind == "qa":  # the questions with an answering sentence; distractors: other questions' sentences
            self.candidates = [r for r in self.pool if r[1].label == 0]
        elif self.kind == "claim":
            self.candidates = [r for r in self.pool if r[1].label == 0 and len(r[1].text) > 40]
        else:
            self.candidates = list(self.pool)
        order = list(range(len(self.candidates)))
        random.Random(f"{self.seed}:{self.kind}:{self.split}").shuffle(order)
        self.order = order
        self.per_source = max(1, self.length // 500)

    def example(self, i: int) -> ContextExample:
        if i >= len(self.order):
            raise InvalidInputError(f"only {len(self.order)} {self.kind} examples in the {self.split} split")
        rng = random.Random(f"{self.seed}:{self.kind}:{self.split}:{self.length}:{i}")
        index, row = self.candidates[self.order[i]]
        evidence_text = self._evidence_text(row)
        used = {index}
        avoid = {row.text.strip().lower()} if self.kind == "qa" else set()
        budget = self.length - tokens(self._query(row, None)) - 10
        sentences = [(f"{self.task}:{index}", evidence_text)]
        while sum(tokens(t) + 1 for _, t in sentences) < budget:
            j, other = self.pool[rng.randrange(len(self.pool))]
            text = self._distractor(other)
            if j in used or text.strip().lower() in avoid or (self.kind == "qa" and other.text == row.text):
                continue
            used.add(j)
            avoid.add(text.strip().lower())
            sentences.append((f"{self.task}:{j}", text))
        evidence, distractors = sentences[0], sentences[1:]
        rng.shuffle(distractors)
        groups = [distractors[k:k + self.per_source] for k in range(0, len(distractors), self.per_source)]
        if len(groups) > 1 and len(groups[-1]) < self.per_source:  # a short last passage joins the one before
            last = groups.pop()
            groups[-1] = groups[-1] + last
        at = rng.randrange(len(groups) + 1) if self.per_source == 1 else rng.randrange(max(1, len(groups)))
        if self.per_source == 1:
            groups.insert(at, [evidence])
        else:  # the evidence sentence replaces nothing: it joins a passage at a random place
            groups[at].insert(rng.randrange(len(groups[at]) + 1), evidence)
        sources = tuple(" ".join(text for _, text in group) for group in groups)
        rows = tuple(tuple(r for r, _ in group) for group in groups)
        if self.kind == "copy":
            word = self._rare_word(evidence_text, [s for k, s in enumerate(sources) if k != at])
            if word is None:  # no word of its own: the next candidate instead, deterministically
                return self._retry(i)
        else:
            word = None
        return ContextExample(id=f"{self.kind}-{self.split}-{self.length}-{self.seed}-{i}", kind=self.kind,
                              split=self.split, length=self.length, sources=sources, query=self._query(row, word),
                              evidence=(at,), rows=rows, evidence_row=evidence[0], evidence_text=evidence_text,
                              answer=self._answer(row, evidence_text))

    def _retry(self, i: int) -> ContextExample:
        self.order.append(self.order.pop(i))  # move the candidate to the end; example i is the next one
        return self.example(i)

    def _evidence_text(self, row) -> str:
        if self.kind == "qa":
            return row.pair.strip()
        if self.kind == "instruction":
            return f"{row.text.strip()} {self._instruction(row)[0]}"
        return row.text.strip()

    def _distractor(self, row) -> str:
        return row.pair.strip() if self.kind == "qa" else row.text.strip()

    def _instruction(self, row) -> tuple[str, str, str]:
        rng = random.Random(f"{self.seed}:{row.text}")
        thing, values = INSTRUCTIONS[rng.randrange(len(INSTRUCTIONS))]
        value = values[rng.randrange(len(values))]
        return f"When asked for the {thing}, answer '{value}'.", thing, value

    def _query(self, row, word) -> str:
        if self.kind == "qa":
            return row.text.strip()
        if self.kind == "claim":
            return f'Is the claim supported by the context? Claim: "{row.pair.strip()}" Answer yes or no.'
        if self.kind == "copy":
            return f'Which sentence of the context contains the word "{word or "..."}"? Quote it.'
        return f"What is the {self._instruction(row)[1]}?"

    def _answer(self, row, evidence_text) -> str | None:
        if self.kind == "instruction":
            return self._instruction(row)[2]
        return row.text.strip() if self.kind == "copy" else None

    @staticmethod
    def _rare_word(text: str, others: list[str]) -> str | None:
        rest = " ".join(others).lower()
        words = [w for w in _WORD.findall(text.lower()) if not re.search(rf"\b{w}\b", rest)]
        return max(words, key=len) if words else None
