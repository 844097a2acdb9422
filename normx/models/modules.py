"""Reaching into a model's modules: dotted paths, PEFT wrappers (the model inside, the active copy of a saved module)
and linear layers read at a few output columns. No model family is named here."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

ModuleRef = "str | Callable[[nn.Module], nn.Module]"


def unwrap_model(model: nn.Module) -> nn.Module:
    """The transformers model inside a PEFT wrapper (LoRA layers stay injected), or the model itself."""
    # (the class is asked first: a module's missing attribute costs an exception in nn.Module.__getattr__)
    if hasattr(type(model), "get_base_model") and hasattr(model, "peft_config"):
        return model.get_base_model()
    return model


def resolve(model: nn.Module, ref: ModuleRef) -> nn.Module:
    if callable(ref) and not isinstance(ref, str):
        return ref(model)
    obj = model
    for part in ref.split("."):
        children = getattr(obj, "__dict__", {}).get("_modules")  # a submodule directly, not through __getattr__
        direct = children is not None and part in children and not hasattr(type(obj), part)
        obj = children[part] if direct else getattr(obj, part)
    return obj


def first_parameter(model: nn.Module):
    """``next(model.parameters(), None)`` without building every module's name: the first module in that order
    (depth first, a module before its children) with a parameter gives it."""
    stack = [model]
    while stack:
        module = stack.pop()
        for param in module.__dict__["_parameters"].values():
            if param is not None:
                return param
        stack.extend(reversed([child for child in module.__dict__["_modules"].values() if child is not None]))
    return None


def active_module(module: nn.Module) -> nn.Module:
    """The module that actually runs: unwraps PEFT's ``ModulesToSaveWrapper`` to the active adapter's copy."""
    if hasattr(module, "modules_to_save") and hasattr(module, "original_module"):
        if getattr(module, "disable_adapters", False):
            return module.original_module
        names = getattr(module, "active_adapters", None) or [getattr(module, "active_adapter", None)]
        for name in names:
            if name in module.modules_to_save:
                return module.modules_to_save[name]
        return module.original_module
    return module


def linear_columns(layer: nn.Module, x: torch.Tensor, columns: torch.Tensor | None) -> torch.Tensor:
    """``layer(x)[..., columns]`` without computing the other columns when ``layer`` is a plain Linear."""
    import torch.nn.functional as F
    from torch import nn

    layer = active_module(layer)
    if columns is None:
        return layer(x)
    if type(layer) is nn.Linear:
        bias = None if layer.bias is None else layer.bias[columns]
        return F.linear(x, layer.weight[columns], bias)
    # A wrapped layer (e.g. LoRA on the LM head) must run whole so its adapter applies.
    return layer(x)[..., columns]
