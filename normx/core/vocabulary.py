"""Tables read once per tokenizer (its vocabulary's tokens, ...) and kept while it lives: reading them per call
would put work that grows with the text on the host beside every forward pass."""

from __future__ import annotations

import threading
import weakref
from operator import itemgetter

_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {what: table, 'size': vocabulary size}
_LOCK = threading.Lock()


def kept_for(tokenizer, what: str, read):
    """``read(size)`` for this tokenizer, kept while the tokenizer lives and its vocabulary size stays."""
    size = len(tokenizer)
    with _LOCK:
        try:
            kept = _TABLES.setdefault(tokenizer, {})
        except TypeError:  # not weakly referenceable
            return read(size)
        if kept.get("size") != size:  # tokens were added: every table is read again
            kept.clear()
            kept["size"] = size
        if what not in kept:
            kept[what] = read(size)
        return kept[what]


def vocabulary_names(tokenizer, ids: list[int]) -> list[str]:
    """``tokenizer.convert_ids_to_tokens(ids)``, from the whole vocabulary's tokens read once per tokenizer."""
    table = kept_for(tokenizer, "tokens", lambda size: tuple(tokenizer.convert_ids_to_tokens(list(range(size)))))
    if not ids:
        return []
    if min(ids) < 0 or max(ids) >= len(table):
        return tokenizer.convert_ids_to_tokens(ids)
    return list(itemgetter(*ids)(table)) if len(ids) > 1 else [table[ids[0]]]
