"""Turning user texts (and text pairs) into padded model inputs, with offsets kept for the word view."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from normx._torch import torch
from normx.core.concurrency import tokenizer_lock
from normx.errors import EmptyTextError, InputTooLongError, InvalidInputError
from normx.models import Adapter

if TYPE_CHECKING:
    from normx.core.handle import ModelHandle

TRUNCATION_MODES = ("warn", "error")
_HUGE = 10**6  # tokenizers without a real limit report model_max_length as a huge sentinel


@dataclass
class Encoded:
    """One tokenised text or pair, unpadded."""

    text: str
    text_pair: str | None
    ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    segments: list[int]  # 0 = text, 1 = text_pair, -1 = special token
    special: list[bool]
    extra: dict[str, list[int]] = field(default_factory=dict)  # e.g. token_type_ids
    warnings: list[str] = field(default_factory=list)


def as_text_list(texts: str | Sequence[str], name: str = "texts") -> list[str]:
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, Sequence) or isinstance(texts, (bytes, bytearray)):
        raise InvalidInputError(f"{name} must be a string or a list of strings, got {type(texts).__name__}")
    texts = list(texts)
    if not texts:
        raise InvalidInputError(f"{name} is an empty list; give at least one text")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInputError(f"{name}[{i}] must be a string, got {type(text).__name__}: {text!r}")
        check_text(text, f"{name}[{i}]")
    return texts


def text_inputs(texts, text_pair=None) -> tuple[list[str], list[str] | None]:
    """``texts`` and ``text_pair`` as lists (one pair per text), checked."""
    texts = as_text_list(texts)
    pairs = None if text_pair is None else as_text_list(text_pair, "text_pair")
    if pairs is not None and len(pairs) != len(texts):
        raise InvalidInputError(f"text_pair has {len(pairs)} texts but texts has {len(texts)}; give one pair each")
    return texts, pairs


def positive_int(value, name: str, *, none: bool = False):
    """``value`` if it is a positive integer (or None, with ``none``); :class:`InvalidInputError` naming it
    otherwise."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"{name} must be a positive integer{' or None' if none else ''}, got {value!r}")
    return value


def check_text(text: str, name: str = "the text") -> None:
    """Raise for text a tokenizer cannot take or that has nothing to explain: a lone surrogate (not valid
    Unicode), or only white space, control, format (zero-width) or NUL characters (:class:`EmptyTextError`)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(f"{name} is not valid Unicode: a lone surrogate {text[exc.start]!r} at character "
                                f"{exc.start}; decode the text with errors='replace' first") from None
    if not any(not ch.isspace() and unicodedata.category(ch) not in _INVISIBLE for ch in text):
        raise EmptyTextError(f"{name} is empty or has only white space, control or zero-width characters "
                             f"({text[:40]!r}); give a text with something to explain")


_INVISIBLE = {"Cc", "Cf", "Zs", "Zl", "Zp", "Cn"}  # control, format (zero-width), separators, unassigned


def resolve_max_length(max_length, tokenizer, handle: ModelHandle) -> int:
    """``max_length`` checked against what the model of ``handle`` takes (default: that limit)."""
    limit = max_input_length(tokenizer, handle)
    if max_length is None:
        return limit
    if isinstance(max_length, bool) or not isinstance(max_length, int) or not 1 <= max_length <= limit:
        raise InvalidInputError(f"max_length={max_length!r} is not allowed: this model takes inputs of 1..{limit} "
                                "tokens (special tokens included)")
    return max_length


def count_tokens(tokenizer, text: str, pair: str | None = None) -> int:
    """The number of tokens the model would get for ``text`` (and ``pair``), special tokens included."""
    with tokenizer_lock(tokenizer):
        return len(tokenizer(text, pair, truncation=False)["input_ids"])


def pad_token_id(tokenizer) -> int | None:
    """The id normx pads batches with: the tokenizer's pad token, else its end-of-sequence token; None if it has
    neither (then texts of different lengths cannot share a batch: :func:`collate` says so)."""
    for value in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if value is not None:
            return int(value)
    return None


def max_input_length(tokenizer, handle: ModelHandle) -> int:
    """The longest input the model of ``handle`` takes: the tokenizer's limit, capped by the model's position
    table (as its adapter reads it)."""
    limits = []
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < _HUGE:
        limits.append(tok_max)
    positions = handle.max_positions
    if positions is not None:
        limits.append(positions)
    return min(limits) if limits else 512


def encode(tokenizer, texts: list[str], pairs: list[str] | None, max_length: int, truncation: str) -> list[Encoded]:
    if truncation not in TRUNCATION_MODES:
        raise InvalidInputError(f"truncation={truncation!r} is not allowed; use one of {TRUNCATION_MODES}")
    if not getattr(tokenizer, "is_fast", False):
        raise InvalidInputError(
            f"normx needs a fast (Rust) tokenizer for character offsets; got {type(tokenizer).__name__}. "
            "Load it with AutoTokenizer.from_pretrained(..., use_fast=True)."
        )
    keep = [n for n in getattr(tokenizer, "model_input_names", ["input_ids", "attention_mask"])
            if n not in ("input_ids", "attention_mask")]
    kwargs = dict(return_offsets_mapping=True, return_special_tokens_mask=True, add_special_tokens=True)
    # one call for all texts (the tokenizer's batch path); an over-long text is encoded again, truncated
    lock = tokenizer_lock(tokenizer)  # a fast tokenizer's truncation setting is state of the shared object
    with lock:
        batch = tokenizer(texts, pairs, truncation=False, **kwargs)
    out = []
    for i, text in enumerate(texts):
        pair = pairs[i] if pairs is not None else None
        enc, index = batch, i
        warnings = []
        n = len(batch["input_ids"][i])
        if n > max_length:
            what = f"input {i} has {n} tokens, more than the model's {max_length}"
            if truncation == "error":
                raise InputTooLongError(f"{what}; shorten it, or pass truncation='warn' to truncate it")
            with lock:
                enc = tokenizer([text], None if pair is None else [pair],
                                truncation="longest_first" if pair is not None else True, max_length=max_length,
                                **kwargs)
            index = 0
            warnings.append(f"{what}: truncated to {max_length} tokens")
        ids = list(enc["input_ids"][index])
        seq_ids = enc.sequence_ids(index) if enc.encodings else [None] * len(ids)
        special = [bool(s) for s in enc["special_tokens_mask"][index]]
        segments = [-1 if (sid is None or sp) else int(sid) for sid, sp in zip(seq_ids, special)]
        out.append(Encoded(
            text=text, text_pair=pair, ids=ids, tokens=tokenizer.convert_ids_to_tokens(ids),
            offsets=[tuple(map(int, o)) for o in enc["offset_mapping"][index]], segments=segments, special=special,
            extra={name: list(enc[name][index]) for name in keep if name in enc}, warnings=warnings,
        ))
    return out


def collate(items: list[Encoded], pad_id: int | None, padding_side: str, device, position_ids: bool
            ) -> dict[str, torch.Tensor]:
    """Pad a list of encodings into a batch; decoders also get position ids that skip left padding."""
    width = max(len(item.ids) for item in items)
    if pad_id is None:
        if any(len(item.ids) != width for item in items):
            raise InvalidInputError("the tokenizer has neither a pad nor an end-of-sequence token, so texts of "
                                    "different lengths cannot share a batch: set tokenizer.pad_token, or pass "
                                    "batch_size=1")
        pad_id = 0  # never written: every row is full width
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    extras = {name: torch.zeros((len(items), width), dtype=torch.long) for name in items[0].extra}
    for row, item in enumerate(items):
        n = len(item.ids)
        cols = slice(width - n, width) if padding_side == "left" else slice(0, n)
        ids[row, cols] = torch.tensor(item.ids)
        mask[row, cols] = 1
        for name, values in item.extra.items():
            extras[name][row, cols] = torch.tensor(values)
    batch = {"input_ids": ids, "attention_mask": mask, **extras}
    if position_ids:
        batch["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    return {k: v.to(device) for k, v in batch.items()}


def batches(encoded: list[Encoded], batch_size: int, tokenizer, adapter: Adapter, device
            ) -> Iterator[tuple[list[Encoded], dict[str, torch.Tensor]]]:
    """``(items, inputs)`` for every ``batch_size`` consecutive encodings: padded with :func:`pad_token_id` on the
    adapter's side (decoders with position ids that skip the padding), on ``device``."""
    pad_id = pad_token_id(tokenizer)
    side = adapter.padding_side(tokenizer)
    for start in range(0, len(encoded), batch_size):
        items = encoded[start:start + batch_size]
        yield items, collate(items, pad_id, side, device, position_ids=adapter.decoder)


def token_budget_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices grouped into batches bucketed by length (shortest first) so that each batch's padded size (longest
    length x rows) stays within ``max_tokens`` (an input longer than the budget goes alone)."""
    out, batch, longest = [], [], 0
    for i in sorted(range(len(lengths)), key=lambda i: (lengths[i], i)):
        width = max(longest, lengths[i])
        if batch and width * (len(batch) + 1) > max_tokens:
            out.append(batch)
            batch, width = [], lengths[i]
        batch.append(i)
        longest = width
    if batch:
        out.append(batch)
    return out
