"""Re-read masks on the whole pass's own cache: each mask's re-read rows (the sequence's tokens from ``first_row`` to
its last but one: the question's and the response's, after the sources) run again on the
:class:`~normx.methods.ablation.prefix.Prefix`'s cache cut at ``first_row``, every token of a removed source hidden
from every row after it, the positions kept. A re-read costs only its rows (a few dozen on a long prompt whose
question follows its documents), where a real mask runs every kept token from its first removed source on.

Many masks' rows go in ONE sequence of a pass: each mask's rows read the cached keys that mask keeps and its own rows
before them (a block-diagonal causal mask, additive, in the model's dtype), each row at its own position. So the
whole pass's cache is read, not copied, per mask: memory is the cache once and the pass's mask.

What it approximates: the cached rows after a removed source have read it, and the re-read rows keep their positions
(a removal closes them up). :func:`normx.methods.decoder.rereads.masked_rereads` closes them up (a copy of the cache
per mask, its keys re-rotated); with the positions kept it equals these to float rounding
(tests/context/test_rereads_packed.py). Read beside ``budgeted``'s real masks on ~7,000-token documents, the
closed-up re-reads paid for the masks they displaced on training contexts and these did not (docs/context.md,
"Re-reads in `budgeted`"): ``budgeted`` buys them only when asked (``rereads="auto"``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from normx._torch import torch
from normx.core.batch import id_tensor
from normx.core.hooks import output_tensor
from normx.errors import InvalidInputError
from normx.methods.ablation import MIN_ABLATIONS, designs
from normx.methods.ablation.forwards import masks_per_head, read_outcomes
from normx.methods.ablation.planning import Costs, masks_cost
from normx.methods.ablation.prefix import CALL_ROWS, WINDOW, Prefix, _cache_argument

EXTRA = 64  # re-read masks beside the real masks' own re-reads (a fold-over design of the sources)
WORTH = 2.0  # the re-reads are bought where they cost at most this many real masks (on average): docs/context.md
EXTRA_SEED = 1 << 16  # the extra masks' designs: drawn from the call's seed + this (apart from the real masks')


@dataclass(frozen=True)
class Bought:
    """Re-reads a budget buys beside the real masks: the real masks kept (the plan's first ``real``; the last left
    out to pay for the re-reads), the ``extra`` masks of the sources only re-read, the first re-read row, and what
    the re-reads cost in plain forward passes."""

    real: int
    extra: np.ndarray
    first: int
    cost: float


def cost(total: int, first: int, steps: int, count: int, costs: Costs) -> float:
    """``count`` re-reads (:func:`reread_log_p`) in plain forward passes over ``total`` tokens: each mask's rows
    (``total - 1 - first``), each row reading every key of its pass (the cached ones and the pass's rows: the
    explicit mask), a pass's call, and the head at the response's positions."""
    width = total - 1 - first
    per = masks_per_pass(total, first, costs)
    full, rest = divmod(count, per)

    def one(masks: int) -> float:
        rows = masks * width
        return rows * costs.body + costs.attention * rows * (first + rows) + CALL_ROWS * costs.body if masks else 0.0

    return (full * one(per) + one(rest) + count * steps * costs.head) / costs.plain(total)


def bought(sources: list[list[int]], columns: list[list[int]], masks: np.ndarray, prompt_length: int, steps: int,
           seed: int, costs: Costs, per_pass: int) -> Bought | None:
    """Re-reads in place of the last real masks, where the re-reads of the real masks and :data:`EXTRA` more cost at
    most :data:`WORTH` real masks (the plan's ``masks`` of the ``columns``: the sources, or groups of them; on a cut
    cache): as many real masks left out as pay for the re-reads (the masks and re-reads then cost no more than the
    plan's masks did); else None. The trade turns with the prompt's length: a re-read's rows are the question's and
    the response's whatever the prompt, a real mask's grow with it (docs/context.md)."""
    first = first_row(sources, prompt_length)
    total = prompt_length + steps
    planned = masks_cost(columns, masks, prompt_length, steps, True, costs, per_pass)
    if not len(masks) or cost(total, first, steps, len(masks) + EXTRA, costs) > WORTH * planned / len(masks):
        return None
    for real in range(len(masks), MIN_ABLATIONS - 1, -1):  # (the most real masks that pay for the re-reads)
        spend = cost(total, first, steps, real + EXTRA, costs)
        if masks_cost(columns, masks[:real], prompt_length, steps, True, costs, per_pass) + spend <= planned:
            return Bought(real, designs.masks(len(sources), EXTRA, seed + EXTRA_SEED, "fold_over"), first, spend)
    return None  # (they do not pay for themselves)


def first_row(sources: list[list[int]], prompt_length: int) -> int:
    """The first re-read row: the token after the last source, at most the prompt's last (the row that predicts the
    response's first token must be re-read)."""
    return min(max((max(members) + 1 for members in sources if members), default=1), prompt_length - 1)


def masks_per_pass(total: int, first: int, costs: Costs) -> int:
    """Masks whose re-read rows (``total - 1 - first`` each) one pass runs, at least one: about as many rows as
    make a pass's own cost (:data:`~normx.methods.ablation.prefix.CALL_ROWS` rows of the model's weights) equal the
    keys of the other masks' rows that each row's explicit mask reads for nothing (sqrt(CALL_ROWS x body /
    attention) rows: ~440 on SmolLM2), at most :data:`~normx.methods.ablation.prefix.WINDOW`."""
    rows = min(WINDOW, np.sqrt(CALL_ROWS * costs.body / max(costs.attention, 1e-9)))
    return max(1, int(rows // max(total - 1 - first, 1)))


def reread_log_p(prefix: Prefix, sources: list[list[int]], keeps: np.ndarray, first: int) -> np.ndarray:
    """Each response token's log-probability [M, n] (float64) under each mask of ``keeps`` (bool [M, sources], True
    = kept), re-read from row ``first`` on (:func:`first_row`) on ``prefix``'s cache: every token of a removed source
    hidden from every re-read row after it, the positions kept."""
    from transformers.cache_utils import DynamicCache

    ctx = prefix.ctx
    total, n, length = len(ctx.ids), ctx.steps, ctx.prompt_length
    keeps = np.asarray(keeps, bool).reshape(-1, len(sources))
    if not 0 < first <= length - 1:
        raise InvalidInputError(f"re-reads start after the first token and at most at the prompt's last, "
                                f"{length - 1}; got {first}")
    if prefix.layers is None:
        raise ValueError("the model's cache is not plain per-layer keys and values: it cannot be cut")
    removed = np.zeros((len(keeps), total - 1), bool)
    for j, members in enumerate(sources):
        removed[np.ix_(~keeps[:, j], list(members))] = True
    width = total - 1 - first  # (each mask's re-read rows)
    device, dtype = prefix.hidden.device, prefix.hidden.dtype
    row_ids = id_tensor(ctx.ids[first:total - 1], device)
    own_positions = torch.arange(first, total - 1, device=device)
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    low = torch.finfo(dtype).min
    kwargs = {k: v for k, v in ctx.adapter.forward_kwargs.items() if k != "use_cache"}
    backbone = ctx.model.base_model
    reads = length - 1 - first  # (the first row, within a mask's rows, that predicts a response token)
    hidden = []
    step = masks_per_pass(total, first, Costs.of(ctx.model))
    with ctx.handle.using(), torch.no_grad():
        for start in range(0, len(keeps), step):
            part = removed[start:start + step]
            count = len(part)
            gone = torch.as_tensor(part, device=device)
            cached = ~gone[:, :first]  # [c, first]: the cached keys each mask's rows read
            mine = ~gone[:, first:]  # [c, width]: its own rows a row reads (a removed one only by itself)
            own = causal[None] & (mine[:, None, :] | torch.eye(width, dtype=torch.bool, device=device)[None])
            allowed = torch.zeros(count, width, first + count * width, dtype=torch.bool, device=device)
            allowed[:, :, :first] = cached[:, None, :]
            for b in range(count):  # (a mask's rows read only their own rows: block-diagonal)
                allowed[b, :, first + b * width:first + (b + 1) * width] = own[b]
            mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, low)
            mask = mask.reshape(1, 1, count * width, first + count * width)
            cache = DynamicCache(ddp_cache_data=[(k[:, :, :first], v[:, :, :first]) for k, v in prefix.layers])
            out = backbone(input_ids=row_ids.repeat(count)[None], attention_mask=mask,
                           position_ids=own_positions.repeat(count)[None], use_cache=True,
                           **_cache_argument(backbone, cache), **kwargs)
            rows = output_tensor(out)[0].reshape(count, width, -1)[:, reads:reads + n]
            hidden.append(rows.reshape(count * n, -1))
            del out, cache  # (the pass's cache let go before the next)
        stacked = torch.cat(hidden)
        per_head = masks_per_head(ctx)
        log_p = np.concatenate([read_outcomes(ctx, stacked[at * n:(at + per_head) * n],
                                              min(per_head, len(keeps) - at))[0]
                                for at in range(0, len(keeps), per_head)])
    return log_p.reshape(len(keeps), n)
