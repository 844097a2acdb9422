"""Where a decoder block keeps its self-attention, read from the model's own modules by transformers' conventions:
the attention module (with eager attention its output is ``(output, probabilities)``), the module whose output
holds the value vectors and how to cut them per key-value head, and the output projection.

Four layouts, by the attention module's attribute names:

- ``v_proj`` + ``o_proj`` (Llama, Mistral, Qwen2/3, Gemma, OLMo, Granite, ...; ``out_proj``: OPT, XGLM; ``dense``:
  Phi-1/2): the value projection's output, one ``head_dim`` slice per key-value head; ``v_norm`` where the
  attention has one (its output is the values then);
- ``qkv_proj`` + ``o_proj`` (Phi-3): the fused projection's last ``num_key_value_heads * head_dim`` columns;
- ``c_attn`` + ``c_proj`` (GPT-2): the fused projection's third ``split_size`` block;
- ``query_key_value`` + ``dense`` (GPT-NeoX, Pythia): per head ``[q | k | v]``, the last ``head_size`` of each.

OLMo's ``clip_qkv`` is applied as the model does. Whatever the layout, :mod:`normx.methods.decoder.maps` checks on
every pass that the value vectors read here, mixed by the captured probabilities and pushed through the output
projection, give the attention module's own output: a model that computes its attention differently is refused,
never explained wrongly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from normx._torch import nn, torch
from normx.errors import UnsupportedModelError
from normx.models import Adapter, get_adapter

ATTENTION_NAMES = ("self_attn", "attn", "attention")
OUTPUT_NAMES = ("o_proj", "out_proj", "dense")  # the output projection beside a v_proj
VALUE_LAYOUTS = "v_proj + o_proj / out_proj / dense, qkv_proj + o_proj, c_attn + c_proj or query_key_value + dense"


def decoder_reason(adapter: Adapter) -> str | None:
    """Why the decoder attention methods cannot read a family (None: they can try; what a block holds is checked on
    the model)."""
    if not adapter.decoder:
        return (f"it reads a left-to-right decoder's self-attention at the last token, and the {adapter.family} "
                f"{adapter.kind} adapter pools its {adapter.pooling} token (not a causal decoder)")
    return None


@dataclass(frozen=True)
class BlockAttention:
    """One block's self-attention as the methods read it."""

    layer: int  # 1-based: block l's attention reads x^(l-1)
    attention: nn.Module
    values: nn.Module | None = None  # its output holds the value vectors (None: only probabilities are read)
    output: nn.Module | None = None  # the output projection
    head_dim: int = 0
    cut: Callable[[torch.Tensor], torch.Tensor] | None = None  # values' output [B, T, *] -> [B, T, kv heads, d]

    def value_vectors(self, output: torch.Tensor) -> torch.Tensor:
        """The value vectors [B, T, kv heads, head_dim] from the ``values`` module's output."""
        return self.cut(output)

    def head_projections(self, heads: int) -> torch.Tensor:
        """W_O per head [heads, head_dim, hidden] (float32, float64 for float64 models): the output projection's
        linear part, ``output(I) - output(0)`` of the model's own (possibly LoRA-wrapped) module, so adapters count
        with their effective weights and no bias is attributed to a token."""
        from transformers.pytorch_utils import Conv1D

        output = self.output
        if type(output) is nn.Linear:  # a plain projection: its weight is the linear part ([hidden, heads x d])
            rows = output.weight.t()
        elif type(output) is Conv1D:  # GPT-2's: x @ weight + bias, weight [heads x d, hidden]
            rows = output.weight
        else:  # wrapped (LoRA) or another module: run it on the unit vectors
            weight = next(output.parameters())
            eye = torch.eye(heads * self.head_dim, dtype=weight.dtype, device=weight.device)
            rows = output(eye) - output(torch.zeros_like(eye[:1]))
        rows = rows if rows.dtype == torch.float64 else rows.float()
        return rows.reshape(heads, self.head_dim, -1)


def _unsupported(method: str, base: nn.Module, what: str) -> UnsupportedModelError:
    parts = " and its value and output projections" if method != "attention" else ""
    return UnsupportedModelError(f"{method} reads each decoder block's self-attention module "
                                 f"({' / '.join(ATTENTION_NAMES)}){parts}; {type(base).__name__}: {what}")


def attention_module(block: nn.Module, layer: int, method: str, base: nn.Module) -> nn.Module:
    for name in ATTENTION_NAMES:
        module = getattr(block, name, None)
        if isinstance(module, nn.Module):
            return module
    raise _unsupported(method, base, f"block {layer} ({type(block).__name__}) has none")


def _head_dim(attention: nn.Module) -> int | None:
    for name in ("head_dim", "head_size"):
        value = getattr(attention, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _clipped(attention: nn.Module, cut: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """``cut`` followed by OLMo's clipping of the value states, where the model's config asks for it."""
    clip = getattr(getattr(attention, "config", None), "clip_qkv", None)
    if not clip:
        return cut
    return lambda output: cut(output).clamp(min=-clip, max=clip)


def _layout(attention: nn.Module, d: int) -> tuple[nn.Module, nn.Module, Callable] | None:
    """(values module, output projection, cut) of the first layout the attention module follows, or None."""
    def has(*names: str) -> bool:
        return all(isinstance(getattr(attention, name, None), nn.Module) for name in names)

    def per_head(output: torch.Tensor) -> torch.Tensor:
        return output.reshape(*output.shape[:2], -1, d)

    projection = next((getattr(attention, name) for name in OUTPUT_NAMES if has(name)), None)
    if has("v_proj") and projection is not None:
        if has("v_norm"):  # values normalised per head (Gemma-3n style): the norm's output is what attention mixes
            return attention.v_norm, projection, per_head
        return attention.v_proj, projection, per_head
    if has("qkv_proj", "o_proj"):
        config = attention.config
        start = (config.num_attention_heads + config.num_key_value_heads) * d
        return attention.qkv_proj, attention.o_proj, lambda output: per_head(output[..., start:])
    if has("c_attn", "c_proj") and not getattr(attention, "is_cross_attention", False):
        split = attention.split_size
        return attention.c_attn, attention.c_proj, lambda output: per_head(output[..., 2 * split:3 * split])
    if has("query_key_value", "dense"):
        return attention.query_key_value, attention.dense, \
            lambda output: output.reshape(*output.shape[:2], -1, 3 * d)[..., 2 * d:]
    return None


def block_attention(base: nn.Module, layers: list[int], method: str, values: bool) -> dict[int, BlockAttention]:
    """What ``method`` reads of blocks ``layers`` (1-based) of the (PEFT-unwrapped) decoder ``base``; with
    ``values`` the value vectors and output projection too. :class:`UnsupportedModelError` naming what is missing."""
    blocks = get_adapter(base).block_modules(base)
    out = {}
    for layer in layers:
        block = blocks[layer - 1]
        attention = attention_module(block, layer, method, base)
        if not values:
            out[layer] = BlockAttention(layer, attention)
            continue
        d = _head_dim(attention)
        found = None if d is None else _layout(attention, d)
        if found is None:
            missing = "no head_dim / head_size" if d is None else f"none of {VALUE_LAYOUTS}"
            raise _unsupported(method, base, f"block {layer}'s {type(attention).__name__} has {missing}")
        module, output, cut = found
        out[layer] = BlockAttention(layer, attention, module, output, d, _clipped(attention, cut))
    return out
