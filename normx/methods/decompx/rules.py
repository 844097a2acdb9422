"""DecompX's decomposition rules: each rule maps per-source parts whose sum is the real input to per-source parts
whose sum is the real output (affine maps with shared-out biases, LayerNorms with the real statistics, zero-origin
activations), and :func:`propagate` / :func:`decompose_head` chain them through the blocks and the head (see
:mod:`normx.methods.decompx.decompose` for the method)."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence

from normx._torch import F, torch
from normx.methods.decompx.model import BlockWeights, Recording, _layer_norm_parameters, affine
from normx.methods.numerics import zo_slope
from normx.models.encoder import Step

BIAS_RULES = ("absdot", "norm", "equal")
CHUNK_ELEMENTS = 2**24  # float32 values per chunk temporary (64 MiB)
FAST_FFN_SOURCES = 2  # the FFN goes through per-target H x H matrices when sources * this >= hidden


# ---- the decomposition rules -----------------------------------------------------------------------------------------


def _no_grad(fn):
    """``torch.no_grad()`` around ``fn`` (generators too), applied at call time: importing this module does not
    import torch."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return torch.no_grad()(fn)(*args, **kwargs)

    return wrapper


def share_bias(parts: torch.Tensor, bias: torch.Tensor, rule: str = "absdot",
               weights: torch.Tensor | None = None) -> torch.Tensor:
    """Add ``bias`` [D] to ``parts`` [S, N, D] (S sources) split over the sources by ``rule``; the shares of each
    target sum to 1, so ``parts.sum(0)`` gains exactly ``bias``. ``weights`` [S, N]: the rule's weights when
    computed elsewhere (over more output dimensions than ``parts`` holds)."""
    if weights is not None:
        pass
    elif rule == "absdot":
        weights = (parts @ bias).abs()
    elif rule == "norm":
        weights = parts.norm(dim=-1)
    else:  # equal
        weights = (parts != 0).any(-1).to(parts.dtype)
    total = weights.sum(0, keepdim=True)
    shares = torch.where(total > 0, weights / total.clamp_min(torch.finfo(parts.dtype).tiny),
                         torch.full_like(weights, 1.0 / parts.shape[0]))
    return parts + shares[..., None] * bias


def layer_norm(parts: torch.Tensor, real_input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
               include_biases: bool, rule: str) -> torch.Tensor:
    """LayerNorm of ``parts`` [S, N, D] whose sum is ``real_input`` [N, D]: centred per part, divided by the real
    input's standard deviation, scaled by the gain; the LayerNorm's bias shared out."""
    real = real_input.float()
    scale = torch.rsqrt(real.var(-1, unbiased=False, keepdim=True) + eps)  # [N, 1]
    out = (parts - parts.mean(-1, keepdim=True)) * scale * weight
    return share_bias(out, bias, rule) if include_biases else out


def _affine_parts(parts: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, include_biases: bool, rule: str
                  ) -> torch.Tensor:
    out = parts @ weight.T
    return share_bias(out, bias, rule) if include_biases else out


def _ffn(x: torch.Tensor, w: BlockWeights, slope: torch.Tensor, include_biases: bool, rule: str) -> torch.Tensor:
    """The FFN on parts ``x`` [S, N, H] with slopes [N, I]: ``W2 (slope * (W1 x_s + share_s b1)) + share'_s b2``.

    With many sources (and absdot or no biases) it goes through the per-target matrix ``W2 diag(slope_t) W1``
    [N, H, H] instead of the [S, N, I] intermediate: the same result (absdot's ``<W1 x_s, b1> = <x_s, W1^T b1>``)
    for about half the arithmetic on long texts.
    """
    (w1, b1), (w2, b2) = w.ffn_in, w.ffn_out
    sources, _, hidden = x.shape
    if rule != "absdot" or sources * FAST_FFN_SOURCES < hidden:
        f = _affine_parts(x, w1, b1, include_biases, rule) * slope
        return _affine_parts(f, w2, b2, include_biases, rule)
    equivalent = (w2 * slope[:, None, :]) @ w1  # [N, H, H]
    f = torch.bmm(x.transpose(0, 1), equivalent.transpose(1, 2)).transpose(0, 1)  # [S, N, H]
    if not include_biases:
        return f
    weights = (x @ (w1.T @ b1)).abs()  # |<W1 x_s, b1>|, [S, N]
    total = weights.sum(0, keepdim=True)
    shares = torch.where(total > 0, weights / total.clamp_min(torch.finfo(x.dtype).tiny),
                         torch.full_like(weights, 1.0 / sources))
    f = f + shares[..., None] * ((slope * b1) @ w2.T)  # the shared b1 through the activation and W2
    return share_bias(f, b2, rule)


def _block(state: torch.Tensor, w: BlockWeights, probs: torch.Tensor, ln1_in: torch.Tensor, slope: torch.Tensor,
           ln2_in: torch.Tensor, first: bool, include_biases: bool, rule: str, chunk_elements: int) -> None:
    """Propagate ``state`` [S, T, H] (sources x targets) through one block, in place."""
    sources, tokens, hidden = state.shape
    heads = w.heads
    size = w.value[0].shape[0] // heads
    wv, bv = w.value
    wo, bo = w.attention_out
    # value projections of every source's vectors, laid out per head for the attention mix: [heads, T, S * d]
    values = torch.empty(heads, tokens, sources, size, device=state.device, dtype=state.dtype)
    diagonal = torch.arange(tokens, device=state.device)
    for h in range(heads):
        rows = slice(h * size, (h + 1) * size)
        v = state @ wv[rows].T  # [S, T, d]
        if first:  # x^0 is diagonal: a value's bias belongs to its own token; kept without include_biases too,
            v[diagonal, diagonal] += bv[rows]  # as the official DecompX does (it runs the model's own value layer)
        values[h] = v.transpose(0, 1)
    values = values.view(heads, tokens, sources * size)
    attention_bias = bo if first else wo @ bv + bo
    width = max(w.ffn_in[0].shape[0], hidden)
    chunk = max(1, chunk_elements // max(1, sources * width, hidden * width))
    for start in range(0, tokens, chunk):
        t = slice(start, min(tokens, start + chunk))
        n = t.stop - t.start
        mixed = torch.bmm(probs[:, t].float(), values)  # [heads, n, S * d]
        mixed = mixed.view(heads, n, sources, size).permute(2, 1, 0, 3).reshape(sources, n, heads * size)
        x = mixed @ wo.T + state[:, t]
        del mixed
        if include_biases:
            x = share_bias(x, attention_bias, rule)
        x = layer_norm(x, ln1_in[t], *w.ln1, include_biases, rule)
        f = _ffn(x, w, slope[t], include_biases, rule)
        state[:, t] = layer_norm(x + f, ln2_in[t], *w.ln2, include_biases, rule)


@_no_grad
def propagate(weights: Sequence[BlockWeights], rec: Recording, row: int, *, include_biases: bool = True,
              bias_rule: str = "absdot", chunk_elements: int = CHUNK_ELEMENTS) -> Iterator[torch.Tensor]:
    """Yield the decomposition of text ``row`` at layers 0, 1, ..., L: a float32 tensor [S, T, H] over its real
    (non-padding) tokens, ``[s, t]`` = source s's part of token t. Its sum over sources is x^l. The same tensor is
    updated in place from one layer to the next: clone what you keep."""
    keep = rec.mask[row].nonzero().flatten()
    x0 = rec.embeddings[row, keep].float()
    n = keep.numel()
    state = torch.zeros(n, n, x0.shape[-1], device=x0.device)
    diagonal = torch.arange(n, device=x0.device)
    state[diagonal, diagonal] = x0
    yield state
    for i, w in enumerate(weights):
        probs = rec.probs[i][row][:, keep][:, :, keep]
        slope = zo_slope(rec.pre_act[i][row, keep], rec.act[i][row, keep])
        _block(state, w, probs, rec.ln1_in[i][row, keep], slope, rec.ln2_in[i][row, keep], i == 0, include_biases,
               bias_rule, chunk_elements)
        yield state


def _full_output_weights(parts: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, rule: str) -> torch.Tensor:
    """The bias rule's weights [S, N] of ``parts`` [S, N, H] through the whole linear layer (``weight`` [D, H],
    ``bias`` [D]) without computing its D outputs: absdot ``|<W p, b>| = |<p, W^T b>|``, norm ``||W p|| =
    sqrt(p^T W^T W p)``, equal: non-zero inputs. A vocabulary head decomposed at a few columns then shares its
    bias exactly as if all were computed, so the result does not depend on the other texts of the batch."""
    if rule == "absdot":
        return (parts @ (weight.T @ bias)).abs()
    if rule == "norm":
        gram = weight.T @ weight
        return torch.einsum("snh,hk,snk->sn", parts, gram, parts).clamp_min(0).sqrt()
    return (parts != 0).any(-1).to(parts.dtype)


@_no_grad
def decompose_head(steps: Sequence[Step], parts: torch.Tensor, real: torch.Tensor, *, include_biases: bool = True,
                   bias_rule: str = "absdot", columns: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Decompose the head on one pooled token: ``parts`` [S, H] summing to ``real`` [H].

    Returns (contributions [S, C], outputs [C]): each source's share of the head's outputs, and the head run on
    ``real`` in float32 (what the contributions sum to). ``columns`` selects the last linear's output rows.
    """
    parts, x = parts.float()[:, None, :], real.float()[None, :]
    for i, step in enumerate(steps):
        if step.kind == "linear":
            selected = columns if i == len(steps) - 1 else None
            weight, bias = affine(step.module, selected)
            if selected is None or not include_biases:
                parts = _affine_parts(parts, weight, bias, include_biases, bias_rule)
            else:  # the bias shares of the full output layer, whichever columns are read: batch-independent
                weights = _full_output_weights(parts, *affine(step.module), bias_rule)
                parts = share_bias(parts @ weight.T, bias, bias_rule, weights)
            x = x @ weight.T + bias
        elif step.kind == "activation":
            fx = step.module(x)
            parts = parts * zo_slope(x, fx)
            x = fx
        else:
            weight, bias, eps = _layer_norm_parameters(step.module)
            parts = layer_norm(parts, x, weight, bias, eps, include_biases, bias_rule)
            x = F.layer_norm(x, x.shape[-1:], weight, bias, eps)
    return parts[:, 0], x[0]
