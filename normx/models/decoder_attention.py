"""Where a causal decoder block keeps its self-attention, read from the model's own modules by transformers'
conventions: the attention module (with eager attention its output is ``(output, probabilities)``), its query / key /
value projections (separate, or one fused projection and how to cut it), the module whose output holds the value
vectors and how to cut them per key-value head, the output projection (and its per-head maps W_O^h), head counts and
size, scaling, the per-head q / k / v norms and a clip of the projections.

The layouts, by the attention module's attribute names (:data:`LAYOUTS`, tried in order):

- ``v_proj`` + ``o_proj`` / ``out_proj`` / ``dense`` (Llama, Mistral, Qwen2/3, Gemma, OLMo, Granite, ...; OPT,
  XGLM, GPT-J; Phi-1/2): separate projections, one ``head_dim`` slice per head; ``v_norm`` where the attention has
  one (its output is the values then);
- ``qkv_proj`` + ``o_proj`` (Phi-3): one projection, [q | k | v] with ``num_attention_heads`` query and
  ``num_key_value_heads`` key-value heads;
- ``c_attn`` + ``c_proj`` (GPT-2): one Conv1D, [q | k | v] in ``split_size`` blocks;
- ``query_key_value`` + ``dense`` (GPT-NeoX, Pythia): per head ``[q | k | v]``, ``head_size`` each;
- ``Wqkv`` + ``out_proj`` (MPT): one projection, [q | k | v] in three equal blocks.

A clip of the projections' outputs (OLMo's ``config.clip_qkv``, MPT's ``clip_qkv``) is applied to what is cut, as
the model does. A family that keeps its attention otherwise gets a reader of its own (``Adapter.decoder_attention``).
Nothing read here is trusted: whoever uses the parts checks on every pass that they reproduce the attention module's
own output, so a model that computes its attention differently is refused, never explained wrongly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from normx.models.modules import active_module
from normx.models.projections import head_projections

if TYPE_CHECKING:
    import torch
    from torch import nn

ATTENTION_NAMES = ("self_attn", "attn", "attention")
OUTPUT_NAMES = ("o_proj", "out_proj", "dense")  # the output projection beside a v_proj
LAYOUT_NAMES = ("v_proj + o_proj / out_proj / dense, qkv_proj + o_proj, c_attn + c_proj, query_key_value + dense or "
                "Wqkv + out_proj")
Cut = "Callable[[torch.Tensor], torch.Tensor]"


@dataclass(frozen=True)
class AttentionParts:
    """One decoder block's self-attention as the methods read it. ``q`` / ``k`` / ``v`` are the separate
    projections (None where one ``fused`` projection computes them; ``split`` cuts its output [B, T, *] into q, k,
    v [B, T, heads, d]); ``values`` is the module whose output holds the value vectors, ``cut`` takes that output
    to [B, T, kv heads, head_dim] (the clip applied)."""

    module: nn.Module
    output: nn.Module  # the output projection
    values: nn.Module
    cut: Cut
    head_dim: int
    heads: int | None = None  # query heads (None: the config does not say; the probabilities do)
    kv_heads: int | None = None
    q: nn.Module | None = None
    k: nn.Module | None = None
    v: nn.Module | None = None
    fused: nn.Module | None = None
    split: Callable | None = None
    q_norm: nn.Module | None = None
    k_norm: nn.Module | None = None
    v_norm: nn.Module | None = None
    scaling: float | None = None
    clip: float | None = None
    names: dict[str, str] | None = None  # role -> the attribute name in the module, for messages

    @property
    def linear_values(self) -> bool:
        """The values are an affine map of the attention's input (no value norm, no clip)."""
        return self.v_norm is None and not self.clip

    @property
    def separate(self) -> bool:
        """Separate query / key / value / output projections."""
        return self.q is not None and self.k is not None and self.v is not None

    def value_vectors(self, output: torch.Tensor) -> torch.Tensor:
        """The value vectors [B, T, kv heads, head_dim] from the ``values`` module's output."""
        return self.cut(output)

    def head_projections(self, heads: int | None = None) -> torch.Tensor:
        """W_O per head [heads, head_dim, hidden] (:func:`normx.models.projections.head_projections`)."""
        return head_projections(self.output, heads or self.heads, self.head_dim)

    def query_key_sources(self) -> dict[str, nn.Module] | None:
        """The modules whose outputs hold the queries and keys: ``{"q": ..., "k": ...}`` (separate projections) or
        ``{"qkv": ...}`` (one fused projection), or None where neither is read."""
        if self.q is not None and self.k is not None:
            return {"q": self.q, "k": self.k}
        if self.fused is not None and self.split is not None:
            return {"qkv": self.fused}
        return None

    def queries_keys(self, outputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(queries [B, T, heads, head_dim], keys [B, T, kv heads, head_dim]) from the outputs of
        :meth:`query_key_sources` (the clip applied; the q / k norms and rotary embeddings not)."""
        if "qkv" in outputs:
            q, k, _ = self.split(outputs["qkv"])
        else:
            q, k = _per_head(self.head_dim)(outputs["q"]), _per_head(self.head_dim)(outputs["k"])
        if self.clip:
            q, k = q.clamp(min=-self.clip, max=self.clip), k.clamp(min=-self.clip, max=self.clip)
        return q, k

    def name(self, role: str) -> str:
        """The attribute name of a part (``"q"``, ``"o"``, ``"qkv"``, ...) in its module, for messages."""
        return (self.names or {}).get(role, role)


def attention_module(block: nn.Module) -> nn.Module | None:
    """The block's self-attention module (``self_attn`` / ``attn`` / ``attention``), or None."""
    from torch import nn

    for name in ATTENTION_NAMES:
        module = getattr(active_module(block), name, None)
        if isinstance(module, nn.Module):
            return module
    return None


def _child(module: nn.Module, name: str) -> nn.Module | None:
    from torch import nn

    found = getattr(module, name, None)
    return found if isinstance(found, nn.Module) else None


def _number(*values) -> Any:
    return next((v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v), None)


def _heads(attention: nn.Module, config) -> tuple[int | None, int | None]:
    config = getattr(attention, "config", None) or config
    heads = _number(*(getattr(config, name, None) for name in ("num_attention_heads", "n_head", "n_heads")),
                    getattr(attention, "num_heads", None), getattr(attention, "n_heads", None))
    kv = _number(getattr(config, "num_key_value_heads", None), getattr(attention, "num_key_value_heads", None))
    return heads, kv or heads


def _per_head(d: int):
    return lambda output: output.reshape(*output.shape[:2], -1, d)


def _thirds(output: torch.Tensor, starts: tuple[int, int, int, int], d: int) -> tuple:
    a, b, c, e = starts
    return tuple(output[..., lo:hi].reshape(*output.shape[:2], -1, d) for lo, hi in ((a, b), (b, c), (c, e)))


def _separate(attention, d, heads, kv) -> dict | None:
    output = next(((name, _child(attention, name)) for name in OUTPUT_NAMES if _child(attention, name) is not None),
                  None)
    v = _child(attention, "v_proj")
    if v is None or output is None:
        return None
    v_norm = _child(attention, "v_norm")  # values normalised per head (Gemma-3n style): the norm's output is mixed
    return dict(output=output[1], values=v if v_norm is None else v_norm, cut=_per_head(d),
                q=_child(attention, "q_proj"), k=_child(attention, "k_proj"), v=v, v_norm=v_norm,
                names={"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": output[0]})


def _phi3(attention, d, heads, kv) -> dict | None:
    fused, output = _child(attention, "qkv_proj"), _child(attention, "o_proj")
    if fused is None or output is None or not heads or not kv:
        return None
    starts = (0, heads * d, (heads + kv) * d, (heads + 2 * kv) * d)
    return dict(output=output, values=fused, cut=lambda out: _per_head(d)(out[..., starts[2]:]), fused=fused,
                split=lambda out: _thirds(out, starts, d), names={"qkv": "qkv_proj", "o": "o_proj"})


def _gpt2(attention, d, heads, kv) -> dict | None:
    fused, output = _child(attention, "c_attn"), _child(attention, "c_proj")
    if fused is None or output is None or getattr(attention, "is_cross_attention", False):
        return None
    split = attention.split_size
    starts = (0, split, 2 * split, 3 * split)
    return dict(output=output, values=fused, cut=lambda out: _per_head(d)(out[..., 2 * split:3 * split]),
                fused=fused, split=lambda out: _thirds(out, starts, d), names={"qkv": "c_attn", "o": "c_proj"})


def _neox(attention, d, heads, kv) -> dict | None:
    fused, output = _child(attention, "query_key_value"), _child(attention, "dense")
    if fused is None or output is None:
        return None

    def split(out):
        per_head = out.reshape(*out.shape[:2], -1, 3 * d)
        return per_head[..., :d], per_head[..., d:2 * d], per_head[..., 2 * d:]

    return dict(output=output, values=fused, cut=lambda out: out.reshape(*out.shape[:2], -1, 3 * d)[..., 2 * d:],
                fused=fused, split=split, names={"qkv": "query_key_value", "o": "dense"})


def _mpt(attention, d, heads, kv) -> dict | None:
    fused, output = _child(attention, "Wqkv"), _child(attention, "out_proj")
    if fused is None or output is None:
        return None

    def split(out):
        return tuple(part.reshape(*out.shape[:2], -1, d) for part in out.chunk(3, dim=-1))

    return dict(output=output, values=fused, cut=lambda out: split(out)[2], fused=fused, split=split,
                names={"qkv": "Wqkv", "o": "out_proj"})


# the layouts by the attention module's attribute names, tried in order: (attention, head_dim, heads, kv heads) ->
# the parts of AttentionParts that differ between layouts, or None where the module does not follow the layout
LAYOUTS = (_separate, _phi3, _gpt2, _neox, _mpt)


def _clipped(cut, clip):
    if not clip:
        return cut
    return lambda output: cut(output).clamp(min=-clip, max=clip)


def read_block_attention(block: nn.Module, config=None) -> AttentionParts | str:
    """The parts of ``block``'s self-attention module (:func:`attention_module`, :func:`read_attention`), or why
    they cannot be read."""
    attention = attention_module(block)
    if attention is None:
        return f"{type(active_module(block)).__name__} has no {' / '.join(ATTENTION_NAMES)} module"
    return read_attention(attention, config)


def read_attention(attention: nn.Module, config=None) -> AttentionParts | str:
    """``attention``'s parts by transformers' conventions (:data:`LAYOUTS`), or why they cannot be read (a
    sentence naming what is missing). ``config`` is the model's (text) config, where the module keeps none."""
    attention = active_module(attention)
    d = _number(getattr(attention, "head_dim", None), getattr(attention, "head_size", None))
    if not isinstance(d, int):
        return f"{type(attention).__name__} has no head_dim / head_size"
    heads, kv = _heads(attention, config)
    found = next((parts for layout in LAYOUTS if (parts := layout(attention, d, heads, kv)) is not None), None)
    if found is None:
        return f"{type(attention).__name__} has none of {LAYOUT_NAMES}"
    clip = _number(getattr(getattr(attention, "config", None), "clip_qkv", None), getattr(attention, "clip_qkv", None))
    scaling = _number(getattr(attention, "scaling", None))
    found["cut"] = _clipped(found["cut"], clip)
    return AttentionParts(attention, head_dim=d, heads=heads, kv_heads=kv, q_norm=_child(attention, "q_norm"),
                          k_norm=_child(attention, "k_norm"), scaling=None if scaling is None else float(scaling),
                          clip=clip, **found)
