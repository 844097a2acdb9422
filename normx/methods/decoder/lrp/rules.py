"""AttnLRP's rules (Achtibat et al., ICML 2024) as Gradient×Input, as LXT 2.1's ``efficient`` implementation applies
them: each rule is a value equal to what the model computed in the forward direction, whose backward pass is the
rule's. The relevance of an input is then input × gradient.

- :func:`with_backward`: the model's own value, bit for bit, with the gradient of a surrogate recomputation;
- :func:`divide_gradient`: the uniform rule, the gradient divided by the number of factors of a product (the gated
  MLP's act(gate) * up: 2 each; attention: 2 at the values, LXT's 4 at the queries and keys);
- :func:`identity_rule`: an element-wise activation y = f(x) passes the relevance on unchanged: gradient f(x) / x
  (LXT: f(x) / (x + 1e-10));
- :func:`norm_identity`: a normalisation with its scale (1 / rms, 1 / std) held constant, so that it is linear in
  its input and passes the relevance on unchanged (LXT's RMSNorm / LayerNorm: ``stop_gradient`` on the scale).

The softmax rule needs nothing: the softmax's own gradient times its input is AttnLRP's softmax rule
R_i = x_i (R_i' - s_i sum_j R_j'), so the attention is recomputed with a plain softmax
(:mod:`normx.methods.decoder.lrp.attention`).
"""

from __future__ import annotations

from collections.abc import Callable

from normx._torch import nn, torch
from normx.methods.numerics import EPS_NAMES, close

EPSILON = 1e-10  # LXT's identity rule: f(x) / (x + 1e-10)


def with_backward(value: torch.Tensor, surrogate: torch.Tensor) -> torch.Tensor:
    """``value`` in the forward direction (exactly: ``surrogate - surrogate`` adds zero), with ``surrogate``'s
    gradient in the backward direction."""
    return value.detach() + (surrogate - surrogate.detach())


def divide_gradient(x: torch.Tensor, factor: float) -> torch.Tensor:
    """The uniform rule: ``x`` itself, whose gradient is divided by ``factor``."""
    return with_backward(x, x / factor)


def identity_rule(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``y`` = f(``x``) for an element-wise f, with gradient f(x) / (x + 1e-10) with respect to ``x``."""
    return with_backward(y, x * (y / (x + EPSILON)).detach())


def _eps(module: nn.Module) -> float | None:
    for name in EPS_NAMES:
        value = getattr(module, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _forms(module: nn.Module, x: torch.Tensor) -> list[Callable[[], torch.Tensor]]:
    """Candidate recomputations of a normalisation with its scale detached: RMSNorm with gain w (Llama, Mistral,
    Qwen: w * (x / rms) cast back), with gain 1 + w (Gemma: in float32, then cast back) or without a gain, and
    LayerNorm ((x - mean) / std * w + b)."""
    eps = _eps(module)
    if eps is None:
        return []
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    dtype = x.dtype
    x32 = x.float()

    def rms() -> torch.Tensor:
        return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps).detach()

    def layer() -> torch.Tensor:
        centred = x32 - x32.mean(-1, keepdim=True)
        out = centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + eps).detach()
        out = out if weight is None else out * weight.float()
        return (out if bias is None else out + bias.float()).to(dtype)

    if not isinstance(weight, torch.Tensor):
        return [lambda: rms().to(dtype), layer]
    return [lambda: weight * rms().to(dtype), lambda: (rms() * (1.0 + weight.float())).to(dtype), layer]


def norm_identity(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
    """The identity rule for a normalisation module that maps ``x`` to ``y``: ``y``, with the gradient of the first
    recomputation (:func:`_forms`) that gives ``y`` with its scale held constant; None if none does."""
    for form in _forms(module, x):
        surrogate = form()
        if surrogate.shape == y.shape and close(surrogate, y):
            return with_backward(y, surrogate)
    return None
