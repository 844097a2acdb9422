"""Decoder DecompX read at the head: each token's part of x^l at a query position, through the final norm
(linearised at the real x^l, as the model norms it before its head) and the head's linear map, is that token's share
of the target logit there; the bias part's share and the decomposition error (the shares plus the bias share minus
the model's own logit) come with it.

:func:`decoder_decompx` serves ``normx.explain`` (the query is the pooled, last token; the targets are the explained
columns) and :func:`decoder_decompx_rows` serves ``normx.explain_generation`` (every step's query position and
generated token, from one recorded pass and one decomposition).
"""

from __future__ import annotations

from normx._torch import torch
from normx.core.forward import Pass
from normx.errors import UnsupportedModelError
from normx.methods.decoder.decompose import METHOD, decompose_row, record_decoder
from normx.methods.decoder.linear import norm_map
from normx.methods.numerics import tolerance
from normx.models import HeadKind, linear_columns
from normx.models.discovery import logit_softcap


def head_map(run: Pass, vocab: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's affine map on final-normed representations: (W [D, C], b [C]) float32, ``vocab`` the columns it
    is run at (None: all its outputs), probed on the unit vectors as the model's own head computes. A soft-capped
    LM head (:func:`normx.models.discovery.logit_softcap`) is probed without its cap, which :func:`_shares` applies
    as a ratio."""
    base, adapter = run.model, run.adapter
    weight = next(base.parameters())
    d = run.hidden[max(run.hidden)].shape[-1]
    probe = torch.cat([torch.zeros(1, d), torch.eye(d)]).to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        if _softcap(run) is not None:
            out = linear_columns(base.get_output_embeddings(), probe, vocab).float()
        else:
            out = adapter.head(base, probe, vocab).float()
    return out[1:] - out[:1], out[0]


def _softcap(run: Pass) -> float | None:
    cap = logit_softcap(run.model.config)
    return cap if cap is not None and run.adapter.kind is HeadKind.CAUSAL_LM else None


def _check_affine(run: Pass, mine: torch.Tensor, real: torch.Tensor) -> None:
    worst = float((mine - real).abs().max()) if real.numel() else 0.0
    scale = float(real.abs().max()) if real.numel() else 0.0
    if worst > tolerance(next(run.model.parameters()).dtype) * max(scale, 1e-6):
        raise UnsupportedModelError(
            f"{METHOD} for decoders reads the head as an affine map; {type(run.model).__name__}'s head is not (off by "
            f"{worst:.3g} of {scale:.3g}: a transform of its logits other than a soft cap)")


def _real(rec, row: int, layer: int, position: int) -> torch.Tensor:
    """x^l at one position of one row as the blocks saw it."""
    return rec.block_in[0][row, position] if layer == 0 else rec.block_out[layer - 1][row, position]


def _shares(run: Pass, rec, row: int, queries: torch.Tensor, columns: torch.Tensor, vocab, layers: list[int],
            head: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For one row, queries [Q] and their columns [Q, K] (into the head's output): (token shares [Q, K, layers, n],
    bias shares [Q, K, layers], the model's own logits [Q, K, layers])."""
    tokens, bias = decompose_row(rec, run, row, queries, layers)  # [Q, L, n, D], [Q, L, D]
    w, b = head
    norm = run.adapter.norm_module(run.model)
    q, k = columns.shape
    shares = torch.zeros((q, k, len(layers), tokens.shape[2]), device=tokens.device)
    bias_shares = torch.zeros((q, k, len(layers)), device=tokens.device)
    model = torch.zeros((q, k, len(layers)), device=tokens.device)
    with torch.no_grad():
        for j, position in enumerate(queries.tolist()):
            for where, layer in enumerate(layers):
                real = _real(rec, row, layer, position)[None]
                normed = norm(real)
                fixed = norm_map(norm, real, normed, "the final norm", METHOD)
                cols = columns[j]
                own = run.adapter.head(run.model, normed, vocab).float()[0, cols]  # the model's own logits
                linear = (normed.float() @ w[:, cols] + b[cols])[0]
                ratio = torch.ones_like(own)
                if _softcap(run) is not None:  # cap * tanh(z / cap): the zero-origin ratio, fixed at the real z
                    ratio = torch.where(linear != 0, own / torch.where(linear != 0, linear, 1.0), 1.0)
                _check_affine(run, linear * ratio, own)
                shares[j, :, where] = (fixed.parts(tokens[j, where][None], False)[0] @ w[:, cols]).T * ratio[:, None]
                bias_shares[j, :, where] = (fixed.parts(bias[j, where][None, None], True)[0, 0] @ w[:, cols]
                                            + b[cols]) * ratio
                model[j, :, where] = own
    return shares, bias_shares, model


def _decompose(run: Pass, queries: torch.Tensor, columns: torch.Tensor, vocab, foil: torch.Tensor | None):
    """Shares [B, Q, K, layers, T] (target minus foil where a foil is given), the worst decomposition error
    [B, Q, K] over the layers and the bias part's share at the last layer [B, Q, K], for queries [B, Q] and columns
    [B, Q, K]."""
    rec = record_decoder(run)
    layers = list(run.layers)
    head = head_map(run, vocab)
    b, t = run.inputs["attention_mask"].shape
    scores = torch.zeros((b, *columns.shape[1:], len(layers), t), device=columns.device)
    error = torch.zeros(columns.shape, device=columns.device)
    bias_logit = torch.zeros(columns.shape, device=columns.device)
    for row in range(b):
        wanted = columns[row] if foil is None else torch.cat([columns[row], foil[row].expand(columns.shape[1], 1)], 1)
        shares, bias, model = _shares(run, rec, row, queries[row], wanted, vocab, layers, head)
        error[row] = (shares.sum(-1) + bias - model).abs().amax(-1)[:, :columns.shape[2]]
        if foil is not None:
            shares, bias = shares[:, :-1] - shares[:, -1:], bias[:, :-1] - bias[:, -1:]
        scores[row, ..., :shares.shape[-1]] = shares
        bias_logit[row] = bias[..., -1]
    return scores, error, bias_logit


def decoder_decompx(ctx) -> torch.Tensor:
    """``Method.compute`` for causal decoders: [B, K, layers, T] shares of the target columns at the pooled token."""
    run = ctx.run
    wanted = ctx.labels.head_columns(ctx.columns, ctx.foil)
    scores, error, bias = _decompose(run, run.pooled[:, None], wanted.targets[:, None], wanted.vocab, wanted.foil)
    ctx.diagnostics["decomposition_error"] = error[:, 0]
    ctx.diagnostics["bias_logit"] = bias[:, 0]
    return scores[:, 0]


def decoder_decompx_rows(ctx, queries: torch.Tensor) -> torch.Tensor:
    """``Method.query_rows``: [B, Q, layers, T] shares of each step's column ``ctx.columns`` [B, Q] at its query."""
    wanted = ctx.labels.head_columns(ctx.columns)
    scores, error, bias = _decompose(ctx.run, queries, wanted.targets[..., None], wanted.vocab, None)
    ctx.diagnostics["decomposition_error"] = error[..., 0]
    ctx.diagnostics["bias_logit"] = bias[..., 0]
    return scores[:, :, 0]
