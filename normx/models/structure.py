"""What normx reads of a model's module tree once, kept until the tree changes.

Walking a model's modules on every call (which are in training mode, which blocks to hook) costs more than a small
model's forward pass on a short text, and a 7B decoder has some 400 modules. So such facts are kept per model
(:func:`kept`) and read again once the tree has changed. Two signs of a change, checked on every use: torch calls
its global module-registration hooks for every submodule assigned or registered (``setattr``, ``add_module``,
``register_module``: PEFT's injection and unloading, a user replacing a layer), and the one installed here only
counts those calls into a module of a kept tree (it returns None, so nothing registered is changed; a registration
into any other module, such as the new module list a decoder's forward makes of its blocks' slice on every pass or
a model being built, changes no kept tree); and the containers, whose
children change without a registration (``ModuleList.insert`` and ``Sequential.insert`` write them directly, a
deletion removes one or rebinds the container's dict of children), are compared on each use: each one's dict of
children and their number (a few pairs of integers: a model has a container or two of blocks). A module deleted
from a plain module (``del module.child``) is not seen: it stays among the kept modules, whose training flags are
then read (and switched, for a pass in eval mode) with the rest, which changes nothing the model runs.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from normx._torch import nn

T = TypeVar("T")

_COUNTER = itertools.count(1)
_version = 0  # the number of module registrations seen (in any module tree of the process)
# id(model) -> (a weak reference to the model, its _Tree); the entry goes with the model. Read without the lock (a dict
# read is atomic), written under it
_KEPT: dict[int, tuple[weakref.ref, _Tree]] = {}
_LOCK = threading.Lock()


# every module of a kept tree (the models' own and their submodules), by id: a module class may be unhashable
_KNOWN: dict[int, weakref.ref] = {}


def _registered(module, _name, _submodule) -> None:
    global _version
    known = _KNOWN.get(id(module))
    if known is not None and known() is module:  # a registration into a module no kept tree holds changes none (a
        _version = next(_COUNTER)  # module list a decoder's forward slices, a model being built); (atomic: the GIL)


def _know(module: nn.Module) -> None:
    """Count registrations into ``module`` from now on (its entry goes when it does)."""
    key = id(module)
    known = _KNOWN.get(key)
    if known is None or known() is not module:
        _KNOWN[key] = weakref.ref(module, lambda ref: _KNOWN.pop(key) if _KNOWN.get(key) is ref else None)


_installed: list = []  # the hook's handle, once installed (on first use: importing normx does not import torch)


def tree_version() -> int:
    """A number that changes whenever a submodule is registered into a module of a kept tree (from the first call
    on)."""
    if not _installed:
        with _LOCK:
            if not _installed:
                _installed.append(nn.modules.module.register_module_module_registration_hook(_registered))
    return _version


@dataclass
class _Tree:
    """A model's submodules as last walked, the registration count then, its containers (module lists, sequences
    and dicts) and their children then, and what was made from them."""

    version: int
    modules: tuple
    containers: tuple
    children: list[tuple[int, int]]
    made: dict = field(default_factory=dict)
    dicts: tuple = ()  # the modules' instance dicts, in their order


_CONTAINERS = ("ModuleList", "Sequential", "ModuleDict")


def _containers(model: nn.Module, modules: tuple) -> tuple:
    kinds = tuple(getattr(nn, name) for name in _CONTAINERS)
    return tuple(module for module in (model, *modules) if isinstance(module, kinds))


def _children(containers: tuple) -> list[tuple[int, int]]:
    """Each container's children as (which dict, how many): a deletion from a list or a sequence rebinds its dict, an
    insertion grows it."""
    dicts = [container.__dict__["_modules"] for container in containers]
    return [(id(children), len(children)) for children in dicts]


def _tree(model: nn.Module) -> _Tree:
    version = _version if _installed else tree_version()
    entry = _KEPT.get(id(model))
    if entry is not None and entry[0]() is model:
        tree = entry[1]
        if tree.version == version and tree.children == _children(tree.containers):
            return tree
    modules = _walk(model)
    containers = _containers(model, modules)
    tree = _Tree(version, modules, containers, _children(containers), dicts=tuple(m.__dict__ for m in modules))
    key = id(model)
    with _LOCK:
        for module in (model, *modules):
            _know(module)
        _KEPT[key] = (weakref.ref(model, lambda ref: _KEPT.pop(key) if _KEPT.get(key, (None,))[0] is ref else None),
                      tree)
    return tree


def kept(model: nn.Module, what, make: Callable[[], T]) -> T:
    """``make()`` for ``model`` (``what``: a key naming what it makes), kept while the model lives and its module
    tree stays as it was. ``make`` must read only ``model``'s module tree (not its parameters' values, devices or
    training flags), and what it returns must not hold ``model`` itself (it would never be freed)."""
    made = _tree(model).made
    if what not in made:
        made[what] = make()  # (two threads may both make it: the same value)
    return made[what]


def remember(model: nn.Module, what, value) -> None:
    """Keep ``value`` under ``what`` for ``model`` until its module tree changes, as :func:`kept` keeps what it makes
    (for a fact a caller measured, such as a probe's verdict; it must not hold ``model`` itself)."""
    _tree(model).made[what] = value


def recalled(model: nn.Module, what, default=None):
    """What :func:`remember` or :func:`kept` keeps under ``what`` for ``model`` while its module tree is as it was,
    else ``default``."""
    return _tree(model).made.get(what, default)


def submodules(model: nn.Module) -> tuple[nn.Module, ...]:
    """Every module inside ``model`` (not ``model`` itself: a kept value must not hold its key), each once (a module
    shared across the stack too), read from the instance dicts directly (``model.modules()`` builds every module's
    name), kept until the tree changes."""
    return _tree(model).modules


def module_dicts(model: nn.Module) -> tuple[dict, ...]:
    """The instance dicts of :func:`submodules`, in their order, kept with them: a flag each module keeps there (its
    training mode) is read from them faster than as an attribute (which looks through the module's class first)."""
    return _tree(model).dicts


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
