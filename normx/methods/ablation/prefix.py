"""Ablated forward passes that share the prompt's unchanged beginning: a mask removes sources from some token on, and
every token before its first removed one is the same token at the same position as in the whole sequence, with the
same keys and values. One pass over the whole sequence keeps its key-value cache; each ablated sequence then runs
only its kept tokens from its first removed source on (and the response), on that cache cut at that token. A mask
that keeps the first half of the prompt costs half a pass, one that removes only the last source costs its question
and response; the outcomes equal :func:`normx.methods.ablation.forwards.outcomes`' (the same sequences, read from the
same positions) to float rounding.

Where it holds: decoders whose cache is transformers' plain per-layer key / value tensors (``DynamicLayer``: Llama,
Qwen, Mistral without a sliding window, GPT-NeoX, ...). A model's continuation from a cut cache is checked once per
model against its own pass over the whole sequence (:func:`verified`); a model it does not hold for is read with
whole passes (``outcomes``), and the method's settings say which ran.
"""

from __future__ import annotations

import numpy as np

from normx._torch import torch
from normx.core.batch import id_tensor
from normx.core.hooks import hooked, output_tensor
from normx.core.verdicts import Verdicts
from normx.methods.ablation.stems import runs, stems
from normx.methods.response import ResponseContext

# what one more forward pass costs beside its rows, in rows: a 2-core CPU reads a 135M model's weights in about as
# long as it runs 60 rows (a card launches its kernels in less); a split cares only for the order of magnitude
CALL_ROWS = 64
# the memory of a masked pass, bounded whatever the prompt's length: its rows hold a copy each of the cache cut, so
# at most PASS_TOKENS tokens of sequence a pass (fewer rows on a long prompt, one past it), and its queries go
# WINDOW at a time, so its explicit mask [rows, queries, keys] holds at most WINDOW x PASS_TOKENS entries
PASS_TOKENS = 32768
WINDOW = 2048
_VERDICTS = Verdicts()  # model -> {dtype: whether its cut cache continues as its own pass}


def plain_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """The (keys, values) [1, heads, T, d] of every layer of a transformers ``DynamicCache`` of plain layers, or None
    for any other cache (sliding windows, linear attention, quantised, legacy tuples)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    if type(cache) is not DynamicCache or not cache.layers:
        return None
    out = []
    for layer in cache.layers:
        if type(layer) is not DynamicLayer or not isinstance(getattr(layer, "keys", None), torch.Tensor):
            return None
        out.append((layer.keys, layer.values))
    return out


class Prefix:
    """One pass over the whole sequence (``ids`` [T], prompt then response), kept for the ablated sequences: its
    last hidden states [T, H] and its per-layer keys / values (None where the model's cache is not plain). With
    ``values``, each block's value vectors [T, kv heads, d] too (``values``: the method reading them, named in an
    error), captured from the blocks' value projections as :class:`~normx.methods.decoder.norm_rows.NormRows` reads
    them: a reading that continues from the cache cut at a row (:meth:`cache_until`, :meth:`values_until`) then runs
    only its own rows."""

    def __init__(self, ctx: ResponseContext, values: str | None = None):
        from normx.methods.decoder.heads import block_attention, decoder_shape

        self.ctx = ctx
        model, adapter = ctx.model, ctx.adapter
        ids = id_tensor(ctx.ids, ctx.handle.device)[None]
        kwargs = {k: v for k, v in adapter.forward_kwargs.items() if k != "use_cache"}
        read = {} if values is None else block_attention(
            model, list(range(1, decoder_shape(model, adapter)[0] + 1)), values, values=True)
        captured: dict[int, torch.Tensor] = {}

        def keep(key, _args, _kwargs, output):
            captured[int(key)] = read[int(key)].value_vectors(output)[0].detach()

        with ctx.handle.using(), torch.no_grad(), hooked({str(k): r.values for k, r in read.items()}, keep):
            out = model.base_model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, **kwargs)
        self.hidden = output_tensor(out)[0]
        self.layers = plain_layers(_returned_cache(out))
        self.values = captured

    def cache_until(self, row: int):
        """The model's key/value cache of the sequence's first ``row`` tokens, cut from the whole pass's (a copy: a
        pass continued on it leaves this one as it was); only where the cache is plain (``layers``)."""
        from transformers.cache_utils import DynamicCache

        if self.layers is None:
            raise ValueError("the model's cache is not plain per-layer keys and values: it cannot be cut")
        return DynamicCache(ddp_cache_data=[(k[:, :, :row].clone(), v[:, :, :row].clone()) for k, v in self.layers])

    def values_until(self, row: int) -> dict[int, torch.Tensor]:
        """Each block's value vectors [row, kv heads, d] of the first ``row`` tokens (kept with ``values``)."""
        if not self.values:
            raise ValueError("this pass kept no value vectors: make it with values= the method that reads them")
        return {layer: vectors[:row] for layer, vectors in self.values.items()}

    def continue_from(self, starts: list[int], rows: list[list[int]], grafts: list | None = None,
                      keep: bool = False):
        """The last hidden states [B, W, H] of ``rows`` (token ids; row r the tokens after the whole sequence's first
        ``starts[r]``), each read after its own prefix from the cache, right-padded to the longest row: one forward
        pass, or one per :data:`WINDOW` of the rows' tokens, each continuing the cache the one before it left. The
        cache is cut at the largest start; a row with a smaller one is kept from the cached keys past its own start
        by its attention mask (additive, in the model's dtype, so eager and SDPA attention read it alike), and its
        positions continue from its start. ``grafts[r]`` (a :meth:`continue_from` ``keep`` of another row: its
        first token's position and its keys / values per layer) puts that row's keys after the whole pass's cut at
        its first position: row r then starts where the graft ends. ``keep``: also each row's own keys and values,
        ``(start, [(keys [1, kv heads, len, d], values) per layer])``, to graft other rows on."""
        from transformers.cache_utils import DynamicCache

        ctx = self.ctx
        device, dtype = self.hidden.device, self.hidden.dtype
        width, count, cut = max(len(r) for r in rows), len(rows), max(starts)
        ids = torch.zeros((count, width), dtype=torch.long)
        for r, row in enumerate(rows):
            ids[r, :len(row)] = id_tensor(row)
        ids = ids.to(device)
        begin = torch.tensor(starts, device=device)
        positions = begin[:, None] + torch.arange(width, device=device)[None]
        before = torch.arange(cut, device=device)[None] < begin[:, None]  # [B, cut]: the cached keys a row reads
        cache = DynamicCache(ddp_cache_data=_cut_cache(self.layers, starts, grafts, cut)) if cut else None
        kwargs = {k: v for k, v in ctx.adapter.forward_kwargs.items() if k != "use_cache"}
        backbone = ctx.model.base_model
        found = []
        with ctx.handle.using(), torch.no_grad():
            for first in range(0, width, WINDOW):
                last = min(first + WINDOW, width)
                own = torch.ones(last - first, last, dtype=torch.bool, device=device).tril(first)  # a row's own past
                allowed = torch.cat([before[:, None, :].expand(count, last - first, cut),
                                     own[None].expand(count, -1, -1)], dim=2)  # padding reads its own past: finite
                mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed,
                                                                                           torch.finfo(dtype).min)
                out = backbone(input_ids=ids[:, first:last], attention_mask=mask[:, None],
                               position_ids=positions[:, first:last], use_cache=True,
                               **_cache_argument(backbone, cache), **kwargs)
                cache = _returned_cache(out) if cache is None else cache
                found.append(output_tensor(out))
        hidden = found[0] if len(found) == 1 else torch.cat(found, dim=1)
        if not keep:
            return hidden
        layers = plain_layers(cache)
        if layers is None:
            raise ValueError("the model returned a cache that is not plain per-layer keys and values")
        kept = [(start, [(k[r:r + 1, :, cut:cut + len(row)].clone(), v[r:r + 1, :, cut:cut + len(row)].clone())
                         for k, v in layers]) for r, (start, row) in enumerate(zip(starts, rows))]  # (copies: the
        # pass's cache of every row is let go)
        return hidden, kept


def _cut_cache(layers, starts: list[int], grafts: list | None, cut: int) -> list:
    """Each layer's (keys, values) [rows, kv heads, cut, d]: the whole pass's cache cut at ``cut`` for every row, or
    where row r has a graft (its keys from its first position ``at`` on), the whole pass's first ``at`` and then the
    graft's (past ``starts[r]`` nothing a row reads: its attention mask keeps it out)."""
    count = len(starts)
    if not grafts or all(g is None for g in grafts):
        return [(k[:, :, :cut].expand(count, -1, -1, -1).contiguous(),
                 v[:, :, :cut].expand(count, -1, -1, -1).contiguous()) for k, v in layers]
    out = []
    for layer, (k, v) in enumerate(layers):
        keys = k[:, :, :cut].expand(count, -1, -1, -1).clone()
        values = v[:, :, :cut].expand(count, -1, -1, -1).clone()
        for r, graft in enumerate(grafts):
            if graft is not None:
                at, grafted = graft
                gk, gv = grafted[layer]
                keys[r:r + 1, :, at:at + gk.shape[2]] = gk
                values[r:r + 1, :, at:at + gv.shape[2]] = gv
        out.append((keys, values))
    return out


def pass_rows(ctx: ResponseContext) -> int:
    """Ablated sequences a forward pass runs: the call's ``internal_batch_size`` (else its ``batch_size``; one for a
    model that cannot take padded batches), fewer where they would hold more than :data:`PASS_TOKENS` tokens of
    sequence (each its copy of the cache), at least one."""
    asked = ctx.handle.rows_per_pass(int(ctx.options.get("internal_batch_size") or ctx.batch_size))
    return max(1, min(asked, PASS_TOKENS // max(len(ctx.ids), 1)))


def whole_rows(ctx: ResponseContext) -> int:
    """Ablated sequences a pass runs where each runs whole (no cut cache): :func:`pass_rows`, fewer where the
    causal mask the model makes for a padded batch, [rows, tokens, tokens], would hold more than ``WINDOW x
    PASS_TOKENS`` entries (one row, unpadded, needs none)."""
    return max(1, min(pass_rows(ctx), WINDOW * PASS_TOKENS // max(len(ctx.ids), 1) ** 2))


def _returned_cache(out):
    """The key-value cache a forward returned (transformers >= 5.x: ``cache``; before: ``past_key_values``)."""
    found = getattr(out, "cache", None)
    return found if found is not None else getattr(out, "past_key_values", None)


def _cache_argument(backbone, cache) -> dict:
    """The keyword a backbone takes its cache by (``cache`` where its forward names it, else
    ``past_key_values``)."""
    import inspect

    if cache is None:
        return {}
    return {"cache" if "cache" in inspect.signature(backbone.forward).parameters else "past_key_values": cache}


def response_hidden(prefix: Prefix, sources: list[list[int]], keeps: np.ndarray, per_pass: int,
                    progress=None) -> tuple[list[torch.Tensor | None], list[int]]:
    """Each mask's hidden states [n, H] at the positions that predict the response tokens, read from ``prefix``;
    None for a mask that removes every prompt token from its first removed one on with nothing before it (its
    sequence starts anew: whole passes read it). The stretches several masks read alike after their first removed
    token run once first (:func:`~normx.methods.ablation.stems.stems`), and those masks continue from them. Also the
    tokens run for each mask (a stem's counted with its first mask)."""
    ctx = prefix.ctx
    n, length = ctx.steps, ctx.prompt_length
    ids = np.asarray(ctx.ids)
    response = list(ctx.ids[length:])
    keeps = np.asarray(keeps, bool)
    out: list[torch.Tensor | None] = [None] * len(keeps)
    tokens = [0] * len(keeps)
    every = runs(sources, keeps, length)
    for m in set(range(len(keeps))) - {run.mask for run in every}:
        out[m] = prefix.hidden[length - 1:length - 1 + n]  # (a mask that removes no token)
    found = [run for run in every if not run.anew]
    grafts: dict[int, tuple] = {}  # run -> (its stem's keys, the stem's length, the stem's last hidden state)
    shared = stems(found, CALL_ROWS / per_pass, CALL_ROWS)
    for chunk in chunks([(stem, stem.start, ids[stem.kept].tolist()) for stem in shared], per_pass):
        hidden, kept = prefix.continue_from([start for _, start, _ in chunk], [row for _, _, row in chunk], keep=True)
        for r, (stem, _, row) in enumerate(chunk):
            tokens[found[stem.members[0]].mask] += len(row)
            for i in stem.members:
                grafts[i] = (kept[r], len(row), hidden[r, len(row) - 1:len(row)])
    leaves = []  # (mask, start, graft, row)
    for i, run in enumerate(found):
        graft = grafts.get(i)
        skip = 0 if graft is None else graft[1]
        row = ids[run.kept[skip:]].tolist() + response
        leaves.append((run.mask, run.start + skip, graft, row))
        tokens[run.mask] += len(row)
    for chunk in chunks(leaves, per_pass):
        hidden = prefix.continue_from([start for _, start, _, _ in chunk], [row for *_, row in chunk],
                                      [None if graft is None else graft[0] for _, _, graft, _ in chunk])
        for r, (m, start, graft, row) in enumerate(chunk):
            last = len(row) - 1  # the position of the last response token, which predicts nothing
            rows = hidden[r, max(last - n, 0):last]
            if last - n < 0:  # the first response token is predicted from the token before the row (its stem's)
                rows = torch.cat([prefix.hidden[start - 1:start] if graft is None else graft[2], rows])
            out[m] = rows
        if progress is not None:
            progress(len(chunk))
    return out, tokens


def tolerance(prefix: Prefix) -> float:
    """How far (relative to the largest) a continuation's hidden states may be from the whole pass's: float32
    rounding, or half precision's."""
    return 1e-3 if prefix.hidden.dtype == torch.float32 else 5e-2


def chunks(runs: list, per_pass: int, call: int = CALL_ROWS) -> list[list]:
    """``runs`` (each ending in its row of ids) in forward passes of at most ``per_pass`` rows, cut so that the work
    is least: rows sorted longest first, each pass costing ``call`` rows (reading the weights, launching the
    kernels) plus its rows times its longest (padding is work thrown away); an exact split by dynamic programming."""
    ordered = sorted(runs, key=lambda run: -len(run[-1]))
    lengths = [len(run[-1]) for run in ordered]
    best = [0.0] + [float("inf")] * len(ordered)
    cut = [0] * (len(ordered) + 1)
    for end in range(1, len(ordered) + 1):
        for begin in range(max(0, end - per_pass), end):
            cost = best[begin] + call + (end - begin) * lengths[begin]
            if cost < best[end]:
                best[end], cut[end] = cost, begin
    bounds, end = [], len(ordered)
    while end:
        bounds.append((cut[end], end))
        end = cut[end]
    return [ordered[a:b] for a, b in reversed(bounds)]


def verified(ctx: ResponseContext, prefix: Prefix, tolerance: float) -> bool:
    """Whether the model's continuation from a cut cache gives its own pass's hidden states (checked once per model
    and dtype, on this sequence: its last ``min(8, prompt)`` prompt tokens and the response read after the rest)."""
    model = ctx.model
    dtype = str(prefix.hidden.dtype)
    known = _VERDICTS.get(model, dtype)
    if known is not None:
        return known
    if prefix.layers is None:
        verdict = False
    else:
        start = max(ctx.prompt_length - 8, 1)
        other = ctx.prompt_length - 1  # a second row with another start: the batched, masked path as masks run it
        again = prefix.continue_from([start, other], [ctx.ids[start:], ctx.ids[other:]])
        again = torch.cat([again[0, :len(ctx.ids) - start], again[1, :len(ctx.ids) - other]]).float()
        whole = torch.cat([prefix.hidden[start:], prefix.hidden[other:]]).float()
        scale = float(whole.abs().max()) or 1.0
        verdict = bool(torch.isfinite(again).all()) and float((again - whole).abs().max()) <= tolerance * scale
    _VERDICTS.record(model, dtype, verdict)
    return verdict
