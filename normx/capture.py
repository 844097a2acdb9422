"""Forward-hook capture of module outputs.

All hooks live inside one context manager: they are registered on entry and removed in ``finally`` on exit,
whether the body succeeded or raised. On a clean exit every hooked module must have run, otherwise
:class:`HookNotFiredError` names the modules that did not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from .errors import HookNotFiredError

Transform = Callable[[torch.Tensor], torch.Tensor]


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
    handles = []

    def make_hook(key: str):
        fn = transforms.get(key)

        def hook(_module, _inputs, output):
            tensor = output_tensor(output)
            store[key] = fn(tensor) if fn is not None else tensor

        return hook

    try:
        for key, module in modules.items():
            handles.append(module.register_forward_hook(make_hook(key)))
        yield store
    finally:
        for handle in handles:
            handle.remove()
    missing = [f"{key} ({type(modules[key]).__name__})" for key in modules if key not in store]
    if missing:
        raise HookNotFiredError(
            "these hooked modules never ran during the forward pass: " + ", ".join(missing)
            + ". The model's forward does not go through them, so its adapter points at the wrong modules."
        )
