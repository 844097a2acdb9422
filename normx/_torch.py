"""torch, imported on first use: ``from ._torch import F, nn, torch`` in the modules that define methods, so that
registering them (``normx methods``, the CLI's flags) does not import torch; the first attribute read imports it.
Each attribute is then kept on the stand-in, so later reads cost what a module attribute read costs."""

from __future__ import annotations

import importlib


class _OnFirstUse:
    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attribute: str):
        value = getattr(importlib.import_module(self._name), attribute)
        object.__setattr__(self, attribute, value)
        return value

    def __repr__(self) -> str:
        return f"<{self._name}, imported on first use>"


torch = _OnFirstUse("torch")
nn = _OnFirstUse("torch.nn")
F = _OnFirstUse("torch.nn.functional")
