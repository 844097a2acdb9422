"""A model's identity: what its results were computed with, so that results of two models are never mixed.

Names are not enough (every preset built on one base reports the base's path as ``_name_or_path``); the identity
holds content fingerprints of the weights: the base model's and, for a PEFT model, its adapter's (LoRA weights and
saved heads), each a BLAKE2 hash over every parameter's name, shape, dtype and an evenly spaced sample of its
values (up to :data:`SAMPLE` per tensor: a different fine-tune or adapter changes them; a gigabyte model is
fingerprinted in well under a second).
"""

from __future__ import annotations

import hashlib

from normx.models.modules import unwrap_model

SAMPLE = 4096  # values per tensor in the fingerprint


def model_name(model) -> str:
    """The name a person knows the model by: the preset's name (``normx.load_model("minilm-sst2")``), else the
    path or hub id it was loaded from, else its class."""
    base = unwrap_model(model)
    return str(getattr(model, "normx_name", None) or getattr(base, "normx_name", None)
               or getattr(base.config, "_name_or_path", "") or type(base).__name__)


def model_identity(model) -> dict:
    """``{"name", "class", "dtype", "weights", "adapter"}``: the name (:func:`model_name`), the transformers class,
    the parameters' dtype, and the fingerprints of the base weights and of the PEFT adapter (None without one)."""
    base = unwrap_model(model)
    names = adapter_names(model)
    weights, adapter = hashlib.blake2b(digest_size=12), hashlib.blake2b(digest_size=12)
    count = 0
    dtype = None
    for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
        parts = set(name.split("."))
        if "original_module" in parts:  # PEFT's copy of a head its adapter replaces: unused (and maybe untrained)
            continue
        target = adapter if names & parts else weights
        if target is adapter:
            count += 1
        dtype = dtype or str(param.dtype).removeprefix("torch.")
        _update(target, name if target is adapter else _base_name(name, names), param)
    return {"name": model_name(model), "class": type(base).__name__, "dtype": dtype,
            "weights": weights.hexdigest(), "adapter": adapter.hexdigest() if count else None}


def adapter_names(model) -> set[str]:
    """The names of a PEFT model's adapters (``{"default"}``); empty for a plain model."""
    config = getattr(model, "peft_config", None)
    return set(config) if isinstance(config, dict) else set()


def describe(identity: dict) -> str:
    """One line for messages: ``minilm-sst2 (BertForSequenceClassification, float32, weights 1a2b3c4d, adapter
    5e6f7a8b)``."""
    if not isinstance(identity, dict):
        return str(identity)
    parts = [identity.get("class"), identity.get("dtype")]
    parts += [f"weights {identity['weights'][:8]}" if identity.get("weights") else None,
              f"adapter {identity['adapter'][:8]}" if identity.get("adapter") else None]
    return f"{identity.get('name')} ({', '.join(p for p in parts if p)})"


def _base_name(name: str, adapters: set[str]) -> str:
    """A base parameter's name without PEFT's wrapping (``base_model.model.`` and ``.base_layer``), so that the base
    weights fingerprint the same with and without an adapter."""
    if not adapters:
        return name
    name = name.removeprefix("base_model.model.")
    return name.replace(".base_layer.", ".")


def _update(digest, name: str, param) -> None:
    from normx._torch import torch

    digest.update(f"{name}:{tuple(param.shape)}:{param.dtype};".encode())
    if param.device.type == "meta" or param.numel() == 0:
        return
    flat = param.detach().reshape(-1)
    if flat.numel() > SAMPLE:
        # float32 linspace can round the last index up to numel (49152 x 576 = 28311552): clamped, so the sampled
        # indices of every tensor that fingerprinted before stay the same
        flat = flat[torch.linspace(0, flat.numel() - 1, SAMPLE, device=flat.device).long().clamp_(max=flat.numel() - 1)]
    digest.update(flat.float().cpu().numpy().tobytes())
