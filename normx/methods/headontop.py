"""The head-on-top methods: NormXLogit, LogAt and the l2-norm baseline (one forward pass, no backward pass), and
LogAt's arithmetic, which the variants (:mod:`normx.methods.variants`) read too.

LogAt runs the model's own head on every token's representation x_i^l as if it were the pooled token and reads the
target's output (minus the foil's); on a regression head it is ``|HoT(x_i^l) - HoT(pooled^l)|``. NormXLogit is
``||x_i^0|| x LogAt(x_i^l)``.
"""

from __future__ import annotations

from normx._torch import torch
from normx.methods.registry import Context, Method, register_method


def logat_at(ctx: Context, layer: int) -> torch.Tensor:
    """LogAt scores [B, K, T] at one captured layer for the context's target columns (minus its foil)."""
    run = ctx.run
    if ctx.labels.regression:
        out = run.every_head(layer).float()  # [B, T, 1]
        # HoT(CLS) (or of the mean) at the same layer
        pooled = (run.pooled_rows(out) if run.positional else run.pooled_head(run.head_input(layer))).float()
        return (out - pooled[:, None, :]).abs().permute(0, 2, 1)
    wanted = ctx.labels.head_columns(ctx.columns, ctx.foil)
    # [B, T, C], or [B, T, U] at the needed vocabulary columns only
    out = (run.head(run.head_input(layer), wanted.vocab) if ctx.labels.is_vocabulary else run.every_head(layer)).float()
    scores = torch.gather(out, 2, wanted.targets.unsqueeze(1).expand(-1, out.shape[1], -1))  # [B, T, K]
    if wanted.foil is not None:
        scores = scores - torch.gather(out, 2, wanted.foil[:, None, None].expand(-1, out.shape[1], 1))
    return scores.permute(0, 2, 1)  # [B, K, T]


def logat(ctx: Context) -> torch.Tensor:
    """LogAt scores [B, K, layers, T] at the context's layers."""
    layers = ctx.run.layers
    if len(layers) == 1:  # (a view, where a stack of one copies)
        return logat_at(ctx, layers[0]).unsqueeze(2)
    return torch.stack([logat_at(ctx, layer) for layer in layers], dim=2)


def _normxlogit(ctx: Context) -> torch.Tensor:
    norms = ctx.run.input_norm  # [B, T]
    return norms.reshape(norms.shape[0], 1, 1, norms.shape[1]) * logat(ctx)


def _l2norm(ctx: Context) -> torch.Tensor:
    return ctx.expand(ctx.run.hidden_norms())


register_method(Method(
    "normxlogit", _normxlogit,
    "NormXLogit: ||x_i^0|| x LogAt(x_i^l); the input norm times the head's logit for the label on each token",
    display="NormXLogit", regression_distance=True, per_position=True, reads_head=True))
register_method(Method(
    "logat", logat,
    "LogAt: the head-on-top run on each token's layer-l representation, read at the label (|difference from "
    "the pooled token| for regression)",
    display="LogAt", regression_distance=True, foil_curve=True, per_position=True, reads_head=True))
register_method(Method(
    "l2norm", _l2norm,
    "l2 norm of each token's representation (default layer 0, the input embedding); label-independent",
    display="ℓ2 norm", default_layer="input", label_dependent=False, per_position=True, reading="magnitude"))
