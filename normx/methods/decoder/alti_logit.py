"""ALTI-Logit (Ferrando et al., ACL 2023, "Explaining How Transformers Use Context to Build Predictions") for causal
decoders: what each block's attention writes into the query position's residual stream, split over the tokens it
mixes and read as a logit update of the target, then traced back to the input tokens through the ALTI contributions
of the blocks before.

For block l with attention probabilities alpha^(l,h) (the model's own), the value vectors v_j^(l,h) of the attention's
(normed) input, bias included, and head h's slice W_O^h of the output projection:

- T^l_(i<-j) = sum_h alpha^(l,h)_(i,j) W_O^h v^(l,h)_j (then the block's post-attention norm, linearised at the real
  attention output, where it has one), the attention's output at i split over the tokens j it mixes (the output
  bias belongs to no token);
- the logit update of target c from token j at the query q: Delta^l_(q,j) = U_c . FN_q(T^l_(q<-j)), with FN_q the
  final norm linearised at the model's last residual state at q and U_c the head's map to column c;
- ALTI contributions: with y_i = x_i + attn_i the attention block's output (residual included) and
  T_i(x_j) = T^l_(i<-j) + [i = j] x_i, c^l_(i,j) = max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1), normalised to sum to one
  over j; the rollout R^l = C^l R^(l-1), R^0 = I;
- ALTI-Logit at the input token s: sum_l sum_j Delta^l_(q,j) R^(l-1)_(j,s); the score at layer l sums blocks 1..l
  (the default last layer: every block), layer 0 is zero.

Everything comes from one recorded pass (:func:`normx.methods.decoder.decompose.record_decoder`, whose wiring and
checks it shares: the attention parts are checked to sum to the module's own output), so every generation step's row
comes from one pass too. Memory grows with T: the pass keeps each block's input and output (no [T, T]
probabilities), the rollout is read backwards from the queries (:func:`alti_logit_rows`), one block at a time, each
run again alone on its recorded input to remake its attention output, queries and keys (checked to give its recorded
output); the work grows with T^2 per block (every token pair's distance).
"""

from __future__ import annotations

from normx._torch import torch
from normx.core.forward import Pass
from normx.errors import UnsupportedModelError
from normx.methods.decoder.contributions import head_map
from normx.methods.decoder.decompose import DecoderRecording, record_decoder
from normx.methods.decoder.heads import decoder_reason
from normx.methods.decoder.linear import norm_map
from normx.methods.decoder.maps import repeat_values
from normx.methods.numerics import tolerance
from normx.methods.registry import Method, register_method
from normx.models.projections import affine

METHOD = "ALTI-Logit"
_ROWS = 2**24  # at most this many floats in one [rows, keys, hidden] chunk of T (64 MiB: rows share each read of f)
_MOST_ROWS = 64  # and at most this many rows (so a chunk grows with T, never with T^2)


def _mixed(rec: DecoderRecording, i: int, row: int, n: int) -> torch.Tensor:
    """f [n, H, D]: each token's value vectors through each head's slice of the output projection (no output
    bias), so that T_(i<-j) = sum_h alpha_(h,i,j) f_(j,h)."""
    read = rec.attention[i]
    wiring = rec.blocks[i]
    source = rec.block_in[i][row, :n]
    if wiring.attention_norm is not None:  # the attention's input norm, recomputed from the block's input
        source = wiring.attention_norm(source)
    weight, bias = affine(read.values)
    heads = rec.probs[i].heads
    values = repeat_values(read.value_vectors((source.float() @ weight.T + bias)[None]), heads, read, METHOD)[0]
    w_o = read.head_projections(heads)  # [H, d, D]
    return torch.einsum("jhd,hdo->jho", values.to(w_o.dtype), w_o).float()


def _post(rec: DecoderRecording, i: int, row: int, n: int, method: str):
    """The block's post-attention norm linearised at the real attention output, or None."""
    wiring = rec.blocks[i]
    if wiring.attention_post is None:
        return None
    real_in, real_out = rec.norms[i]["attention_post"]
    return norm_map(wiring.attention_post, real_in[row, :n], real_out[row, :n], f"block {i + 1}'s attention_post",
                    method)


def _times_contributions(rec: DecoderRecording, i: int, row: int, n: int, f: torch.Tensor, post,
                         vectors: torch.Tensor) -> torch.Tensor:
    """``vectors`` [V, n] times block i's ALTI contributions C [n, n] (rows normalised to sum to one), made in
    chunks of query rows (memory [rows, n, D], never [n, n] probabilities nor C whole); checks that the attention
    parts sum to the module's own output at every row."""
    scale = rec.blocks[i].residual_scale
    x = rec.block_in[i][row, :n].float()
    own = rec.attention_out[i][row, :n].float()
    out = torch.zeros_like(vectors)
    step = max(1, min(_MOST_ROWS, _ROWS // max(1, n * x.shape[-1])))
    bias = None
    worst = 0.0
    for start in range(0, n, step):
        stop = min(n, start + step)
        rows = slice(start, stop)  # causal: these rows mix keys j < stop only
        probs = rec.probs[i].rows(row, start, stop, stop).float()  # [H, r, stop]
        parts = torch.einsum("hij,jho->ijo", probs, f[:stop])  # [r, stop, D]
        total = parts.sum(1)
        here = own[rows] - total  # the output projection's bias, the same at every position
        bias = here[:1] if bias is None else bias
        worst = max(worst, float((here - bias).abs().max()))
        if post is not None:
            parts.mul_(post.scale[rows, None] * post.gain)
        if scale != 1:
            parts.mul_(scale)
        parts[torch.arange(stop - start), torch.arange(start, stop)] += x[rows]
        resultant = x[rows] + _attention_branch(rec, i, row, rows, post)
        distance = parts.sub_(resultant[:, None]).abs_().sum(-1)  # ||y_i - T_i(x_j)||_1, in place
        c = (resultant.abs().sum(-1, keepdim=True) - distance).clamp_min(0)
        c = c / c.sum(-1, keepdim=True).clamp_min(torch.finfo(c.dtype).tiny)  # [r, stop]
        out[:, :stop] += vectors[:, rows] @ c
    if worst > 10 * tolerance(rec.attention_out[i].dtype) * max(float(own.abs().max()), 1e-6):
        raise UnsupportedModelError(f"{METHOD}: the parts of block {i + 1}'s attention do not sum to its own output "
                                    f"(off by {worst:.3g})")
    return out


def _deltas(rec: DecoderRecording, i: int, row: int, n: int, f: torch.Tensor, post, queries: list[int], fixed,
            readout: torch.Tensor) -> torch.Tensor:
    """Delta [Q, n]: each key's part of block i's attention output at the queries, read as a logit update through
    the final norm linearised at the query (``fixed``) and the head's column (``readout`` [Q, D]); in chunks of
    keys (memory [Q, keys, D])."""
    at = torch.tensor(queries, device=f.device)
    probs = torch.cat([rec.probs[i].rows(row, q, q + 1, n) for q in queries], 1).float()  # [H, Q, n]
    scale = rec.blocks[i].residual_scale
    out = torch.zeros((len(queries), n), device=f.device)
    step = max(1, min(_MOST_ROWS, _ROWS // max(1, len(queries) * f.shape[-1])))
    for start in range(0, n, step):
        keys = slice(start, min(n, start + step))
        parts = torch.einsum("hqj,jho->qjo", probs[:, :, keys], f[keys])
        if post is not None:
            parts = parts * post.scale[at, None] * post.gain
        normed = fixed.parts((parts * scale).transpose(0, 1), False).transpose(0, 1)  # [Q, keys, D], FN_q linear
        out[:, keys] = torch.einsum("qjd,qd->qj", normed, readout)
    return out


def _attention_branch(rec: DecoderRecording, i: int, row: int, rows: slice, post) -> torch.Tensor:
    """What block i's attention adds to the residual stream at ``rows``: its output, post-normed where the block
    norms it, times the residual scale."""
    if post is not None:
        out = rec.norms[i]["attention_post"][1][row, rows].float()
    else:
        out = rec.attention_out[i][row, rows].float()
    return out * rec.blocks[i].residual_scale


def alti_logit_rows(run: Pass, queries: torch.Tensor, columns: torch.Tensor, vocab) -> torch.Tensor:
    """Scores [B, Q, layers, T] for queries [B, Q] and their target columns [B, Q] (into the head's output),
    running the recorded pass on ``run``.

    The rollout is read backwards from the queries (Horner's rule): the score at layer l is
    sum_(b <= l) Delta^b R^(b-1) = ((Delta^l C^(l-1) + Delta^(l-1)) C^(l-2) + ... ) C^1 + Delta^1, so only
    [layers, Q, T] vectors are carried and each block's C is made in chunks of rows. The blocks are taken one at a
    time from the top down, each made again from its recorded input (:meth:`DecoderRecording.load`) and let go
    after: memory grows with T (each block's input, and one block's attention output, queries, keys and value
    vectors through W_O at a time), the work with T^2 per block."""
    rec = record_decoder(run, mlp=False, lazy=True, method=METHOD)
    layers = list(run.layers)
    w, _ = head_map(run, vocab)
    norm = run.adapter.norm_module(run.model)
    b, t = run.inputs["attention_mask"].shape
    out = torch.zeros((b, queries.shape[1], len(layers), t), device=w.device)
    top = max(layers)
    reading = torch.tensor(layers, device=w.device)
    rows = []  # per batch row: (n, queries, the final norm fixed there, the head's columns, the Horner sums)
    for row in range(b):
        n = int(run.inputs["attention_mask"][row].sum())
        q = queries[row].tolist()
        final = rec.block_out[-1][row, q].float()
        with torch.no_grad():
            fixed = norm_map(norm, final, norm(rec.block_out[-1][row, q]), "the final norm", METHOD)
        readout = w[:, columns[row]].T  # [Q, D]
        rows.append((n, q, fixed, readout, torch.zeros((len(layers), len(q), n), device=w.device)))
    with torch.no_grad():
        for i in range(top - 1, -1, -1):  # block i + 1, from the top down
            rec.load(i)
            above = reading >= i + 2  # the layers whose score includes block i + 2: times C of block i + 1 first
            active = reading >= i + 1  # the layers whose score includes block i + 1
            for row, (n, q, fixed, readout, carried) in enumerate(rows):
                f, post = _mixed(rec, i, row, n), _post(rec, i, row, n, METHOD)
                if i < top - 1:
                    moved = _times_contributions(rec, i, row, n, f, post, carried[above].reshape(-1, n))
                    carried[above] = moved.reshape(-1, len(q), n)
                carried[active] += _deltas(rec, i, row, n, f, post, q, fixed, readout)
                del f, post
            rec.drop(i)
    for row, (n, _, _, _, carried) in enumerate(rows):
        out[row, :, :, :n] = carried.transpose(0, 1)
    return out


def _compute(ctx) -> torch.Tensor:
    """``Method.compute``: [B, K, layers, T] for the target columns at the pooled (last) token."""
    run = ctx.run
    wanted = ctx.labels.head_columns(ctx.columns, ctx.foil)
    targets = wanted.targets
    queries = run.pooled[:, None].expand_as(targets)
    scores = alti_logit_rows(run, queries, targets, wanted.vocab)
    if wanted.foil is not None:
        scores = scores - alti_logit_rows(run, run.pooled[:, None], wanted.foil[:, None], wanted.vocab)
    return scores


def _rows(ctx, queries: torch.Tensor) -> torch.Tensor:
    """``Method.query_rows``: each step's row at its query for its column ``ctx.columns`` [B, Q]."""
    wanted = ctx.labels.head_columns(ctx.columns)
    return alti_logit_rows(ctx.run, queries, wanted.targets, wanted.vocab)


register_method(Method(
    "alti_logit", _compute,
    "ALTI-Logit (Ferrando et al. 2023): each block's attention output at the query split over the tokens it mixes "
    "(value vectors through the output projection, weighted by the attention), read as an update of the target "
    "logit through the final norm and the head, and traced back to the input tokens through the ALTI contributions "
    "of the blocks before; the score at layer l sums blocks 1..l (the default last layer: all of them), layer 0 is "
    "zero. Signed, label-dependent; one forward pass on the model's own attention for every generation step, "
    "memory linear in the tokens. Causal decoders whose blocks DecompX reads (Llama, Mistral, Qwen, Gemma, Phi, "
    "OLMo, GPT-2, GPT-NeoX, ...)",
    display="ALTI-Logit", reading="signed", exclusive=True, supports=decoder_reason, query_rows=_rows,
    # its token-pair distances grow as T^2 per block: measured 1.91x a forward for all 32 steps at 64 tokens (SmolLM2)
    cost=lambda tokens, targets, options: 1.1 + tokens / 70))
