"""Forward hooks, all through one context manager.

:func:`hooked` registers one forward hook per named module on entry and removes them all in ``finally`` on exit,
whether the body succeeded or raised. On a clean exit every hooked module must have run, otherwise
:class:`HookNotFiredError` names the modules that did not. Everything else here is built on it:

- :func:`capture`: record each module's output tensor (optionally transformed inside the hook, so only what is
  needed is kept);
- :func:`record_calls`: record each module's positional and keyword inputs and its output;
- :func:`replace_outputs`: replace a module's output while active (e.g. Value Zeroing's zeroed value vectors).

Model-wide settings that a method switches for one pass (:func:`eval_mode`, :func:`frozen_parameters`,
:func:`eager_attention`) are context managers here too, restored in ``finally``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .errors import HookNotFiredError

Transform = Callable[[torch.Tensor], torch.Tensor]
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
def hooked(modules: Mapping[str, nn.Module], on_call: OnCall) -> Iterator[None]:
    """Call ``on_call(key, args, kwargs, output)`` after each run of each named module during the ``with`` body; a
    value it returns (not None) replaces the module's output. All hooks are removed on exit; on a clean exit a
    module that never ran raises :class:`HookNotFiredError`."""
    fired: set[str] = set()
    handles = []

    def make_hook(key: str):
        def hook(_module, args, kwargs, output):
            fired.add(key)
            return on_call(key, args, kwargs, output)

        return hook

    try:
        for key, module in modules.items():
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
def capture(modules: Mapping[str, nn.Module], transforms: Mapping[str, Transform] | None = None
            ) -> Iterator[dict[str, torch.Tensor]]:
    """Record the output tensor of each named module during the body of the ``with`` block.

    ``modules`` maps a key of your choice to a module; the yielded dict is filled with ``key -> tensor`` as the
    modules run (the last call wins if a module runs twice). ``transforms`` optionally maps a key to a function
    applied to the tensor inside the hook, so only the transformed (usually much smaller) tensor is kept.
    Nothing is stored for modules that were not asked for.
    """
    transforms = dict(transforms or {})
    store: dict[str, torch.Tensor] = {}

    def on_call(key, _args, _kwargs, output):
        tensor = output_tensor(output)
        fn = transforms.get(key)
        store[key] = fn(tensor) if fn is not None else tensor

    with hooked(modules, on_call):
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
def replace_outputs(module: nn.Module, replace: Callable[[Any], Any]) -> Iterator[None]:
    """While active, ``module``'s output is ``replace(output)``."""
    with hooked({"module": module}, lambda _key, _args, _kwargs, output: replace(output)):
        yield


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Dropout off for the duration; the model's train/eval flags are restored afterwards."""
    training = [module for module in model.modules() if module.training]
    if training:  # (setting every module's flag costs ~ms on big models: only when something is training)
        model.eval()
    try:
        yield
    finally:
        for module in training:
            module.training = True


@contextmanager
def frozen_parameters(model: nn.Module | None) -> Iterator[None]:
    """``requires_grad`` off on every parameter of ``model`` for the duration (restored in ``finally``), so a
    forward pass run inside builds no autograd graph towards the weights: gradients with respect to the inputs
    then cost less time and memory. ``None`` does nothing."""
    trainable = [] if model is None else [p for p in model.parameters() if p.requires_grad]
    try:
        for parameter in trainable:
            parameter.requires_grad_(False)
        yield
    finally:
        for parameter in trainable:
            parameter.requires_grad_(True)


@contextmanager
def eager_attention(model: nn.Module) -> Iterator[None]:
    """Run ``model`` with eager attention (which returns attention probabilities); its setting is restored after."""
    configs = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation_internal"):
            configs[id(config)] = config
    saved = {key: config._attn_implementation_internal for key, config in configs.items()}
    try:
        for config in configs.values():
            config._attn_implementation_internal = "eager"
        yield
    finally:
        for key, config in configs.items():
            config._attn_implementation_internal = saved[key]
