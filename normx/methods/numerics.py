"""The numerics the methods share: how close a recomputation must come to the module's own output
(:func:`tolerance`, :func:`off_by`, :func:`close`), the attribute names a norm module keeps its epsilon under
(:data:`EPS_NAMES`), and an activation's zero-origin slope (:func:`zo_slope`). The affine maps of a model's own
projections (Conv1D and LoRA included) and an attention's per-head output maps W_O^h are the models layer's
(:mod:`normx.models.projections`)."""

from __future__ import annotations

from normx._torch import torch

# where a norm module keeps its epsilon, in the order they are looked up (RMSNorm's variance_epsilon, nn.LayerNorm's
# eps, ...)
EPS_NAMES = ("variance_epsilon", "eps", "epsilon", "layer_norm_eps")


def tolerance(dtype: torch.dtype) -> float:
    """How far a recomputation may be from the module's own output, relative to its largest magnitude, in the
    model's dtype."""
    return 1e-4 if dtype in (torch.float32, torch.float64) else 3e-2


def off_by(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(the largest absolute difference, the largest |want|)."""
    if not want.numel():
        return 0.0, 0.0
    return float((got.detach().float() - want.detach().float()).abs().max()), float(want.detach().float().abs().max())


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype | None = None) -> bool:
    """``got`` equals ``want`` within :func:`tolerance` (of ``dtype``, else ``want``'s) of ``want``'s largest
    magnitude."""
    worst, scale = off_by(got, want)
    return worst <= tolerance(want.dtype if dtype is None else dtype) * max(scale, 1e-6)


def zo_slope(pre: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
    """The zero-origin slope f(z)/z of an activation (0 where z = 0, where f(0) = 0 makes any slope exact)."""
    pre, post = pre.float(), post.float()
    nonzero = pre != 0
    return torch.where(nonzero, post / torch.where(nonzero, pre, torch.ones_like(pre)), torch.zeros_like(pre))
