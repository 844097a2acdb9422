"""What :func:`normx.explanations.explain.prepare` resolves, kept per model, tokenizer and arguments.

Checking and resolving a call's arguments (the method and its options, the label space read from the config, the
target columns, the layers) costs more than a small model's forward pass on a short text: a demo or a server that
explains one text at a time pays it on every call. So what it resolves is kept, for each model (its module tree as
:func:`normx.models.structure.kept` keeps it: a changed tree starts afresh), tokenizer and arguments, and used again
only while nothing it was read from has changed:

- the config: a deep copy of its attributes is kept with the entry and compared with them on each use (a user who
  renames a label, or switches ``problem_type``, gets a plan made anew); a config that cannot be copied, or whose
  copy does not compare equal to it (an attribute without ``__eq__``), gets its plan made on every call;
- the tokenizer: the entry holds the tokenizer it was made with and is used for that one only (held, so that its
  identity cannot pass to another tokenizer); what a plan reads of a tokenizer's vocabulary (a vocabulary head's
  target tokens) is not kept at all (``prepare`` gives such a call no key);
- the module tree: kept entries live in the tree's own store, which a changed tree drops.

At most :data:`SIZE` entries per model (the oldest goes first), so that a caller who makes a tokenizer per call
keeps no more than that many alive.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from normx.models.structure import kept

T = TypeVar("T")
SIZE = 16
_SIMPLE = (str, int, float, bool, type(None))
_LOCK = threading.Lock()


@dataclass(frozen=True)
class _Entry:
    tokenizer: object
    config: dict  # a deep copy of vars(config) when the value was made
    value: object


def key_of(*values):
    """A hashable key of call arguments made of strings, numbers, None and lists / tuples / dicts of them (a list
    and a tuple of the same items give one key); None where any is something else (such a call is not kept)."""
    out = []
    for value in values:
        if isinstance(value, _SIMPLE):
            out.append((type(value), value))
        elif isinstance(value, (list, tuple)) and all(isinstance(v, _SIMPLE) for v in value):
            out.append((list, tuple((type(v), v) for v in value)))
        elif isinstance(value, dict) and all(isinstance(v, _SIMPLE) for v in value.values()):
            out.append((dict, tuple(sorted(((k, type(v), v) for k, v in value.items()), key=repr))))
        else:
            return None
    return tuple(out)


def kept_plan(base, tokenizer, key: tuple | None, make: Callable[[], T]) -> T:
    """``make()``, or what it made before for ``base`` (a transformers model), ``tokenizer`` and ``key`` while the
    config and module tree are as they were then. ``key`` None: made afresh, nothing kept. What ``make`` returns must
    not hold ``base`` itself (it would never be freed), and must depend on nothing but the model's config and
    module tree, the tokenizer's identity and what ``key`` names."""
    if key is None:
        return make()
    config = vars(base.config)
    store: OrderedDict = kept(base, "plans", OrderedDict)
    full = (id(tokenizer), key)
    entry = store.get(full)
    if entry is not None and entry.tokenizer is tokenizer and _same(entry.config, config):
        return entry.value
    value = make()
    try:
        snapshot = copy.deepcopy(config)
    except Exception:  # (a config attribute that cannot be copied: the plan is not kept)
        return value
    if not _same(snapshot, config):  # an attribute unequal to its own copy (no __eq__): it would never be used
        return value
    with _LOCK:
        store[full] = _Entry(tokenizer, snapshot, value)
        store.move_to_end(full)
        while len(store) > SIZE:
            store.popitem(last=False)
    return value


def _same(snapshot: dict, config: dict) -> bool:
    try:
        return bool(snapshot == config)
    except Exception:  # (an attribute whose comparison raises: read as changed)
        return False
