"""Head-on-top adapters, found through a registry keyed by Hugging Face model class name."""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

from normx.errors import UnsupportedModelError
from normx.models.adapter import Adapter
from normx.models.discovery import NotDiscovered, discover
from normx.models.families import builtin_adapters
from normx.models.modules import unwrap_model

if TYPE_CHECKING:
    from torch import nn

_REGISTRY: dict[str, Adapter] = builtin_adapters()
_DISCOVERED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its discovered adapter
_GUARD = threading.Lock()


def register_adapter(class_name: str, adapter: Adapter, *, overwrite: bool = False) -> None:
    """Make normx support models of class ``class_name`` (e.g. ``"MyModelForSequenceClassification"``)."""
    if not isinstance(adapter, Adapter):
        raise TypeError(f"adapter must be a normx.models.Adapter, got {type(adapter).__name__}")
    if class_name in _REGISTRY and not overwrite:
        raise ValueError(f"an adapter for {class_name!r} is already registered; pass overwrite=True to replace it")
    _REGISTRY[class_name] = adapter


def supported_models() -> list[str]:
    """Class names with a registered adapter. Other architectures are discovered on first use
    (:func:`get_adapter`); ``normx supported`` lists what was verified of transformers' architectures."""
    return sorted(_REGISTRY)


def registered_adapters() -> dict[str, Adapter]:
    """Class name -> adapter, for every supported model class (a copy)."""
    return dict(_REGISTRY)


def get_adapter(model: nn.Module) -> Adapter:
    """The adapter for ``model`` (PEFT-wrapped or not): the one registered for its class, else one discovered from
    its conventions (:mod:`normx.models.discovery`); :class:`UnsupportedModelError` with the reason if neither.
    An adapter is checked against the model's own outputs before normx explains with it
    (:func:`normx.core.verify.verified_adapter`)."""
    base = unwrap_model(model)
    name = type(base).__name__
    if name in _REGISTRY:
        return _REGISTRY[name]
    with _GUARD:
        found = _DISCOVERED.get(base)
    if found is not None:
        return found
    try:
        found = discover(base)
    except NotDiscovered as exc:
        raise UnsupportedModelError(
            f"normx cannot explain {name}: {exc}. A bare encoder (e.g. BertModel) has no head to explain: load it "
            "with a task head (AutoModelForSequenceClassification, AutoModelForMaskedLM, AutoModelForCausalLM). "
            "To support it, describe it with normx.models.Adapter and call normx.register_adapter(class_name, "
            f"adapter). Registered classes: {', '.join(supported_models())}"
        ) from None
    with _GUARD:
        _DISCOVERED[base] = found
    return found


def encoder_reason(adapter: Adapter, methods: str, head_steps: bool = False) -> str | None:
    """Why ``methods`` (named in the message), which decompose post-LayerNorm BERT-style encoder blocks (and, with
    ``head_steps``, the head as steps), cannot read a family; ``None`` if its adapter describes what they need."""
    if adapter.encoder_block is None or (head_steps and adapter.head_steps is None):
        return (f"{methods} decompose post-LayerNorm BERT-style encoder blocks{' and their heads' * head_steps}, "
                f"which the {adapter.family} {adapter.kind} adapter does not describe")
    return None


def encoder_classes(methods: str, head_steps: bool = False) -> list[str]:
    """Class names whose adapters :func:`encoder_reason` accepts."""
    return sorted(n for n, a in _REGISTRY.items() if encoder_reason(a, methods, head_steps) is None)


def encoder_blocks(model: nn.Module, methods: str, head_steps: bool = False) -> tuple[nn.Module, Adapter]:
    """``(the transformers model, its adapter)`` for ``methods`` that decompose post-LayerNorm BERT-style encoder
    blocks (see :func:`encoder_reason`); :class:`UnsupportedModelError` naming the supported classes otherwise, or
    for an encoder configured as a decoder."""
    base = unwrap_model(model)
    name = type(base).__name__
    adapter = get_adapter(base)
    if encoder_reason(adapter, methods, head_steps) is not None:
        raise UnsupportedModelError(
            f"{methods} decompose post-LayerNorm BERT-style encoder blocks and do not support {name}. Supported "
            f"model classes (PEFT-wrapped or not): {', '.join(encoder_classes(methods, head_steps))}")
    config = base.config
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        raise UnsupportedModelError(f"this {name} is configured as a decoder (is_decoder / add_cross_attention); "
                                    f"{methods} support bidirectional encoders only")
    return base, adapter
