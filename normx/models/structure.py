"""What normx reads of a model's module tree once, kept until the tree changes.

Walking a model's modules on every call (which are in training mode, which blocks to hook) costs more than a small
model's forward pass on a short text, and a 7B decoder has some 400 modules. So such facts are kept per model
(:func:`kept`) and read again whenever any module tree in the process has changed since: torch calls its global
module-registration hooks for every submodule assigned or registered (``setattr``, ``add_module``,
``register_module``: construction, PEFT's injection and unloading, a user replacing a layer), and the one
installed here only counts those calls (it returns None, so nothing registered is changed). A tree changed without
torch's registration (writing ``module._modules`` directly) is not seen; nothing in torch, transformers or PEFT
does that.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

from normx._torch import nn

T = TypeVar("T")

_COUNTER = itertools.count(1)
_version = 0  # the number of module registrations seen (in any module tree of the process)
_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {what: (version, value)}
_LOCK = threading.Lock()


def _registered(_module, _name, _submodule) -> None:
    global _version
    _version = next(_COUNTER)  # (next() on a count is atomic under the GIL)


_installed: list = []  # the hook's handle, once installed (on first use: importing normx does not import torch)


def tree_version() -> int:
    """A number that changes whenever a submodule is registered anywhere in the process (from the first call on)."""
    if not _installed:
        with _LOCK:
            if not _installed:
                _installed.append(nn.modules.module.register_module_module_registration_hook(_registered))
    return _version


def kept(model: nn.Module, what, make: Callable[[], T]) -> T:
    """``make()`` for ``model`` (``what``: a key naming what it makes), kept while the model lives and no module tree
    has changed since it was made. ``make`` must read only ``model``'s module tree (not its parameters' values,
    devices or training flags), and what it returns must not hold ``model`` itself (it would never be freed)."""
    version = tree_version()
    with _LOCK:
        found = _KEPT.get(model, {}).get(what)
    if found is not None and found[0] == version:
        return found[1]
    value = make()
    with _LOCK:
        _KEPT.setdefault(model, {})[what] = (version, value)
    return value


def submodules(model: nn.Module) -> tuple[nn.Module, ...]:
    """Every module inside ``model`` (not ``model`` itself: a kept value must not hold its key), each once (a module
    shared across the stack too), read from the instance dicts directly (``model.modules()`` builds every module's
    name), kept (:func:`kept`)."""
    return kept(model, "modules", lambda: _walk(model))


def _walk(model: nn.Module) -> tuple[nn.Module, ...]:
    found, stack, seen = [], list(model.__dict__["_modules"].values()), {id(model)}
    while stack:
        module = stack.pop()
        if module is None or id(module) in seen:  # (a child registered as None)
            continue
        seen.add(id(module))
        found.append(module)
        stack.extend(module.__dict__["_modules"].values())
    return tuple(found)
