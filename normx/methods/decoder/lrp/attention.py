"""A decoder block's self-attention recomputed with AttnLRP's rules from the module's own query / key / value
projections, and checked against what the module itself computed.

With q, k, v the projections' outputs (after the attention's own ``q_norm`` / ``k_norm``, whose identity rule is
already applied), cut into ``head_dim``-wide heads, the rotary position embedding (cos, sin) the block passed to the
module, and the module's ``scaling``:

    q' = rope(q), k' = rope(k)            rotate_half, on the first cos.shape[-1] dimensions (all, or a partial rotary;
                                          none in a layer whose attention has use_rope = 0, SmolLM3's NoPE layers)
    A = softmax(q' k'^T * scaling + mask)   in float32, cast back, as transformers' eager attention
    out = W_O((A v) per head, heads concatenated)   the output projection

Rules, as LXT 2.1's efficient AttnLRP: the gradient at q' and k' is divided by 4 and at v by 2 (the uniform rule
for the products q'k'^T and A v; LXT's factors), the softmax keeps its own gradient (AttnLRP's softmax rule as
Gradient×Input), and key-value heads are repeated for grouped-query attention as ``repeat_kv`` does. The mask is the
one the block gave its attention (a causal one where it gave none).

The model runs its own attention (sdpa, or eager). The differentiated A v is
``torch.nn.functional.scaled_dot_product_attention`` on q', k', v', the mask and the scaling, whose backward pass is
the softmax's own gradient with nothing kept per query and key (on CPU its fused kernel keeps no T x T tensor, so a
pass's memory grows with T, not T^2; LXT's eager attention keeps each block's probabilities).

Checked on every pass, at the real (non-padding) query rows: the recomputed output equals the module's own output,
and where the module returns its probabilities (eager attention) the recomputed probabilities equal them (computed
without autograd, ``CHECK_ROWS`` query rows at a time, and let go); a model that fails (attention sinks,
soft-capped scores, another rotary layout, a gated output, ...) is refused with
:class:`~normx.errors.UnsupportedModelError`. The module's output is then replaced by its own value with the
recomputation's gradient (:func:`~normx.methods.decoder.lrp.rules.with_backward`).
"""

from __future__ import annotations

from normx._torch import torch
from normx.core.hooks import output_tensor
from normx.errors import UnsupportedModelError
from normx.methods.decoder.lrp.parts import BlockParts
from normx.methods.decoder.lrp.rules import divide_gradient, with_backward
from normx.methods.numerics import off_by, tolerance

QUERY_KEY_FACTOR = 4  # LXT 2.1 (lxt/efficient/patches.py, wrap_attention_forward): query and key gradients / 4
VALUE_FACTOR = 2  # ... and value gradients / 2
CHECK_ROWS = 128  # query rows per block of the probability check (its transient memory: heads x 128 x T floats)


def _heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[B, T, heads * d] or [B, T, heads, d] -> [B, heads, T, d]."""
    return x.reshape(*x.shape[:2], -1, head_dim).transpose(1, 2)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of ``x`` [B, heads, T, d] with ``cos`` / ``sin`` [B or 1, T, r] (r <= d: the first r
    dimensions rotate, the rest pass), as Llama's ``apply_rotary_pos_emb``."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    rotated, rest = x[..., :r], x[..., r:]
    return torch.cat((rotated * cos + _rotate_half(rotated) * sin, rest), dim=-1)


def _mask(kwargs: dict, length: int, scores: torch.Tensor) -> torch.Tensor:
    """The additive mask [B or 1, 1, T, T] the block gave its attention; a causal one where it gave none (in the dtype
    and on the device of ``scores``)."""
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 4:
        mask = mask[:, :, :, :length]
        if mask.dtype == torch.bool:
            zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
            return torch.where(mask, zero, torch.full_like(zero, float("-inf")))
        return mask
    later = torch.ones(length, length, dtype=torch.bool, device=scores.device).triu(1)
    return torch.zeros(length, length, dtype=scores.dtype, device=scores.device).masked_fill(later, float("-inf"))


def _refuse(method: str, part: BlockParts, what: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"{method} recomputes block {part.layer}'s {type(part.attention).__name__} as softmax(rope(q) rope(k)^T * "
        f"scaling + mask) v through {part.name('o')} from its own projections, but {what}: this model computes its "
        "attention in a way the rules do not cover")


def _position_embeddings(args: tuple, kwargs: dict, method: str, part: BlockParts):
    found = kwargs.get("position_embeddings", args[1] if len(args) > 1 else None)
    if not (isinstance(found, (tuple, list)) and len(found) == 2
            and all(isinstance(t, torch.Tensor) for t in found)):
        raise _refuse(method, part, "the module was given no rotary position embeddings (cos, sin)")
    return found


def _check(got: torch.Tensor, want: torch.Tensor, rows: torch.Tensor, what: str, method: str, part: BlockParts,
           absolute: bool = False) -> None:
    """``got`` equals ``want`` at the real query rows (``rows`` [B, T] bool; the query axis is -2 of a probability
    tensor [B, H, T, T], axis 1 of an output [B, T, hidden])."""
    if want.dim() == 4:
        got, want = got.transpose(1, 2)[rows], want.transpose(1, 2)[rows]
    else:
        got, want = got[rows], want[rows]
    worst, scale = off_by(got, want)
    if worst > tolerance(want.dtype) * (1.0 if absolute else max(scale, 1e-6)):
        raise _refuse(method, part, f"the recomputed {what} differ from the module's own by {worst:.3g} "
                                    f"(largest {scale:.3g})")


def attention_with_rules(part: BlockParts, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, args: tuple,
                         kwargs: dict, output, rows: torch.Tensor, method: str):
    """The attention module's ``output`` (a tuple: output, probabilities) with the output replaced by itself with the
    rules' gradient, recomputed from the projections' outputs ``q``, ``k``, ``v`` of this call; ``rows`` [B, T]
    marks the real tokens, where the recomputation is checked."""
    own = output_tensor(output)
    probs = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
    length = own.shape[1]
    if probs is not None and (not isinstance(probs, torch.Tensor) or probs.dim() != 4
                              or probs.shape[-2:] != (length, length)):
        raise _refuse(method, part, "the module returned attention weights that are not [batch, heads, T, T] "
                                    "probabilities")
    cos, sin = _position_embeddings(args, kwargs, method, part)
    d = part.head_dim
    query, key, value = _heads(q, d), _heads(k, d), _heads(v, d)
    heads, groups = query.shape[1], key.shape[1]
    if not groups or heads % groups or value.shape[1] != groups or cos.shape[-1] > d:
        raise _refuse(method, part, f"its projections give {heads} query, {groups} key and {value.shape[1]} value "
                      f"heads of {d} dimensions with a {cos.shape[-1]}-dimensional rotary embedding")
    if getattr(part.attention, "use_rope", True):  # (SmolLM3's NoPE layers have use_rope = 0)
        query, key = rope(query, cos, sin), rope(key, cos, sin)
    query = divide_gradient(query, QUERY_KEY_FACTOR)
    key = divide_gradient(key, QUERY_KEY_FACTOR)
    value = divide_gradient(value, VALUE_FACTOR)
    if heads != groups:  # grouped-query attention: key-value head g serves query heads g * n .. g * n + n - 1
        key = key.repeat_interleave(heads // groups, dim=1)
        value = value.repeat_interleave(heads // groups, dim=1)
    mask = _mask(kwargs, length, query)
    if probs is not None:  # (eager attention returns them) checked a block of query rows at a time, and let go
        with torch.no_grad():
            for start in range(0, length, CHECK_ROWS):
                end = min(length, start + CHECK_ROWS)
                scores = torch.matmul(query[:, :, start:end], key.transpose(2, 3)) * part.scaling
                weights = torch.softmax(scores + mask[..., start:end, :], dim=-1, dtype=torch.float32)
                _check(weights.to(query.dtype), probs[:, :, start:end], rows[:, start:end],
                       "attention probabilities", method, part, absolute=True)
    # the same softmax(q' k'^T * scaling + mask) v, differentiated by the fused kernel (its own backward pass: the
    # softmax's gradient, nothing stored per query and key)
    mixed = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask.to(query.dtype),
                                                             scale=part.scaling)
    out = part.o(mixed.transpose(1, 2).reshape(*own.shape[:2], -1).to(own.dtype))
    _check(out, own, rows, "outputs", method, part)
    return (with_backward(own, out), *output[1:])
