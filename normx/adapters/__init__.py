"""Head-on-top adapters, found through a registry keyed by Hugging Face model class name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import UnsupportedModelError
from .base import Adapter, active_module, linear_columns
from .families import builtin_adapters

if TYPE_CHECKING:
    from torch import nn

_REGISTRY: dict[str, Adapter] = builtin_adapters()

__all__ = ["Adapter", "active_module", "get_adapter", "linear_columns", "register_adapter", "registered_adapters",
           "supported_models", "unwrap_model"]


def register_adapter(class_name: str, adapter: Adapter, *, overwrite: bool = False) -> None:
    """Make normx support models of class ``class_name`` (e.g. ``"MyModelForSequenceClassification"``)."""
    if not isinstance(adapter, Adapter):
        raise TypeError(f"adapter must be a normx.adapters.Adapter, got {type(adapter).__name__}")
    if class_name in _REGISTRY and not overwrite:
        raise ValueError(f"an adapter for {class_name!r} is already registered; pass overwrite=True to replace it")
    _REGISTRY[class_name] = adapter


def supported_models() -> list[str]:
    """Class names of the models normx can explain."""
    return sorted(_REGISTRY)


def registered_adapters() -> dict[str, Adapter]:
    """Class name -> adapter, for every supported model class (a copy)."""
    return dict(_REGISTRY)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The transformers model inside a PEFT wrapper (LoRA layers stay injected), or the model itself."""
    if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
        return model.get_base_model()
    return model


def get_adapter(model: nn.Module) -> Adapter:
    """The adapter for ``model`` (PEFT-wrapped or not); :class:`UnsupportedModelError` if there is none."""
    name = type(unwrap_model(model)).__name__
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnsupportedModelError(
            f"normx has no head-on-top adapter for {name}. Supported model classes: "
            + ", ".join(supported_models())
            + ". A bare encoder (e.g. BertModel) has no head to explain: load it with a task head "
            "(AutoModelForSequenceClassification, AutoModelForMaskedLM, AutoModelForCausalLM). To support another "
            "class, describe it with normx.adapters.Adapter and call normx.register_adapter(class_name, adapter)."
        ) from None
