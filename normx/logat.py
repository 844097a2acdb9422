"""The head-on-top methods: NormXLogit, LogAt and the l2-norm baseline (one forward pass, no backward pass)."""

from __future__ import annotations

from ._torch import torch
from .methods import Context, Method, register_method


def _normxlogit(ctx: Context) -> torch.Tensor:
    return ctx.run.input_norm[:, None, None, :] * ctx.logat()


def _logat(ctx: Context) -> torch.Tensor:
    return ctx.logat()


def _l2norm(ctx: Context) -> torch.Tensor:
    return ctx.expand(ctx.run.hidden_norms())


register_method(Method(
    "normxlogit", _normxlogit,
    "NormXLogit: ||x_i^0|| x LogAt(x_i^l); the input norm times the head's logit for the label on each token",
    display="NormXLogit", regression_distance=True))
register_method(Method(
    "logat", _logat,
    "LogAt: the head-on-top run on each token's layer-l representation, read at the label (|difference from "
    "the pooled token| for regression)",
    display="LogAt", regression_distance=True))
register_method(Method(
    "l2norm", _l2norm,
    "l2 norm of each token's representation (default layer 0, the input embedding); label-independent",
    display="ℓ2 norm", default_layer="input", label_dependent=False))
