"""Turning user texts (and text pairs) into padded model inputs, with offsets kept for the word view."""

from __future__ import annotations

import functools
import unicodedata
import warnings as _warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from normx.core.batch import Encoded, collate  # (re-exported: the input layer's API)
from normx.core.concurrency import tokenizer_lock
from normx.core.vocabulary import vocabulary_names
from normx.errors import EmptyTextError, InputTooLongError, InputWarning, InvalidInputError

if TYPE_CHECKING:
    import torch

    from normx.core.handle import ModelHandle

TRUNCATION_MODES = ("warn", "error")
_HUGE = 10**6  # tokenizers without a real limit report model_max_length as a huge sentinel


def as_text_list(texts: str | Sequence[str], name: str = "texts") -> list[str]:
    if isinstance(texts, str):
        texts = [texts]
    elif type(texts) is not list and (not isinstance(texts, Sequence) or isinstance(texts, (bytes, bytearray))):
        raise InvalidInputError(f"{name} must be a string or a list of strings, got {type(texts).__name__}")
    else:
        texts = list(texts)
    if not texts:
        raise InvalidInputError(f"{name} is an empty list; give at least one text")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInputError(f"{name}[{i}] must be a string, got {type(text).__name__}: {text!r}")
        check_text(text, name, i)
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


def check_text(text: str, name: str = "the text", index: int | None = None) -> None:
    """Raise for text a tokenizer cannot take or that has nothing to explain: a lone surrogate (not valid
    Unicode), or only white space, control, format (zero-width) or NUL characters (:class:`EmptyTextError`). The
    messages name it ``name`` (``name[index]`` with ``index``)."""
    if not text.isascii():  # (an ASCII text has no surrogate)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidInputError(f"{_named(name, index)} is not valid Unicode: a lone surrogate "
                                    f"{text[exc.start]!r} at character {exc.start}; decode the text with "
                                    "errors='replace' first") from None
    if not any(not ch.isspace() and unicodedata.category(ch) not in _INVISIBLE for ch in text):
        raise EmptyTextError(f"{_named(name, index)} is empty or has only white space, control or zero-width "
                             f"characters ({text[:40]!r}); give a text with something to explain")


def _named(name: str, index: int | None) -> str:
    return name if index is None else f"{name}[{index}]"


_INVISIBLE = {"Cc", "Cf", "Zs", "Zl", "Zp", "Cn"}  # control, format (zero-width), separators, unassigned


def resolve_max_length(max_length, tokenizer, handle: ModelHandle, positions: int | None = ...) -> int:
    """``max_length`` checked against what the model of ``handle`` takes (default: that limit); ``positions``: its
    position table's length where the caller has read it (:attr:`ModelHandle.max_positions`)."""
    limit = max_input_length(tokenizer, handle, positions)
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


def text_ids(tokenizer, text: str, add_special_tokens: bool = True) -> list[int]:
    """``tokenizer(text, add_special_tokens=...)["input_ids"]``; where that call is only its Rust tokenizer's
    encoding (:func:`_plain_encoding`), from the Rust tokenizer without the character offsets nobody reads (a third
    of the time on a long prompt). The caller holds the tokenizer's lock."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if _plain_encoding(tokenizer, backend):
        return backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def _plain_encoding(tokenizer, backend) -> bool:
    """Whether ``tokenizer(text)`` is its backend's ``encode_batch([text])`` as it stands: transformers' own call and
    encoding (no subclass's), no input / target mode, and nothing set on the backend that the call would change first
    (truncation, padding, the splitting of special tokens)."""
    return (backend is not None and _plain_class(type(tokenizer)) and hasattr(backend, "encode_batch_fast")
            and backend.truncation is None and backend.padding is None
            and backend.encode_special_tokens == bool(getattr(tokenizer, "split_special_tokens", False)))


@functools.cache
def _plain_class(kind: type) -> bool:
    """The class's call and encoding are transformers' own (no subclass's), with no input / target mode (read once per
    class: a tokenizer's attributes are slow to read)."""
    return (getattr(kind.__call__, "__qualname__", "") == "PreTrainedTokenizerBase.__call__"
            and getattr(getattr(kind, "_encode_plus", None), "__qualname__", "") == "TokenizersBackend._encode_plus"
            and not hasattr(kind, "_switch_to_input_mode"))


def pad_token_id(tokenizer) -> int | None:
    """The id normx pads batches with: the tokenizer's pad token, else its end-of-sequence token; None if it has
    neither (then texts of different lengths cannot share a batch: :func:`collate` says so)."""
    for value in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if value is not None:
            return int(value)
    return None


def max_input_length(tokenizer, handle: ModelHandle, positions: int | None = ...) -> int:
    """The longest input the model of ``handle`` takes: the tokenizer's limit, capped by the model's position
    table (as its adapter reads it; ``positions``: as the caller has read it)."""
    limits = []
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < _HUGE:
        limits.append(tok_max)
    if positions is ...:
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
        found = backend_encodings(tokenizer, texts, pairs) if set(keep) <= {"token_type_ids"} else None
        batch = tokenizer(texts, pairs, truncation=False, **kwargs) if found is None else None
    out = []
    for i, text in enumerate(texts):
        pair = pairs[i] if pairs is not None else None
        warnings = []
        parts = _from_encoding(found[i], keep) if found is not None else _from_batch(batch, i, keep)
        # the Rust encoding's own token strings: its vocabulary's, as convert_ids_to_tokens reads them (transformers'
        # own class: _plain_encoding), without a second look-up
        tokens = list(found[i].tokens) if found is not None else None
        n = len(parts[0])
        if n > max_length:
            what = f"input {i} has {n} tokens, more than the model's {max_length}"
            if truncation == "error":
                raise InputTooLongError(f"{what}; shorten it, or pass truncation='warn' to truncate it")
            with lock:
                enc = tokenizer([text], None if pair is None else [pair],
                                truncation="longest_first" if pair is not None else True, max_length=max_length,
                                **kwargs)
            parts, tokens = _from_batch(enc, 0, keep), None
            warnings.append(f"{what}: truncated to {max_length} tokens")
        ids, offsets, seq_ids, mask, extra = parts
        warnings.extend(unknown_pieces(tokenizer, ids, offsets, text, pair, seq_ids))
        special, segments = _segments(seq_ids, mask, pair is not None)
        out.append(Encoded(text=text, text_pair=pair, ids=ids, tokens=tokens or vocabulary_names(tokenizer, ids),
                           offsets=offsets, segments=segments, special=special, extra=extra, warnings=warnings))
    return out


def _segments(sequence_ids: list | None, mask: np.ndarray, pair: bool) -> tuple[list[bool], list[int]]:
    """(special, segments) of the tokens whose special-tokens mask is ``mask`` (int64, 1 = special): whether each is a
    special token, and its text (0 = text, 1 = text_pair; -1 = a special token or one of no text), without a Python
    loop over the tokens: a single text's tokens are all of it but the special ones (which alone have no sequence)."""
    special = (mask != 0).tolist()
    if sequence_ids is None:
        return special, [-1] * len(special)
    if not pair:
        return special, (-mask).tolist()
    which = np.array(sequence_ids, dtype=np.float64)  # (None -> nan)
    return special, np.where(np.isnan(which) | (mask != 0), -1, np.nan_to_num(which)).astype(int).tolist()


def backend_encodings(tokenizer, texts: list[str], pairs: list[str] | None) -> list | None:
    """The Rust tokenizer's encodings of ``texts`` (with ``pairs``), special tokens added, where
    ``tokenizer(texts, pairs)`` is only that encoding (:func:`_plain_encoding`); else None. transformers' call around
    it costs more than the encoding of a short text (the demo's case). The caller holds the tokenizer's lock."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not _plain_encoding(tokenizer, backend):
        return None
    if len(texts) == 1:  # (one text: no batch to spread over threads)
        return [backend.encode(texts[0], None if pairs is None else pairs[0], add_special_tokens=True)]
    return backend.encode_batch(list(texts) if pairs is None else list(zip(texts, pairs)), add_special_tokens=True)


def _from_encoding(encoding, keep: list[str]) -> tuple:
    """(ids, offsets, sequence ids, special-tokens mask, extra inputs) of one Rust encoding, as :func:`_from_batch`
    reads them."""
    extra = {"token_type_ids": list(encoding.type_ids)} if "token_type_ids" in keep else {}
    return (list(encoding.ids), list(encoding.offsets), encoding.sequence_ids,
            np.array(encoding.special_tokens_mask, np.int64), extra)


def _from_batch(enc, index: int, keep: list[str]) -> tuple:
    """(ids, offsets, sequence ids, special-tokens mask (an int64 array), extra inputs) of row ``index`` of a
    tokenizer call's output."""
    return (list(enc["input_ids"][index]), [tuple(o) for o in enc["offset_mapping"][index]],
            enc.sequence_ids(index) if enc.encodings else None,
            np.array(enc["special_tokens_mask"][index], np.int64),
            {name: list(enc[name][index]) for name in keep if name in enc})


def unknown_pieces(tokenizer, ids: list[int], offsets: list[tuple[int, int]], text: str, pair: str | None,
                   sequence_ids: list | None) -> list[str]:
    """A warning naming the pieces of the text the tokenizer does not know (they became its unknown token, e.g.
    emoji in a BERT vocabulary), or nothing."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or unk not in ids:
        return []
    pieces = []
    for i, token in enumerate(ids):
        if token == unk:
            source = pair if sequence_ids is not None and sequence_ids[i] == 1 else text
            start, end = offsets[i]
            pieces.append(source[start:end] if source is not None and end > start else "?")
    shown = ", ".join(repr(p if len(p) <= 24 else p[:20] + "…") for p in pieces[:8])
    shown += f" and {len(pieces) - 8} more" if len(pieces) > 8 else ""
    return [f"{len(pieces)} piece(s) of the text are not in the tokenizer's vocabulary and became "
            f"{tokenizer.unk_token}: {shown}; their scores are the unknown token's"]


def warn_user(items: Sequence[Encoded]) -> None:
    """Raise each item's warnings as an :class:`~normx.errors.InputWarning` (Python shows it once per place)."""
    for i, item in enumerate(items):
        for message in item.warnings:
            _warnings.warn(f"text {i}: {message}" if len(items) > 1 else message, InputWarning, stacklevel=3)


def batches(encoded: list[Encoded], batch_size: int, tokenizer, device
            ) -> Iterator[tuple[list[Encoded], dict[str, torch.Tensor]]]:
    """``(items, inputs)`` for every ``batch_size`` consecutive encodings: padded on the right with
    :func:`pad_token_id` (:func:`collate`), on ``device``. (The pad token is looked up only for a batch that needs
    it: reading a tokenizer's special tokens costs more than collating one short text.)"""
    pad_id = None
    for start in range(0, len(encoded), batch_size):
        items = encoded[start:start + batch_size]
        if pad_id is None and any(len(item.ids) != len(items[0].ids) for item in items):
            pad_id = pad_token_id(tokenizer)
        yield items, collate(items, pad_id, device)


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
