"""What the decoder attention methods read of each block's self-attention: the parts the model's adapter reads
(:meth:`normx.models.Adapter.attention_parts`, :mod:`normx.models.decoder_attention`: the attention module, the
module whose output holds the value vectors and how to cut them per key-value head, the output projection and its
per-head maps W_O^h), with the block's 1-based layer, or :class:`~normx.errors.UnsupportedModelError` naming the
method and what is missing. No projection or layout is named here; whatever the layout,
:mod:`normx.methods.decoder.maps` checks on every pass that the value vectors read, mixed by the captured
probabilities and pushed through the output projection, give the attention module's own output.
"""

from __future__ import annotations

from dataclasses import dataclass

from normx._torch import nn, torch
from normx.errors import InvalidInputError, UnsupportedModelError
from normx.models import Adapter, get_adapter
from normx.models.decoder_attention import ATTENTION_NAMES, AttentionParts, attention_module


def decoder_reason(adapter: Adapter) -> str | None:
    """Why the decoder attention methods cannot read a family (None: they can try; what a block holds is checked on
    the model)."""
    if not adapter.decoder:
        return (f"it reads a left-to-right decoder's self-attention at the last token, and the {adapter.family} "
                f"{adapter.kind} adapter pools its {adapter.pooling} token (not a causal decoder)")
    return None


def decoder_shape(model, adapter: Adapter) -> tuple[int, int]:
    """(blocks, query heads) of a decoder, from its adapter and config."""
    config = getattr(model, "config", None)
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    if not isinstance(heads, int):
        raise UnsupportedModelError(f"{type(model).__name__}'s config gives no number of attention heads")
    return adapter.num_layers(model), heads


def check_response(model, adapter: Adapter, total: int, prompt_length: int, method: str, least: int = 1) -> None:
    """What every reading of a response's rows checks first: a causal decoder, and a prompt of at least ``least``
    tokens followed by at least one response token."""
    reason = decoder_reason(adapter)
    if reason is not None:
        raise UnsupportedModelError(f"{method} does not explain {type(model).__name__}: {reason}")
    if not least <= prompt_length < total:
        raise InvalidInputError(f"{method} needs a prompt of at least {least} token{'s' if least > 1 else ''} and a "
                                f"response, got {prompt_length} of {total} tokens")


@dataclass(frozen=True)
class BlockAttention:
    """One block's self-attention as the methods read it: ``parts`` where the value vectors and the output
    projection are read too, else only the module (its probabilities)."""

    layer: int  # 1-based: block l's attention reads x^(l-1)
    attention: nn.Module
    parts: AttentionParts | None = None

    @property
    def values(self) -> nn.Module | None:
        return None if self.parts is None else self.parts.values

    @property
    def output(self) -> nn.Module | None:
        return None if self.parts is None else self.parts.output

    @property
    def head_dim(self) -> int:
        return 0 if self.parts is None else self.parts.head_dim

    def value_vectors(self, output: torch.Tensor) -> torch.Tensor:
        """The value vectors [B, T, kv heads, head_dim] from the ``values`` module's output."""
        return self.parts.value_vectors(output)

    def head_projections(self, heads: int) -> torch.Tensor:
        """W_O per head [heads, head_dim, hidden] (float32, float64 for float64 models)."""
        return self.parts.head_projections(heads)


def _unsupported(method: str, base: nn.Module, what: str) -> UnsupportedModelError:
    parts = " and its value and output projections" if method != "attention" else ""
    return UnsupportedModelError(f"{method} reads each decoder block's self-attention module "
                                 f"({' / '.join(ATTENTION_NAMES)}){parts}; {type(base).__name__}: {what}")


def block_attention(base: nn.Module, layers: list[int], method: str, values: bool) -> dict[int, BlockAttention]:
    """What ``method`` reads of blocks ``layers`` (1-based) of the (PEFT-unwrapped) decoder ``base``; with
    ``values`` the value vectors and output projection too. :class:`UnsupportedModelError` naming what is missing."""
    adapter = get_adapter(base)
    blocks = adapter.block_modules(base)
    out = {}
    for layer in layers:
        block = blocks[layer - 1]
        parts = adapter.attention_parts(base, block)
        module = parts.module if isinstance(parts, AttentionParts) else attention_module(block)
        if module is None:
            raise _unsupported(method, base, f"block {layer} ({type(block).__name__}) has none")
        if not values:
            out[layer] = BlockAttention(layer, module)
            continue
        if isinstance(parts, str):
            raise _unsupported(method, base, f"block {layer}'s {parts}")
        out[layer] = BlockAttention(layer, module, parts)
    return out
