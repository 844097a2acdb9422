"""What DecompX reads of a model: whether its family is supported (its adapter's encoder block layout and head
steps), each block's effective float32 weights (LoRA included), and one real forward pass recorded with eager
attention (:func:`record`). The rules that decompose with them are :mod:`normx.methods.decompx.rules`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from normx._torch import nn, torch
from normx.core.concurrency import attention_weights
from normx.core.hooks import record_calls
from normx.errors import UnsupportedModelError
from normx.models import Adapter, active_module, encoder_blocks, encoder_classes, encoder_reason
from normx.models.encoder import BlockLayout, Step
from normx.models.projections import affine

# ---- what DecompX needs of a model: its adapter's encoder block layout and head steps -------------------------


METHOD = "DecompX"


def supported_models() -> list[str]:
    """Class names DecompX can decompose (PEFT-wrapped versions included): those whose adapter describes its
    encoder blocks and its head as steps."""
    return encoder_classes(METHOD, head_steps=True)


def family_reason(adapter: Adapter) -> str | None:
    """Why DecompX cannot read a model family (``Method.supports``); None if it can."""
    return encoder_reason(adapter, METHOD, head_steps=True)


def _unsupported(what: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"DecompX does not support {what}. It supports the BERT-style encoders "
                                 f"(post-LayerNorm blocks): {', '.join(supported_models())} (PEFT-wrapped or not).")


def _check_model(model: nn.Module) -> tuple[nn.Module, Adapter, list[Step], list[nn.Module]]:
    base, adapter = encoder_blocks(model, METHOD, head_steps=True)
    blocks = adapter.block_modules(base)
    for block in blocks:
        missing = adapter.encoder_block.missing(block)
        if missing is not None:
            raise _unsupported(f"{type(base).__name__} blocks of type {type(block).__name__} (no {missing})")
    return base, adapter, adapter.head_steps(base), blocks


# ---- the model's effective weights -----------------------------------------------------------------------------------


def _layer_norm_parameters(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor, float]:
    module = active_module(module)
    if not isinstance(module, nn.LayerNorm):
        raise _unsupported(f"a {type(module).__name__} where DecompX expects an nn.LayerNorm")
    if module.weight is None:  # elementwise_affine=False
        raise _unsupported("a LayerNorm without a learned gain (elementwise_affine=False)")
    weight = module.weight.detach().float()
    bias = torch.zeros_like(weight) if module.bias is None else module.bias.detach().float()
    return weight, bias, float(module.eps)


@dataclass
class BlockWeights:
    """One encoder block's effective float32 weights."""

    heads: int
    value: tuple[torch.Tensor, torch.Tensor]
    attention_out: tuple[torch.Tensor, torch.Tensor]
    ln1: tuple[torch.Tensor, torch.Tensor, float]
    ffn_in: tuple[torch.Tensor, torch.Tensor]
    ffn_out: tuple[torch.Tensor, torch.Tensor]
    ln2: tuple[torch.Tensor, torch.Tensor, float]

    @classmethod
    def of(cls, block: nn.Module, layout: BlockLayout) -> BlockWeights:
        part = layout.parts(block)
        return cls(heads=int(part["attention"].num_attention_heads), value=affine(part["value"]),
                   attention_out=affine(part["attention_out"]), ln1=_layer_norm_parameters(part["ln1"]),
                   ffn_in=affine(part["ffn_in"]), ffn_out=affine(part["ffn_out"]),
                   ln2=_layer_norm_parameters(part["ln2"]))


# ---- the real forward pass -------------------------------------------------------------------------------------------


@dataclass
class Recording:
    """What one forward pass of a batch gives DecompX, per block: attention probabilities [B, heads, T, T], the
    inputs of both LayerNorms [B, T, H], the FFN's pre-activation z and activation f(z) [B, T, I], and the block's
    output x^l [B, T, H]; plus the embedding output x^0 and the attention mask."""

    mask: torch.Tensor
    embeddings: torch.Tensor
    probs: list[torch.Tensor]
    ln1_in: list[torch.Tensor]
    pre_act: list[torch.Tensor]
    act: list[torch.Tensor]
    ln2_in: list[torch.Tensor]
    hidden: list[torch.Tensor]

    def layer(self, layer: int) -> torch.Tensor:
        """x^layer [B, T, H] (0 = embedding output)."""
        return self.embeddings if layer == 0 else self.hidden[layer - 1]


def record(model: nn.Module, inputs: dict[str, torch.Tensor]) -> Recording:
    """Run the (PEFT-unwrapped) model's encoder once on ``inputs`` with eager attention, in eval mode, and record
    what DecompX needs. Hooks are removed on exit, success or not; a hook that never fired is an error."""
    base, adapter, _, blocks = _check_model(model)
    def first(output):
        return output[0] if isinstance(output, (tuple, list)) else output

    def second(output):
        return output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None

    def same(output):
        return output

    outputs = {"x0": (adapter.embedding_module(base, "layer"), first)}
    inputs_of = {}
    for i, block in enumerate(blocks):
        part = adapter.encoder_block.parts(block)
        outputs[f"probs{i}"] = (part["attention"], second)
        outputs[f"z{i}"] = (part["ffn_in"], same)
        outputs[f"a{i}"] = (part["ffn_act"], same)
        outputs[f"h{i}"] = (block, first)
        inputs_of[f"ln1_{i}"] = part["ln1"]
        inputs_of[f"ln2_{i}"] = part["ln2"]
    modules = {**{key: module for key, (module, _) in outputs.items()}, **inputs_of}
    with attention_weights(base), torch.no_grad(), record_calls(modules) as calls:
        base.base_model(**inputs)
    store: dict[str, Any] = {key: pick(calls[key].output) for key, (_, pick) in outputs.items()}
    store.update({key: calls[key].args[0] for key in inputs_of})
    n = len(blocks)
    if any(store[f"probs{i}"] is None for i in range(n)):
        raise UnsupportedModelError(f"{type(base).__name__}'s self-attention returned no attention probabilities "
                                    "under eager attention; DecompX needs them")
    mask = inputs.get("attention_mask")
    if mask is None:
        mask = torch.ones(store["x0"].shape[:2], dtype=torch.long, device=store["x0"].device)
    return Recording(mask=mask, embeddings=store["x0"], probs=[store[f"probs{i}"] for i in range(n)],
                     ln1_in=[store[f"ln1_{i}"] for i in range(n)], pre_act=[store[f"z{i}"] for i in range(n)],
                     act=[store[f"a{i}"] for i in range(n)], ln2_in=[store[f"ln2_{i}"] for i in range(n)],
                     hidden=[store[f"h{i}"] for i in range(n)])
