"""The pieces of a decoder that are linear once the model's own nonlinear quantities of one forward pass are fixed,
applied to a decomposition: parts P [S, N, D] (S sources, N positions) whose sum over the sources is the real
input. Each function returns the parts of the real output, whose sum is the module's own output on the real input;
a bias goes to the bias part (source 0 by convention of :mod:`normx.methods.decoder.decompose`), never to a token.

- norms (:func:`norm_map`): RMSNorm (``weight`` or Gemma's ``1 + weight``) or LayerNorm (with or without a gain),
  found by which formula reproduces the module's own output on the pass's real input; the real input's scale
  1 / rms (or 1 / std) is the fixed quantity;
- projections: the effective affine map of the model's own module (Conv1D and LoRA included,
  :func:`normx.models.projections.affine`);
- the MLP (:func:`mlp_parts`): gated MLPs keep the real gate activation act(gate(y)) fixed and decompose the up
  projection, exact; plain MLPs keep the activation's zero-origin slope act(z) / z fixed, exact too.
"""

from __future__ import annotations

from dataclasses import dataclass

from normx._torch import nn, torch
from normx.errors import UnsupportedModelError
from normx.methods.numerics import EPS_NAMES, close, off_by, zo_slope
from normx.models.decoder import MLPLayout
from normx.models.modules import active_module
from normx.models.projections import affine


@dataclass(frozen=True)
class NormMap:
    """A norm linearised at one real input [N, D]: out = (x - centre * mean(x)) * scale * gain + bias."""

    centre: bool
    scale: torch.Tensor  # [N, 1] float32: 1 / rms or 1 / std of the real input
    gain: torch.Tensor  # [D] float32
    bias: torch.Tensor | None  # [D] float32

    def parts(self, parts: torch.Tensor, bias_row: bool) -> torch.Tensor:
        """The output parts of ``parts`` [S, N, D]; with ``bias_row`` source 0 also takes the norm's bias."""
        if self.centre:
            parts = parts - parts.mean(-1, keepdim=True)
        out = parts * self.scale * self.gain
        if bias_row and self.bias is not None:
            out[0] = out[0] + self.bias
        return out

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """The norm of a real input [N, D] by this map (its own scale is not recomputed)."""
        return self.parts(x[None].float(), True)[0]


def _eps_values(module: nn.Module) -> list[float]:
    found = [float(getattr(module, name)) for name in EPS_NAMES if isinstance(getattr(module, name, None), float)]
    return found or [1e-5, 1e-6]


def _parameter(module: nn.Module, name: str) -> torch.Tensor | None:
    value = getattr(module, name, None)
    return value.detach().float() if isinstance(value, torch.Tensor) else None


def norm_map(module: nn.Module, real_in: torch.Tensor, real_out: torch.Tensor, what: str, method: str) -> NormMap:
    """``module`` linearised at ``real_in`` [N, D], the formula chosen by reproducing ``real_out`` [N, D] (its own
    output); :class:`UnsupportedModelError` if no formula does."""
    x = real_in.float()
    weight, bias = _parameter(module, "weight"), _parameter(module, "bias")
    ones = torch.ones(x.shape[-1], device=x.device)
    gains = [g for g in (weight, None if weight is None else 1 + weight) if g is not None] or [ones]
    worst = float("inf")
    for eps in _eps_values(module):
        for centre in (False, True):
            centred = x - x.mean(-1, keepdim=True) if centre else x
            scale = torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)
            for gain in gains:
                candidate = NormMap(centre, scale, gain, bias)
                mine = candidate.apply(x)
                if close(mine, real_out):
                    return candidate
                worst = min(worst, off_by(mine, real_out)[0])
    raise UnsupportedModelError(
        f"{method} linearises each norm as RMSNorm (weight or 1 + weight) or LayerNorm; {what} "
        f"({type(module).__name__}) matches neither on this pass's input (closest off by {worst:.3g})")


def affine_parts(module: nn.Module, parts: torch.Tensor, bias_row: bool) -> torch.Tensor:
    """``module`` (affine) on ``parts`` [S, N, D_in]: the linear map on every part; with ``bias_row`` its bias on
    source 0, the bias part."""
    weight, bias = affine(module)
    out = parts @ weight.T
    if bias_row:
        out[0] = out[0] + bias
    return out


def mlp_fixed(layout: MLPLayout, real_in: torch.Tensor) -> torch.Tensor:
    """What the decomposition of the MLP keeps fixed at its real input ``real_in`` [N, D]: the gate activation
    act(gate(y)) [N, F] (gated, fused), or the activation's zero-origin slope act(z) / z (plain)."""
    with torch.no_grad():
        real = real_in.to(next(active_module(layout.up).parameters()).dtype)
        if layout.kind == "gated":
            return layout.activation(layout.gate(real)).float()
        if layout.kind == "fused":
            gate = layout.up(real)
            return layout.activation(gate[..., :gate.shape[-1] // 2]).float()
        pre = layout.up(real)
        return zo_slope(pre, layout.activation(pre))


def mlp_parts(layout: MLPLayout, fixed: torch.Tensor, parts: torch.Tensor, bias_row: bool) -> torch.Tensor:
    """The MLP's output parts for input ``parts`` [S, N, D] whose sum is its real input, given :func:`mlp_fixed`
    at that input."""
    up = affine_parts(layout.up, parts, bias_row)
    if layout.kind == "fused":
        up = up[..., up.shape[-1] // 2:]
    return affine_parts(layout.down, fixed * up, bias_row)
