"""How a causal decoder block is wired, read from transformers' naming conventions, for the methods that decompose a
decoder's residual stream (decoder DecompX): which norms surround the attention and the MLP, how the residual
branches are added, and how the MLP computes.

Block styles (``DecoderBlock.style``), with n1 / n2 the norms before the attention / MLP and p1 / p2 the norms
applied to their outputs:

- ``"pre"``: h = x + attn(n1(x)); out = h + mlp(n2(h)) (Llama, Mistral, Qwen2/3, Gemma 1, Phi-3, OLMo 1, Granite,
  GPT-2, GPT-NeoX without parallel residual, ...): ``input_layernorm`` + ``post_attention_layernorm`` (GPT-2:
  ``ln_1`` + ``ln_2``; VaultGemma: ``input_layernorm`` + ``pre_feedforward_layernorm``);
- ``"sandwich"``: h = x + p1(attn(n1(x))); out = h + p2(mlp(n2(h))) (Gemma 2 / 3): ``input_layernorm``,
  ``post_attention_layernorm``, ``pre_feedforward_layernorm``, ``post_feedforward_layernorm`` (GLM-4:
  ``input_layernorm``, ``post_self_attn_layernorm``, ``post_attention_layernorm``, ``post_mlp_layernorm``);
- ``"post"``: h = x + p1(attn(x)); out = h + p2(mlp(h)) (OLMo 2 / 3): ``post_attention_layernorm`` +
  ``post_feedforward_layernorm`` and no input norm;
- ``"parallel"``: out = x + attn(n1(x)) + mlp(n2(x)) (GPT-NeoX / Pythia with ``use_parallel_residual``);
- ``"parallel_shared"``: out = x + attn(n1(x)) + mlp(n1(x)) (Phi-1/2, Cohere): one ``input_layernorm``.

A ``residual_multiplier`` on the block (Granite) scales both branches. MLP layouts (:class:`MLPLayout`): gated
(``gate_proj`` / ``up_proj`` / ``down_proj`` + ``act_fn``: act(gate(y)) * up(y)), fused gated (``gate_up_proj`` +
``down_proj``: the first half of the fused output is the gate, as Phi-3 chunks it) and plain (``c_fc`` / ``c_proj``,
``fc1`` / ``fc2``, ``dense_h_to_4h`` / ``dense_4h_to_h``, ``fc_in`` / ``fc_out``, with the activation module beside).

This module only names the parts. Whoever uses them checks on every pass that the parts, recombined as the style
says, reproduce the block's own output, so a block whose forward does something else is refused, never
decomposed wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from normx.models.modules import active_module

if TYPE_CHECKING:
    from torch import nn

STYLES = ("pre", "sandwich", "post", "parallel", "parallel_shared")
_ATTENTION = ("self_attn", "attn", "attention")
_MLP = ("mlp", "feed_forward")
_ACTIVATIONS = ("act_fn", "act", "activation_fn", "activation")
_PLAIN = (("c_fc", "c_proj"), ("fc1", "fc2"), ("dense_h_to_4h", "dense_4h_to_h"), ("fc_in", "fc_out"))
KNOWN_LAYOUTS = ("input_layernorm / ln_1 (+ post_attention_layernorm / ln_2, pre/post_feedforward_layernorm), a "
                 "self_attn / attn / attention module and an mlp / feed_forward module")


@dataclass(frozen=True)
class MLPLayout:
    """A decoder MLP's parts: ``kind`` is ``"gated"`` (act(gate(y)) * up(y) -> down), ``"fused"`` (gate and up
    from one projection, gate first) or ``"plain"`` (act(up(y)) -> down); ``names`` are the parts' attribute names
    in the MLP module (``"gate"``, ``"up"``, ``"down"``, ``"act"``), for messages."""

    kind: str
    up: nn.Module  # gated: up_proj; fused: gate_up_proj; plain: the first projection
    down: nn.Module
    activation: nn.Module
    gate: nn.Module | None = None  # gated only
    names: dict[str, str] | None = None

    def name(self, role: str) -> str:
        return (self.names or {}).get(role, role)


@dataclass(frozen=True)
class DecoderBlock:
    """One decoder block's wiring (see the module docstring for the styles)."""

    style: str
    attention: nn.Module
    mlp: nn.Module
    mlp_layout: MLPLayout
    attention_norm: nn.Module | None = None  # n1
    mlp_norm: nn.Module | None = None  # n2 (the same module as n1 in "parallel_shared")
    attention_post: nn.Module | None = None  # p1
    mlp_post: nn.Module | None = None  # p2
    residual_scale: float = 1.0  # Granite's residual_multiplier

    def norms(self) -> dict[str, nn.Module]:
        """The block's norms by role, each module once."""
        roles = {"attention_norm": self.attention_norm, "mlp_norm": self.mlp_norm,
                 "attention_post": self.attention_post, "mlp_post": self.mlp_post}
        out, seen = {}, set()
        for role, module in roles.items():
            if module is not None and id(module) not in seen:
                seen.add(id(module))
                out[role] = module
        return out


def _child(module: nn.Module, names) -> nn.Module | None:
    from torch import nn

    for name in names:
        found = getattr(module, name, None)
        if isinstance(found, nn.Module):
            return found
    return None


def mlp_layout(mlp: nn.Module) -> MLPLayout | str:
    """The MLP's layout, or why it has none this module knows."""
    mlp = active_module(mlp)
    act = next((name for name in _ACTIVATIONS if _child(mlp, (name,)) is not None), None)
    if act is None:
        return f"its {type(mlp).__name__} has no activation module ({' / '.join(_ACTIVATIONS)})"
    activation = _child(mlp, (act,))
    gate, up, down = (_child(mlp, (name,)) for name in ("gate_proj", "up_proj", "down_proj"))
    if gate is not None and up is not None and down is not None:
        return MLPLayout("gated", up, down, activation, gate,
                         {"gate": "gate_proj", "up": "up_proj", "down": "down_proj", "act": act})
    fused = _child(mlp, ("gate_up_proj",))
    if fused is not None and down is not None:
        return MLPLayout("fused", fused, down, activation,
                         names={"up": "gate_up_proj", "down": "down_proj", "act": act})
    for first, second in _PLAIN:
        up, down = _child(mlp, (first,)), _child(mlp, (second,))
        if up is not None and down is not None:
            return MLPLayout("plain", up, down, activation, names={"up": first, "down": second, "act": act})
    return (f"its {type(mlp).__name__} has none of gate_proj + up_proj + down_proj, gate_up_proj + down_proj, "
            f"{', '.join(' + '.join(pair) for pair in _PLAIN)}")


def block_mlp(block: nn.Module) -> nn.Module | None:
    """The block's MLP module (``mlp`` / ``feed_forward``), or None."""
    return _child(active_module(block), _MLP)


def decoder_block(block: nn.Module) -> DecoderBlock | str:
    """How ``block`` is wired, or why it cannot be read (a sentence naming what is missing)."""
    block = active_module(block)
    name = type(block).__name__
    attention, mlp = _child(block, _ATTENTION), _child(block, _MLP)
    if attention is None or mlp is None:
        return f"its block {name} has no {'attention' if attention is None else 'MLP'} module ({KNOWN_LAYOUTS})"
    layout = mlp_layout(mlp)
    if isinstance(layout, str):
        return layout
    n1 = _child(block, ("input_layernorm", "ln_1"))
    n2 = _child(block, ("post_attention_layernorm", "ln_2"))
    pre_ff, post_ff = _child(block, ("pre_feedforward_layernorm",)), _child(block, ("post_feedforward_layernorm",))
    post_attention, post_mlp = _child(block, ("post_self_attn_layernorm",)), _child(block, ("post_mlp_layernorm",))
    scale = getattr(block, "residual_multiplier", 1.0)
    scale = float(scale) if isinstance(scale, (int, float)) else 1.0
    parts = dict(attention=attention, mlp=mlp, mlp_layout=layout, residual_scale=scale)
    if post_attention is not None or post_mlp is not None:  # GLM-4: n2 is post_attention_layernorm, before the MLP
        if n1 is None or n2 is None or post_attention is None or post_mlp is None or pre_ff is not None:
            return f"its block {name} has a combination of norms no known style has ({KNOWN_LAYOUTS})"
        return DecoderBlock("sandwich", attention_norm=n1, attention_post=post_attention, mlp_norm=n2,
                            mlp_post=post_mlp, **parts)
    if n1 is not None and n2 is None and pre_ff is not None and post_ff is None:  # VaultGemma
        return DecoderBlock("pre", attention_norm=n1, mlp_norm=pre_ff, **parts)
    if n1 is not None and n2 is not None and pre_ff is not None and post_ff is not None:
        return DecoderBlock("sandwich", attention_norm=n1, attention_post=n2, mlp_norm=pre_ff, mlp_post=post_ff,
                            **parts)
    if n1 is None and n2 is not None and post_ff is not None and pre_ff is None:
        return DecoderBlock("post", attention_post=n2, mlp_post=post_ff, **parts)
    if n1 is not None and n2 is not None and pre_ff is None and post_ff is None:
        style = "parallel" if getattr(block, "use_parallel_residual", False) is True else "pre"
        return DecoderBlock(style, attention_norm=n1, mlp_norm=n2, **parts)
    if n1 is not None and n2 is None and pre_ff is None and post_ff is None:
        return DecoderBlock("parallel_shared", attention_norm=n1, mlp_norm=n1, **parts)
    return f"its block {name} has a combination of norms no known style has ({KNOWN_LAYOUTS})"
