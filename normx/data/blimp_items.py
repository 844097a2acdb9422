"""BLiMP pairs made ready for one model: the text it reads (the sentence with the target word masked, or the prefix
before it for a causal LM), the target and foil token ids, and the evidence spans in that text; and the seeded
train / dev split of a paradigm's pairs. Used by the evidence-alignment experiment and by the training of the
``minilm-blimp`` preset, so a model is trained on exactly the inputs it is later explained on."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from normx.data import blimp as ev
from normx.data.glue import held_out_split
from normx.models import HeadKind


@dataclass(frozen=True)
class Item:
    """A pair made ready for one model: the text it reads and the token ids to explain."""

    pair: ev.Pair
    text: str
    target_id: int
    foil_id: int
    evidence_spans: tuple[tuple[int, int], ...]  # character spans in ``text``


def split_pairs(pairs: Sequence[ev.Pair], split: str) -> list[ev.Pair]:
    """``"all"`` the pairs, or their seeded training part (``"train"``, 70 %) or the disjoint rest (``"dev"``), as
    :func:`normx.data.glue.held_out_split` cuts MNLI and QNLI."""
    return list(pairs) if split == "all" else held_out_split(list(pairs), split)


# ---- preparing pairs for a model ---------------------------------------------------------------------------------


def first_token(tokenizer, text: str, span: tuple[int, int]) -> int | None:
    """The id of the first token that overlaps the character span ``span`` of ``text`` (None if none does)."""
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=True)
    for token_id, (start, end) in zip(enc["input_ids"], enc["offset_mapping"]):
        if start < span[1] and end > span[0]:
            return int(token_id)
    return None


def next_token(tokenizer, sentence: str, prefix: str) -> int | None:
    """The id of the token a causal LM reads right after ``prefix`` in ``sentence`` (None if the prefix does not
    tokenize the same inside the sentence, so the model would not see that token next)."""
    kwargs = dict(return_offsets_mapping=True, return_special_tokens_mask=True, add_special_tokens=True)
    full, alone = tokenizer(sentence, **kwargs), tokenizer(prefix, **kwargs)
    plain = [i for i, s in zip(alone["input_ids"], alone["special_tokens_mask"]) if not s]
    before = []
    for token_id, (_, end), special in zip(full["input_ids"], full["offset_mapping"], full["special_tokens_mask"]):
        if special:
            continue
        if end > len(prefix):
            return int(token_id) if before == plain else None
        before.append(token_id)
    return None


def prepare(pairs: Sequence[ev.Pair], tokenizer, kind: HeadKind | str, evidence: str = "phrase"
            ) -> tuple[list[Item], Counter, dict[str, str]]:
    """Items for a ``kind`` ("masked_lm" / "causal_lm") model, and the pairs skipped (reason -> count, examples).
    ``evidence`` chooses the evidence spans an item carries (:meth:`~normx.data.blimp.Pair.spans`)."""
    kind = HeadKind(kind)
    items, skipped, examples = [], Counter(), {}

    def skip(reason, pair):
        skipped[reason] += 1
        examples.setdefault(reason, pair.sentence)

    for pair in pairs:
        start, end = pair.target_span
        evidence_spans = pair.spans(evidence)
        if kind is HeadKind.CAUSAL_LM:
            if any(s[1] > start for s in evidence_spans):
                skip("the evidence does not precede the target", pair)
                continue
            if not pair.prefix:
                skip("the target word starts the sentence", pair)
                continue
            target = next_token(tokenizer, pair.sentence, pair.prefix)
            foil = next_token(tokenizer, pair.bad_sentence, pair.prefix)
        else:
            target = first_token(tokenizer, pair.sentence, pair.target_span)
            foil = first_token(tokenizer, pair.bad_sentence, pair.bad_span)
        if target is None or foil is None:
            skip("the prefix tokenizes differently inside the sentence" if kind is HeadKind.CAUSAL_LM
                 else "the target word has no token", pair)
            continue
        if target == foil:
            skip("good and bad words start with the same token", pair)
            continue
        if kind is HeadKind.CAUSAL_LM:
            items.append(Item(pair, pair.prefix, target, foil, evidence_spans))
        else:
            mask = tokenizer.mask_token
            text = pair.sentence[:start] + mask + pair.sentence[end:]
            shift = len(mask) - (end - start)
            spans = tuple(s if s[1] <= start else (s[0] + shift, s[1] + shift) for s in evidence_spans)
            items.append(Item(pair, text, target, foil, spans))
    return items, skipped, examples
