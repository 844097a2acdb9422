"""The registered ``attention`` and ``norm_attention`` methods: the pooled (last) token's row of a decoder's
attention maps (:mod:`normx.methods.decoder.maps`), and for :func:`normx.explain_generation` every generation step's
row from one forward pass (``Method.query_rows``)."""

from __future__ import annotations

from normx._torch import torch
from normx.methods.decoder.heads import decoder_reason
from normx.methods.decoder.maps import query_rows
from normx.methods.registry import Context, Method, Option, register_method


def _rows(kind: str):
    def rows(ctx: Context, queries: torch.Tensor) -> torch.Tensor:
        return query_rows(ctx.run, queries, kind, ctx.options["aggregate"], kind)
    return rows


def _compute(kind: str):
    rows = _rows(kind)

    def compute(ctx: Context) -> torch.Tensor:
        run = ctx.run
        scores = rows(ctx, run.pooled[:, None])[:, 0]  # [B, layers, T]; runs the pass
        ctx.predict(run.pooled_logits())
        return ctx.expand(scores)
    return compute


AGGREGATE = Option("aggregate", True, "True: the score at layer l aggregates blocks 1..l (attention: their mean; "
                   "norm_attention: their sum), so the default last layer holds every block; False: block l alone",
                   bool, flag="--per-block")
_LAYERS = ("Layer l >= 1 reads block l's attention (with aggregate=True, the default, blocks 1..l together: the "
           "default last layer is the aggregate over every block; aggregate=False: block l alone, per-layer curves "
           "with layer='all'); layer 0 is the query token alone. The row of the pooled (last) token, the query the "
           "prediction is read at; label-independent, unsigned; one forward pass on the model's own attention (sdpa), "
           "its rows recomputed at the query only. Causal decoders (causal LMs and decoder classifiers) whose blocks "
           "have a self_attn / attn / attention module")
register_method(Method(
    "attention", _compute("attention"),
    "Attention weights: the mean over heads of each block's attention probabilities alpha^h_(q,j) from the query "
    "token q to each token j (grouped-query heads as the model repeats them); mean over blocks. " + _LAYERS,
    display="Attention", label_dependent=False, shares=True, reading="magnitude", predicts=True, exclusive=True,
    inference=True,
    options=[AGGREGATE], supports=decoder_reason, query_rows=_rows("attention"),
    cost=lambda tokens, targets, options: 1.1))  # measured 0.98x a forward (SmolLM2, 64 tokens, eager)
register_method(Method(
    "norm_attention", _compute("norm_attention"),
    "Norm-based attention (Kobayashi et al. 2020): ||sum_h alpha^h_(q,j) W_O^h v^h_j||, each token's value vectors "
    "weighted by the attention and pushed through the output projection, summed over heads inside the norm; sum over "
    "blocks. Checked against the attention module's own output on every pass. " + _LAYERS,
    display="Norm-based attention", label_dependent=False, reading="magnitude", predicts=True, exclusive=True,
    inference=True,
    options=[AGGREGATE], supports=decoder_reason, query_rows=_rows("norm_attention"),
    cost=lambda tokens, targets, options: 1.3))  # measured: all 32 steps of SmolLM2 at 64 tokens, 1.25x a forward
