"""``attention_logit`` (experimental, docs/generation.md "Choosing NormXLogit for generation"): the query position's
head contracted with what each block's attention moved there from token j, from ONE forward pass on the model's own
attention (rows recomputed at the queries, :mod:`normx.methods.decoder.maps`).

For the prediction read at query q (the pooled token; p - 1 for the generated token at p) with target t, the model's
logit is z_t = HoT(norm(x_q^L))[t], and x_q^L is x_q^0 plus every block's attention and MLP output at q. Block l's
attention output at q is sum_j sum_h alpha^(l,h)_(q,j) W_O^(l,h) v_j^(l,h) (the output bias belongs to no token), a
sum over the keys j. The score of token j at layer l is that key's part of blocks 1..l, read by the head at q:

    s_(q,j)^l = sum_(b <= l) sum_h alpha^(b,h)_(q,j) < W_O^(b,h) v_j^(b,h), u_q >,   u_q = d z_t / d x_q^L

with u_q the gradient of the target's logit (minus the foil's) with respect to the query's last hidden state,
through the model's own final norm and head (the head read at q, as NormXLogit reads it at every token; a first-order
reading of the final norm). Signed: positive moves the logit toward the target. ``aggregate=False``: block l alone.
Layer 0 is the query token alone (1 at its own position). The attention probabilities, value vectors and the check
that they reproduce the attention module's output are :mod:`normx.methods.decoder.maps`'s.
"""

from __future__ import annotations

from normx._torch import torch
from normx.errors import UnsupportedModelError
from normx.methods.decoder.heads import block_attention, decoder_reason
from normx.methods.decoder.maps import read_blocks
from normx.methods.decoder.method import AGGREGATE
from normx.methods.registry import Context, Method, register_method

NAME = "attention_logit"


def _directions(ctx: Context, queries: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """u [B, Q, hidden] float32: the gradient of the target's logit (minus the foil's) at each query's last hidden
    state, through the final norm and the head; ``columns`` [B, Q] pairs a target with each query."""
    run = ctx.run
    last = run.hidden[run.adapter.num_layers(run.model)]
    rows = torch.arange(last.shape[0], device=last.device)[:, None]
    with torch.enable_grad():
        x = last[rows, queries].detach().float().requires_grad_(True)  # [B, Q, hidden]
        norm = run.adapter.norm_module(run.model)
        dtype = next(run.model.parameters()).dtype
        hidden = x.to(dtype)
        hidden = norm(hidden) if norm is not None else hidden
        b, q, h = hidden.shape
        logits = run.adapter.head(run.model, hidden.reshape(b * q, h), None).reshape(b, q, -1).float()
        picked = logits.gather(2, columns[..., None])[..., 0]
        if ctx.foil is not None:
            picked = picked - logits.gather(2, ctx.foil[:, None, None].expand(b, q, 1))[..., 0]
        (grad,) = torch.autograd.grad(picked.sum(), x)
    return grad.float()


def _scores(ctx: Context, queries: torch.Tensor, columns: torch.Tensor | None) -> torch.Tensor:
    """[B, Q, layers, T] for queries [B, Q] and their targets ``columns`` [B, Q] (None: predict at the pooled
    token, Q = 1, and score every explained target there: [B, K, layers, T])."""
    run = ctx.run
    reason = decoder_reason(run.adapter)
    if reason is not None:
        raise UnsupportedModelError(f"{NAME} does not explain {type(run.model).__name__}: {reason}")
    layers = list(run.layers)
    aggregate = ctx.options["aggregate"]
    top = max(layers)
    blocks = list(range(1, top + 1)) if aggregate else sorted({layer for layer in layers if layer > 0})
    read = block_attention(run.model, blocks, NAME, values=True)
    # {block: (alpha rows [B, H, Q, T], values [B, T, H, d])}, checked as norm_attention checks them
    moved = read_blocks(run, queries, read, NAME, lambda _block, rows, values: (rows, values.to(rows.dtype)))
    if columns is None:  # one query (the pooled token), every explained target
        columns = ctx.predict(run.pooled_logits())  # [B, K]
        queries = queries.expand(-1, columns.shape[1])
        moved = {layer: (rows.expand(-1, -1, columns.shape[1], -1), values) for layer, (rows, values) in moved.items()}
    u = _directions(ctx, queries, columns)  # [B, Q, hidden]
    per_block = {}
    for layer, (rows, values) in moved.items():
        w_o = read[layer].head_projections(rows.shape[1])  # [H, d, hidden]
        w = torch.einsum("hdo,bqo->bqhd", w_o, u.to(w_o.dtype))
        read_at_q = torch.einsum("bthd,bqhd->bhqt", values.to(w.dtype), w)  # <W_O^h v_j^h, u_q> [B, H, Q, T]
        per_block[layer] = (rows.to(w.dtype) * read_at_q).sum(1).float()
    mask = run.inputs["attention_mask"]
    identity = torch.zeros((*queries.shape, mask.shape[1]), dtype=torch.float32, device=mask.device)
    identity.scatter_(2, queries[..., None], 1.0)
    out, total = [], None
    for layer in range(top + 1):
        if layer > 0 and aggregate:
            total = per_block[layer] if total is None else total + per_block[layer]
        if layer in layers:
            out.append(identity if layer == 0 else (total if aggregate else per_block[layer]))
    return torch.stack(out, dim=2)


def _compute(ctx: Context) -> torch.Tensor:
    return _scores(ctx, ctx.run.pooled[:, None], None)


def _query_rows(ctx: Context, queries: torch.Tensor) -> torch.Tensor:
    return _scores(ctx, queries, ctx.columns)


register_method(Method(
    NAME, _compute,
    "Experimental (docs/generation.md): the query token's head contracted with what each block's attention moved "
    "from token j to it: sum over blocks 1..l and heads of alpha_(q,j) <W_O v_j, d z_target / d x_q^L>; signed; "
    "one forward pass on the model's own attention. Causal decoders",
    display="Attention-Logit", reading="signed", predicts=True, exclusive=True, options=[AGGREGATE],
    supports=decoder_reason, query_rows=_query_rows, experimental=True,
    cost=lambda tokens, targets, options: 1.3))
