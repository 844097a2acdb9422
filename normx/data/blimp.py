"""BLiMP minimal pairs with their target word and the evidence word that decides it.

The target word is where ``sentence_good`` and ``sentence_bad`` differ (exactly one word in every paradigm here).
The evidence is the word the target has to agree with, found by rules over nltk's data-free tools (its
``RegexpTokenizer`` for words with character spans, a ``RegexpTagger`` that tags closed-class words) and the
fixed templates BLiMP's sentences come from. No parser or POS model is needed, so nothing has to be downloaded.

Tags (:data:`TAGGER`): ``DEM`` this/that/these/those, ``DET`` other determiners and quantifiers, ``AUX``
auxiliaries and modals (with their n't forms), ``P`` prepositions, ``REFL`` reflexive pronouns, ``W`` every other
(open-class) word. A subject noun phrase is ``[DET|DEM] W+`` or ``DET lot of W+`` (a lot of ...); its head is its
last word.

Rules, by paradigm (following Yin & Neubig 2022 and the NormXLogit paper's evidence definitions):

- ``ana`` anaphor number agreement ("Many women hate themselves"): the target is the reflexive; the evidence is
  its antecedent, the head of the subject, and the evidence *phrase* the whole subject noun phrase ("Many women",
  the antecedent as the authors' coreference resolver returns it). The words before the target are subject +
  auxiliaries + verb (+ prepositions); strip the prepositions, the verb and the auxiliaries from the end, and the
  rest must be a subject noun phrase. (A trailing "like" may be the verb itself, so fewer stripped prepositions
  are tried too.)
- ``dna``, ``dnaa`` determiner-noun agreement (with an adjective) 1 ("Tara likes that chair"): these files change
  the noun, so the target is the noun and the evidence is the nearest demonstrative (this/that/these/those) to its
  left. The NormXLogit paper uses the ``_2`` files instead (``dna_2``, ``dnaa_2``, the default): they change the
  determiner ("Russell explored this / these mall"), so the target is the demonstrative and the evidence the
  noun after it, the last word of the sentence's final noun phrase.
- ``rpsv``, ``ipsv`` regular / irregular plural subject-verb agreement 1 ("The Clintons hate every person"): the
  target is the verb (or auxiliary) right after the subject, and every word before it is the subject noun
  phrase; the evidence is its head (for "a lot of cashiers", "cashiers", the word that carries the number).
- ``darn`` distractor agreement, relational noun ("A niece of most senators hasn't ..."): the target is the verb;
  the evidence is the head of the subject, the open-class word right before the first preposition (not the
  distractor noun after it; "a lot of" is skipped over).

In the ``_1`` files and ana / darn / rpsv / ipsv the evidence precedes its target, so they work in the causal-LM
setting too; in ``dna_2`` / ``dnaa_2`` it follows the target, so only a masked LM can use them.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from nltk.tag import RegexpTagger
from nltk.tokenize import RegexpTokenizer

from normx.errors import InvalidInputError, ModelLoadError

ENV = "NORMX_DATA"
WORDS = RegexpTokenizer(r"\w+(?:[-']\w+)*")  # "hasn't", "Andrea's", "well-known" are one word; punctuation is not

_AUX = (r"(?:is|are|was|were|am|be|been|being|has|have|had|do|does|did|can|could|will|would|shall|should|may|"
        r"might|must|need|ought)(?:n't)?|can't|cannot|won't|not")
TAGGER = RegexpTagger([
    (r"(?i)^(?:this|that|these|those)$", "DEM"),
    (r"(?i)^(?:the|a|an|all|some|many|most|every|each|no|few|several|both|any|another|much|either|neither)$", "DET"),
    (r"(?i)^(?:himself|herself|itself|themselves|myself|yourself|ourselves|yourselves)$", "REFL"),
    (rf"(?i)^(?:{_AUX})$", "AUX"),
    (r"(?i)^(?:of|about|to|at|with|from|by|for|in|on|up|down|through|into|onto|over|around|like|after|before|"
     r"without|toward|towards|near|under|out|upon|across|past|away|off|behind|between)$", "P"),
    (r".*", "W"),
])
SUBJECT = re.compile(r"^(?:(?:DET|DEM) )?(?:W )*W$|^DET W P (?:W )*W$")  # tag sequences of a subject NP


@dataclass(frozen=True)
class Paradigm:
    key: str  # short name used on the command line
    uid: str  # BLiMP UID = file name (without .jsonl) in the data folder
    hub: str  # the config name of the Hugging Face ``nyu-mll/blimp`` dataset
    evidence: str  # what the evidence word is, in words
    rule: Callable[[list[str], list[str]], int | None]  # (words before the target, their tags) -> evidence index
    after: bool = False  # the rule reads the words *after* the target (index counted from the word after it)
    phrase: bool = False  # the evidence phrase is the noun phrase that starts the sentence and ends at the evidence


@dataclass(frozen=True)
class Pair:
    """One minimal pair: ``sentence`` (the good one) with the target word's span, the bad word's span in
    ``bad_sentence``, the good and bad target words, and the evidence word(s) with their spans in ``sentence``."""

    paradigm: str
    pair_id: str
    sentence: str
    bad_sentence: str
    target_span: tuple[int, int]
    bad_span: tuple[int, int]  # the bad word's span in ``bad_sentence``
    good: str
    bad: str
    evidence: tuple[str, ...]
    evidence_spans: tuple[tuple[int, int], ...]
    phrase_spans: tuple[tuple[int, int], ...] = ()  # every word of the evidence phrase (default: the evidence word)

    def spans(self, evidence: str) -> tuple[tuple[int, int], ...]:
        """The evidence's character spans for an ``evidence`` setting (:data:`EVIDENCE`): the evidence word
        ("first", "word") or the evidence phrase ("phrase")."""
        if evidence not in EVIDENCE:
            raise InvalidInputError(f"unknown evidence setting {evidence!r}; use one of {', '.join(EVIDENCE)}")
        return (self.phrase_spans or self.evidence_spans) if evidence == "phrase" else self.evidence_spans

    @property
    def prefix(self) -> str:
        """The text before the target word (what a causal LM sees)."""
        return self.sentence[:self.target_span[0]].rstrip()


@dataclass
class Extraction:
    """The pairs a paradigm's rules cover, and why the others were left out (reason -> count, plus examples)."""

    paradigm: str
    total: int = 0
    pairs: list[Pair] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def skip(self, reason: str, sentence: str) -> None:
        self.skipped[reason] += 1
        self.examples.setdefault(reason, sentence)


def tag(words: list[str]) -> list[str]:
    return [t for _, t in TAGGER.tag(words)]


def subject_head(words: list[str], tags: list[str]) -> int | None:
    """The index of the head of ``words`` if they form a subject noun phrase, else None."""
    if not words or not SUBJECT.match(" ".join(tags)):
        return None
    return len(words) - 1


def _anaphor(words: list[str], tags: list[str]) -> int | None:
    trailing = 0
    while trailing < len(words) and tags[len(words) - 1 - trailing] == "P":
        trailing += 1
    for strip in range(trailing, -1, -1):  # "The Impressionists like themselves": "like" is the verb here
        end = len(words) - strip
        if end < 2 or tags[end - 1] not in ("W", "P"):
            continue
        end -= 1  # the verb
        while end and tags[end - 1] == "AUX":
            end -= 1
        head = subject_head(words[:end], tags[:end])
        if head is not None:
            return head
    return None


def _demonstrative(words: list[str], tags: list[str]) -> int | None:
    for index in range(len(words) - 1, -1, -1):
        if tags[index] == "DEM":
            return index
    return None


def _relational_subject(words: list[str], tags: list[str]) -> int | None:
    for index in range(1, len(words)):
        if tags[index] == "P" and tags[index - 1] == "W" and words[index - 1].lower() != "lot":
            return subject_head(words[:index], tags[:index])
    return None


def _final_word(after: list[str], tags: list[str]) -> int | None:
    """The last word before the closing punctuation: in the _2 determiner files the demonstrative's noun phrase
    ends the sentence ("... these art galleries."), so this is its head noun."""
    words = [i for i, word in enumerate(after) if any(ch.isalnum() for ch in word)]
    return words[-1] if words else None


_DETERMINER, _SUBJECT_HEAD = "the demonstrative determiner of the noun", "the head of the subject"
PARADIGMS: dict[str, Paradigm] = {p.key: p for p in (
    Paradigm("ana", "anaphor_number_agreement", "anaphor_number_agreement",
             "the antecedent of the reflexive (head of the subject; phrase: the subject noun phrase)", _anaphor,
             phrase=True),
    *(Paradigm(key, uid, hub, _DETERMINER, _demonstrative) for key, uid, hub in (
        ("dna", "determiner_noun_agreement_1", "determiner_noun_agreement_1"),
        ("dnaa", "determiner_noun_agreement_with_adjective_1", "determiner_noun_agreement_with_adj_1"))),
    *(Paradigm(key, uid, uid, evidence, _final_word, after=True) for key, uid, evidence in (
        ("dna_2", "determiner_noun_agreement_2",
         "the noun after the demonstrative (the head: the last word of the noun phrase)"),
        ("dnaa_2", "determiner_noun_agreement_with_adj_2",
         "the noun after the demonstrative and its adjective (the last word of the noun phrase)"))),
    Paradigm("darn", "distractor_agreement_relational_noun", "distractor_agreement_relational_noun",
             "the head of the subject (not the distractor noun)", _relational_subject),
    *(Paradigm(key, uid, uid, _SUBJECT_HEAD, subject_head) for key, uid in (
        ("rpsv", "regular_plural_subject_verb_agreement_1"), ("ipsv", "irregular_plural_subject_verb_agreement_1"))),
)}
DEFAULT_PARADIGMS = ("ana", "dna_2", "dnaa_2", "darn", "rpsv")  # the NormXLogit paper's five
# Which tokens are the evidence: "first" = the first token of the evidence word; "word" = every token of it;
# "phrase" = every token of the evidence phrase (the antecedent noun phrase for ``ana``, as the authors'
# coreference-based evidence; the evidence word elsewhere, as their dependency-based evidence).
EVIDENCE = ("phrase", "word", "first")


def get_paradigm(key: str) -> Paradigm:
    """A paradigm by its short name (``dna``) or its BLiMP UID, the data file's name (``determiner_noun_agreement_1``,
    with or without ``.jsonl``)."""
    uid = key.removesuffix(".jsonl")
    found = PARADIGMS.get(key) or next((p for p in PARADIGMS.values() if uid in (p.uid, p.hub)), None)
    if found is None:
        raise InvalidInputError(f"unknown BLiMP paradigm {key!r}; supported: " + ", ".join(
            f"{p.key} ({p.uid})" for p in PARADIGMS.values()))
    return found


def words_with_spans(sentence: str) -> tuple[list[str], list[tuple[int, int]]]:
    spans = list(WORDS.span_tokenize(sentence))
    return [sentence[a:b] for a, b in spans], spans


def extract_pair(row: dict, paradigm: Paradigm) -> Pair | str:
    """A :class:`Pair` from one BLiMP row, or the reason (a short string) the rules do not cover it."""
    good, bad = row["sentence_good"], row["sentence_bad"]
    good_words, good_spans = words_with_spans(good)
    bad_words, bad_spans = words_with_spans(bad)
    if len(good_words) != len(bad_words):
        return "the sentences differ in word count"
    differ = [i for i, (a, b) in enumerate(zip(good_words, bad_words)) if a != b]
    if len(differ) != 1:
        return f"the sentences differ in {len(differ)} words, not one"
    target = differ[0]
    if paradigm.after:
        after = good_words[target + 1:]
        found = paradigm.rule(after, tag(after))
        evidence = None if found is None else target + 1 + found
    else:
        before = good_words[:target]
        evidence = paradigm.rule(before, tag(before))
    if evidence is None:
        return "no evidence word found by the rules"
    phrase = tuple(good_spans[i] for i in range(evidence + 1)) if paradigm.phrase else ()
    return Pair(paradigm.key, str(row.get("pairID", "")), good, bad, good_spans[target], bad_spans[target],
                good_words[target], bad_words[target], (good_words[evidence],), (good_spans[evidence],), phrase)


def extract(rows: Iterable[dict], paradigm: Paradigm) -> Extraction:
    result = Extraction(paradigm.key)
    for row in rows:
        result.total += 1
        pair = extract_pair(row, paradigm)
        if isinstance(pair, str):
            result.skip(pair, row["sentence_good"])
        else:
            result.pairs.append(pair)
    return result


def load_rows(paradigm: Paradigm, path: str | os.PathLike | None = None) -> list[dict]:
    """The paradigm's rows from ``<data>/blimp/<UID>.jsonl`` (data folder: ``path`` or ``$NORMX_DATA``), or from the
    Hugging Face hub (``datasets``, online) when neither is given."""
    chosen = path if path is not None else os.environ.get(ENV)
    if chosen is None:
        return _from_hub(paradigm)
    folder = Path(chosen).expanduser()
    if not folder.is_dir():
        raise InvalidInputError(f"data folder {folder} does not exist (from {'the argument' if path else ENV})")
    file = folder / "blimp" / f"{paradigm.uid}.jsonl"
    if not file.is_file():
        raise InvalidInputError(f"expected BLiMP file {file} is missing (paradigm {paradigm.key!r})")
    with open(file, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _from_hub(paradigm: Paradigm) -> list[dict]:
    try:
        import datasets
    except ImportError as exc:
        raise ModelLoadError(f"no data folder given: pass one or set {ENV} (the folder holding blimp/), or install "
                             "`datasets` to read BLiMP from the Hugging Face hub (needs network)") from exc
    return list(datasets.load_dataset("nyu-mll/blimp", paradigm.hub, split="train"))
