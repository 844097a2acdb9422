"""Forward hooks, all through one context manager.

:func:`hooked` registers one forward hook per named module on entry and removes them all in ``finally`` on exit,
whether the body succeeded or raised. On a clean exit every hooked module must have run, otherwise
:class:`HookNotFiredError` names the modules that did not. Everything else here is built on it:

- :func:`capture`: record each module's output tensor (optionally transformed inside the hook, so only what is
  needed is kept);
- :func:`record_calls`: record each module's positional and keyword inputs and its output;
- :func:`replace_outputs`: replace a module's output while active (e.g. Value Zeroing's zeroed value vectors).

Hooks are **thread-scoped**: each acts only in the thread that entered the ``with`` block, so threads sharing one
model capture only their own forward passes (another thread's pass through a hooked module runs the hook as a
no-op). Model-wide switches (eval mode, eager attention) are in :mod:`normx.core.concurrency`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from normx._torch import nn, torch
from normx.errors import HookNotFiredError

Transform = "Callable[[torch.Tensor], torch.Tensor]"
# (key, positional inputs, keyword inputs, output) -> None, or a replacement output
OnCall = Callable[[str, tuple, dict, Any], Any]


def output_tensor(output) -> torch.Tensor:
    """The hidden-state tensor of a module output (a tensor, a tuple whose first item is one, or a ModelOutput)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    first = getattr(output, "last_hidden_state", None)
    if isinstance(first, torch.Tensor):
        return first
    raise TypeError(f"cannot find a hidden-state tensor in a module output of type {type(output).__name__}")


@contextmanager
def hooked(modules: Mapping[str, nn.Module], on_call: OnCall, inputs: Collection[str] = ()) -> Iterator[None]:
    """Call ``on_call(key, args, kwargs, output)`` after each run of each named module *in this thread* during the
    ``with`` body; a value it returns (not None) replaces the module's output. For the keys in ``inputs`` it is
    called *before* the module runs instead, with ``output=None``; a dict it returns (not None) replaces the call's
    keyword inputs (:func:`change_inputs`). All hooks are
    removed on exit; on a clean exit a module that never ran (in this thread) raises :class:`HookNotFiredError`."""
    fired: set[str] = set()
    handles = []
    owner = threading.get_ident()

    def make_pre_hook(key: str):
        def hook(_module, args, kwargs=None):
            # a pass in another thread that took its hook list while this hook was being added or removed may call
            # it without kwargs, as (module, args): it is not ours (ours run only between the two)
            if kwargs is not None and threading.get_ident() == owner:
                fired.add(key)
                changed = on_call(key, args, kwargs, None)
                if changed is not None:  # new keyword inputs for this call
                    return args, changed
            return None

        return hook

    def make_hook(key: str):
        def hook(_module, args, *rest):
            # (module, args, kwargs, output); a pass in another thread that took its hook list just before this
            # hook was removed may call it without kwargs, as (module, args, output): it is not ours either way
            if threading.get_ident() != owner:
                return None
            kwargs, output = rest
            fired.add(key)
            return on_call(key, args, kwargs, output)

        return hook

    try:
        for key, module in modules.items():
            if key in inputs:
                handles.append(module.register_forward_pre_hook(make_pre_hook(key), with_kwargs=True))
            else:
                handles.append(module.register_forward_hook(make_hook(key), with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()
    missing = [f"{key} ({type(modules[key]).__name__})" for key in modules if key not in fired]
    if missing:
        raise HookNotFiredError(
            "these hooked modules never ran during the forward pass: " + ", ".join(missing)
            + ". The model's forward does not go through them, so its adapter points at the wrong modules."
        )


@contextmanager
def capture(modules: Mapping[str, nn.Module], transforms: Mapping[str, Transform] | None = None,
            inputs: Collection[str] = (), every_call: Collection[str] = ()) -> Iterator[dict[str, torch.Tensor]]:
    """Record the output tensor of each named module during the body of the ``with`` block.

    ``modules`` maps a key of your choice to a module; the yielded dict is filled with ``key -> tensor`` as the
    modules run (the last call wins if a module runs twice; for the keys in ``every_call``, a list of every call's
    tensor in order). For the keys in ``inputs`` the module's input hidden state is recorded instead (its first
    positional argument, or its ``hidden_states`` keyword; the first call wins). ``transforms`` optionally maps a
    key to a function applied to the tensor inside the hook, so only the transformed (usually much smaller) tensor
    is kept. Nothing is stored for modules that were not asked for.
    """
    transforms = dict(transforms or {})
    store: dict[str, torch.Tensor] = {key: [] for key in every_call}

    def on_call(key, args, kwargs, output):
        if key in inputs:
            if key in store:
                return
            tensor = output_tensor(args[0] if args else kwargs.get("hidden_states"))
        else:
            tensor = output_tensor(output)
        fn = transforms.get(key)
        tensor = fn(tensor) if fn is not None else tensor
        if key in every_call:
            store[key].append(tensor)
        else:
            store[key] = tensor

    with hooked(modules, on_call, inputs):
        yield store


@dataclass
class Call:
    """One recorded module call."""

    args: tuple
    kwargs: dict
    output: Any


@contextmanager
def record_calls(modules: Mapping[str, nn.Module]) -> Iterator[dict[str, Call]]:
    """Record each named module's inputs and output (the last call wins) during the ``with`` body."""
    store: dict[str, Call] = {}

    def on_call(key, args, kwargs, output):
        store[key] = Call(args, kwargs, output)

    with hooked(modules, on_call):
        yield store


@contextmanager
def change_inputs(modules: Mapping[str, nn.Module], change: Callable[[str, tuple, dict], dict]) -> Iterator[None]:
    """While active, each named module runs (in this thread) with the keyword inputs ``change(key, args, kwargs)``
    returns; on a clean exit every module must have run."""
    with hooked(modules, lambda key, args, kwargs, _output: change(key, args, dict(kwargs)), inputs=set(modules)):
        yield


@contextmanager
def replace_outputs(module: nn.Module, replace: Callable[[Any], Any]) -> Iterator[None]:
    """While active, ``module``'s output is ``replace(output)``."""
    with hooked({"module": module}, lambda _key, _args, _kwargs, output: replace(output)):
        yield
