"""What a check once found of a model, kept per model object: the checks normx runs on a model's first use of
something (an attention reading of a kind, a cut key-value cache of a dtype) and not on every call after.

A :class:`Verdicts` table holds, per live model (weakly: a model dropped takes its entries with it) and per key, the
value a check recorded; one lock makes reading and recording safe from threads that share the model.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Hashable
from typing import Any


class Verdicts:
    """``{model: {key: value}}`` for as long as each model lives (see the module's docstring)."""

    def __init__(self) -> None:
        self._table: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self, model, key: Hashable) -> Any:
        """The value recorded for ``model`` and ``key``, or None (no check has run yet)."""
        with self._lock:
            return self._table.get(model, {}).get(key)

    def record(self, model, key: Hashable, value: Any) -> None:
        with self._lock:
            self._table.setdefault(model, {})[key] = value
