"""What AttnLRP reads of a causal decoder: every normalisation module, and per block the self-attention's separate
query / key / value / output projections (with the per-head q / k norms where the attention has them), its head size
and scaling, and the gated MLP's gate / up / down projections and activation module (Llama, Mistral, Qwen2/3, Gemma,
OLMo 2, Granite, ...), as the model's adapter reads them (:meth:`normx.models.Adapter.attention_parts`,
:func:`normx.models.decoder.mlp_layout`).

This module only collects the parts; :mod:`normx.methods.decoder.lrp.context` checks on every pass that the parts,
recombined as the rules recompute them, give each module's own output, so a model that computes differently is
refused (:class:`~normx.errors.UnsupportedModelError`), never explained with the wrong rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from normx._torch import nn
from normx.errors import UnsupportedModelError
from normx.models import active_module, get_adapter
from normx.models.decoder import MLPLayout, block_mlp, mlp_layout
from normx.models.decoder_attention import ATTENTION_NAMES, AttentionParts

LAYOUT = (f"a {' / '.join(ATTENTION_NAMES)} module with separate query, key, value and output projections (and a "
          "head size and scaling), and an mlp / feed_forward module with gate, up and down projections and an "
          "activation module")


@dataclass(frozen=True)
class BlockParts:
    """One decoder block's modules as AttnLRP reads them (``layer`` is 1-based)."""

    layer: int
    attention: nn.Module
    q: nn.Module
    k: nn.Module
    v: nn.Module
    o: nn.Module
    q_norm: nn.Module | None
    k_norm: nn.Module | None
    head_dim: int
    scaling: float
    mlp: nn.Module
    gate: nn.Module
    up: nn.Module
    down: nn.Module
    act: nn.Module
    attention_parts: AttentionParts | None = None  # as the adapter read them (names for messages)
    mlp_layout: MLPLayout | None = None

    def name(self, role: str) -> str:
        """A part's attribute name in the model (``"o"``: the attention's output projection; ``"gate"``, ``"up"``,
        ``"down"``, ``"act"``: the MLP's), for messages."""
        read = self.mlp_layout if role in ("gate", "up", "down", "act") else self.attention_parts
        return role if read is None else read.name(role)


@dataclass(frozen=True)
class ModelParts:
    """Every block's parts and every normalisation module (by its path in the model) of one decoder."""

    blocks: list[BlockParts]
    norms: dict[str, nn.Module]


def _refuse(method: str, base: nn.Module, what: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{method} recomputes each decoder block from {LAYOUT}; {type(base).__name__}: {what}")


def _block(block: nn.Module, layer: int, method: str, base: nn.Module) -> BlockParts:
    parts = get_adapter(base).attention_parts(base, block)
    if isinstance(parts, str):
        raise _refuse(method, base, f"block {layer}'s {parts}")
    name = type(parts.module).__name__
    if not parts.separate:
        raise _refuse(method, base, f"block {layer}'s {name} has no separate query, key and value projections "
                      f"(a fused projection: {parts.name('qkv')})")
    if parts.scaling is None:
        raise _refuse(method, base, f"block {layer}'s {name} has no integer head_dim and numeric scaling")
    mlp = block_mlp(block)
    if mlp is None:
        raise _refuse(method, base, f"block {layer} ({type(block).__name__}) has no mlp / feed_forward module")
    layout = mlp_layout(mlp)
    if isinstance(layout, str) or layout.kind != "gated":
        what = layout if isinstance(layout, str) else f"its {type(active_module(mlp)).__name__} is a {layout.kind} MLP"
        raise _refuse(method, base, f"block {layer}: {what} (not a gated MLP, or a fused gate and up projection)")
    return BlockParts(layer, parts.module, parts.q, parts.k, parts.v, parts.output, parts.q_norm, parts.k_norm,
                      parts.head_dim, parts.scaling, active_module(mlp), layout.gate, layout.up, layout.down,
                      layout.activation, parts, layout)


def is_norm(module: nn.Module) -> bool:
    """A normalisation module: a leaf (no child modules) whose class name says so (RMSNorm, LayerNorm, ...)."""
    return "norm" in type(module).__name__.lower() and next(module.children(), None) is None


def _idle(base: nn.Module) -> set[int]:
    """The modules that never run: PEFT's saved copies (``modules_to_save``) other than the active one."""
    idle = set()
    for module in base.modules():
        if hasattr(module, "modules_to_save") and hasattr(module, "original_module"):
            live = {id(inner) for inner in active_module(module).modules()}
            idle |= {id(inner) for inner in module.modules() if inner is not module and id(inner) not in live}
    return idle


def model_parts(base: nn.Module, method: str) -> ModelParts:
    """The parts of the (PEFT-unwrapped) decoder ``base``; :class:`UnsupportedModelError` naming what is missing.
    Each block must have modules of its own (a module shared between places could not be told apart in a pass)."""
    blocks = [_block(block, layer, method, base)
              for layer, block in enumerate(get_adapter(base).block_modules(base), 1)]
    idle = _idle(base)
    norms = {path: module for path, module in base.named_modules() if is_norm(module) and id(module) not in idle}
    seen: dict[int, str] = {}
    for parts in blocks:
        for field in ("attention", "q", "k", "v", "o", "q_norm", "k_norm", "mlp", "gate", "up", "down", "act"):
            module = getattr(parts, field)
            if module is None:
                continue
            if id(module) in seen:
                raise _refuse(method, base, f"block {parts.layer}'s {field} ({type(module).__name__}) is the same "
                              f"module as {seen[id(module)]}")
            seen[id(module)] = f"block {parts.layer}'s {field}"
    return ModelParts(blocks, norms)
