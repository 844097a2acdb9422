"""The affine maps of a model's own projection modules, read once for every method: a plain ``nn.Linear``'s
parameters, transformers' ``Conv1D`` (GPT-2: ``x @ weight + bias``, its weight stored [in, out]) read directly, any
other affine module (a LoRA-wrapped Linear, ...) probed on the unit vectors, so adapters count with their effective
weights; and an attention's output projection cut into its per-head maps W_O^h."""

from __future__ import annotations

from typing import TYPE_CHECKING

from normx.models.modules import active_module

if TYPE_CHECKING:
    import torch
    from torch import nn


def _conv1d() -> type:
    from transformers.pytorch_utils import Conv1D

    return Conv1D


def affine(module: nn.Module, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(W [out, in], b [out]) in float32 of an affine module, so that ``module(x) = x W^T + b``.

    A plain nn.Linear gives its parameters, a ``Conv1D`` its transposed weight; any other affine module is probed:
    ``b = f(0)``, ``W^T = f(I) - f(0)``, which includes every adapter delta exactly (up to the model dtype's
    rounding). ``rows`` selects output rows (vocabulary columns of an LM decoder).
    """
    import torch
    from torch import nn

    module = active_module(module)
    if type(module) is _conv1d():
        weight, bias = module.weight.detach().float().T, module.bias.detach().float()
        return (weight, bias) if rows is None else (weight[rows], bias[rows])
    if type(module) is nn.Linear:
        weight, bias = module.weight, module.bias
        if rows is not None:
            weight = weight[rows]
            bias = None if bias is None else bias[rows]
        weight = weight.detach().float()
        bias = torch.zeros(weight.shape[0], device=weight.device) if bias is None else bias.detach().float()
        return weight, bias
    ref = next(module.parameters())
    size = getattr(module, "in_features", None) or ref.shape[-1]
    probe = torch.cat([torch.zeros(1, size), torch.eye(size)]).to(device=ref.device, dtype=ref.dtype)
    with torch.no_grad():
        out = module(probe).float()
    bias, weight = out[0], (out[1:] - out[:1]).T
    if rows is not None:
        weight, bias = weight[rows], bias[rows]
    return weight.contiguous(), bias


def head_projections(output: nn.Module, heads: int, head_dim: int) -> torch.Tensor:
    """W_O per head [heads, head_dim, hidden] of an attention's output projection ``output`` (float32; float64 for
    float64 models): its linear part, ``output(I) - output(0)`` of the model's own (possibly LoRA-wrapped) module,
    so adapters count with their effective weights and no bias is attributed to a token; a plain Linear's or a
    Conv1D's weight read directly."""
    import torch
    from torch import nn

    if type(output) is nn.Linear:  # a plain projection: its weight is the linear part ([hidden, heads x d])
        rows = output.weight.t()
    elif type(output) is _conv1d():  # GPT-2's: x @ weight + bias, weight [heads x d, hidden]
        rows = output.weight
    else:  # wrapped (LoRA) or another module: run it on the unit vectors
        weight = next(output.parameters())
        eye = torch.eye(heads * head_dim, dtype=weight.dtype, device=weight.device)
        rows = output(eye) - output(torch.zeros_like(eye[:1]))
    rows = rows if rows.dtype == torch.float64 else rows.float()
    return rows.reshape(heads, head_dim, -1)
