"""The one-pass per-head readings a calibrated context method weighs: for every response token y_t, read at the
position that predicts it (q_t = prompt_length - 1 + t), one number per block l, head h and key token i, from ONE
forward pass with eager attention (:func:`normx.methods.decoder.maps.read_blocks`):

- ``attention``: alpha^(l,h)_(q_t,i), the head's attention probability (AT2's feature; grouped-query heads as the
  model repeats them);
- ``norm``: alpha^(l,h)_(q_t,i) * ||W_O^h v_i^(l,h)||, the same weight times the size of what head h moves from
  token i (Kobayashi's norm-based attention, per head);
- ``logit``: alpha^(l,h)_(q_t,i) * <W_O^h v_i^(l,h), g_t>, what head h moves from token i read by the gradient g_t
  of log p(y_t | y_<t) at q_t's last hidden state, through the model's final norm and head (a signed direct effect
  on the token's log-probability, in nats to first order);
- ``knockout``: G^(l,h)_(t,i), the gradient of the whole response's log-probability with respect to an additive
  bias on head h's attention score from q_t to token i (:mod:`normx.methods.decoder.knockout`: the first-order
  change if q_t attended less to i, through every later block and response position); ``knockout_abs``: |G|.
  These two need no eager pass: one forward over the prompt, one over the response's rows on its cache, and one
  backward through those rows (about 1.1 forward passes); the other families one eager pass (and, for ``logit``,
  one backward through the final norm and head).

Some families are per source or summed over heads (their weight tables are 1 x 1; :func:`source_readings`), for methods
that know the prompt's sources (the ablation methods' ``sources`` option):

- ``tokens``: the source's number of tokens (what removing that much context does, whatever it says);
- ``source_knockout``: the exact drop in the response's log-probability when the source's tokens are hidden from
  the response's rows at every block and head (:func:`normx.methods.decoder.knockout.hidden_source_outcomes`: one
  pass over the response's rows per source, batched, on the prompt's cache);
- ``query_knockout``: the same drop with the source hidden from the prompt's last rows as well, those after it (the
  query's: the question or claim that the model reads the sources with), as many as a budget allows
  (:func:`query_first_row`: the cache up to the first re-read row plus one pass over the re-read rows per source and
  one unhidden, at most :data:`QUERY_BUDGET` rows per token of the sequence);
- ``reread``: each source's effect in a small surrogate fitted per context (:mod:`~normx.methods.calibrated.
  surrogate`) to :data:`REREAD_MASKS` balanced re-read ablations (:func:`normx.methods.decoder.rereads.
  masked_rereads`: the removed sources hidden from the last rows, the positions closed up), as many last rows as
  :data:`REREAD_BUDGET` allows (:func:`reread_first_row`);
- ``presence``: the gradient of the response's log-probability with respect to the source's log-presence (a bias
  log p on every attention score to its tokens from the rows after it) at half presence, every source's bias log 1/2
  in the pass (:func:`normx.methods.decoder.presence.presence_gradients`: the slope of the response at the centre of
  ContextCite's random masks), taken through as many last rows as :data:`PRESENCE_BUDGET` allows
  (:func:`presence_first_row`); a reading of the whole response, each step's share an even split, kept per token
  (each token its own columns' gradient: a part of a source sums to its own share); sources the caller names
  ``whole`` (a question after the documents) read at full presence;
- ``response_norm``: the ``norm`` family summed over blocks and heads (alpha^(l,h)_(q_t,i) * ||W_O^h v_i^(l,h)||, one
  weight), read in the presence reading's plain pass over its last rows (eager attention there:
  :class:`~normx.methods.decoder.norm_rows.NormRows`), so with ``presence`` it costs no pass of its own (asked
  alone, it runs that reading all the same); per step, as the per-head families are.

:func:`head_readings` hands each block's [families, heads, steps, tokens] block to a ``reduce`` callback inside the
pass (so a pass keeps what ``reduce`` returns, not every block's readings): the calibrated method contracts it with
its weights, the calibration sums it over the steps.

Layer 3 (methods): imports ``normx.core``, ``normx.models`` and the decoder readings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from normx._torch import torch
from normx.core.batch import id_tensor
from normx.core.forward import Pass
from normx.errors import InvalidInputError
from normx.methods.ablation import spread
from normx.methods.calibrated.surrogate import balanced_masks, ridge_effects
from normx.methods.decoder.heads import block_attention, check_response, decoder_shape
from normx.methods.decoder.knockout import hidden_source_outcomes, knockout_gradients
from normx.methods.decoder.maps import read_blocks
from normx.methods.decoder.presence import HALF, presence_gradients
from normx.methods.decoder.rereads import masked_rereads
from normx.methods.response import response_positions

FAMILIES = ("attention", "norm", "logit", "knockout", "knockout_abs", "tokens", "source_knockout", "query_knockout",
            "reread", "presence", "response_norm")
KNOCKOUT = ("knockout", "knockout_abs")  # read by the knockout pass, not the eager one
# one number per source: 1 x 1 weight tables
SCALAR = ("tokens", "source_knockout", "query_knockout", "reread", "presence", "response_norm")
QUERY_BUDGET = 1.6  # query_knockout's rows: the cache's plus (sources + 1) x the hidden rows, per token of the sequence
REREAD_MASKS = 8  # reread's balanced masks (besides keeping everything)
REREAD_BUDGET = 1.45  # reread's rows: the cache's plus (masks + 1) x the re-read rows, per token of the sequence
PRESENCE_BUDGET = 1.45  # presence: one forward pass, its last rows again with the bias, a backward through them (x2)
PRESENCE_MAX_ROWS = 256  # presence's rows at most: on long prompts its memory stays linear in the keys


def check_families(families: Sequence[str]) -> tuple[str, ...]:
    families = tuple(families)
    bad = [f for f in families if f not in FAMILIES]
    if not families or bad or len(set(families)) != len(families):
        raise InvalidInputError(f"feature families {families!r} are not allowed; use one or more of {FAMILIES}, "
                                "each once")
    return tuple(f for f in FAMILIES if f in families)  # one order everywhere


def shape(model, adapter) -> tuple[int, int]:
    """(blocks, query heads) of a decoder: the shape of one family's weights."""
    return decoder_shape(model, adapter)


def head_readings(handle, ids: Sequence[int], prompt_length: int, families: Sequence[str],
                  reduce: Callable[[int, torch.Tensor], Any], method: str) -> tuple[dict[int, Any], torch.Tensor]:
    """One forward pass over ``ids`` (a prompt of ``prompt_length`` tokens, then the response): ``({block l:
    reduce(l, readings [families, heads, steps, tokens] float32)}, logits [steps, V] predicting each response
    token)``. ``handle``: :func:`normx.core.handle.model_handle`'s (``.base``, ``.adapter``, ``.device``,
    ``.using()``)."""
    families = tuple(f for f in check_families(families) if f not in SCALAR)
    if not families:
        raise InvalidInputError(f"{method}: head_readings reads per-head families, got only per-source ones")
    model, adapter = handle.base, handle.adapter
    total = len(ids)
    check_response(model, adapter, total, prompt_length, method)
    blocks, _ = shape(model, adapter)
    knocked, logits = _knockout_parts(handle, ids, prompt_length, families, method)
    eager = [f for f in families if f not in KNOCKOUT]
    if not eager:
        return {layer: reduce(layer, torch.stack([knocked[layer][f] for f in families]))
                for layer in range(1, blocks + 1)}, logits
    tensor = id_tensor(ids, handle.device)[None]
    run = Pass(model, adapter, {"input_ids": tensor, "attention_mask": torch.ones_like(tensor)}, [blocks])
    queries = id_tensor(response_positions(prompt_length, total), handle.device)[None]
    wants_values = "norm" in families or "logit" in families
    read = block_attention(model, list(range(1, blocks + 1)), method, values=wants_values)
    later: dict[int, tuple] = {}  # logit family: (alpha, values, W_O) kept until the gradients are known
    out: dict[int, Any] = {}

    def keep(block, rows, values):
        alpha = rows[0].float()  # [H, Q, T]
        parts = {"attention": alpha}
        if values is not None:
            w_o = block.head_projections(alpha.shape[0]).float()  # [H, d, hidden]
            v = values[0].float()  # [T, H, d]
            if "norm" in families:
                size = torch.einsum("thd,hdo->tho", v, w_o).norm(dim=-1)  # [T, H]
                parts["norm"] = alpha * size.T[:, None, :]
            if "logit" in families:
                later[block.layer] = (alpha, v, w_o)
                return None
        parts.update(knocked.get(block.layer, {}))
        out[block.layer] = reduce(block.layer, torch.stack([parts[f] for f in families]))
        return None

    with handle.using(), torch.no_grad():
        read_blocks(run, queries, read, method, keep)
        last = run.hidden[blocks][0, queries[0]]  # [Q, hidden]
    targets = tensor[0, prompt_length:]
    grads, logits = _gradients(model, adapter, last, targets, handle, bool(later))
    with torch.no_grad():
        for layer, (alpha, v, w_o) in later.items():
            parts = {"attention": alpha}
            if "norm" in families:
                parts["norm"] = alpha * torch.einsum("thd,hdo->tho", v, w_o).norm(dim=-1).T[:, None, :]
            pulled = torch.einsum("hdo,qo->qhd", w_o, grads)  # (W_O^h)^T g_t
            parts["logit"] = alpha * torch.einsum("thd,qhd->hqt", v, pulled)
            parts.update(knocked.get(layer, {}))
            out[layer] = reduce(layer, torch.stack([parts[f] for f in families]))
    return out, logits


def query_first_row(total: int, prompt_length: int, sources: Sequence[Sequence[int]]) -> int:
    """The first row ``query_knockout`` re-reads: as early as the budget allows (cache rows + (sources + 1) x
    re-read rows <= QUERY_BUDGET x ``total``), not before the first source's second token, and never after the
    response's first row ``prompt_length - 1`` (the response's rows at least). Each source is hidden from the
    re-read rows that come after it (:func:`~normx.methods.decoder.knockout.hidden_source_outcomes`): a context's
    sources from the whole query when the budget reaches back to the context, a query's own sentences from what
    follows them."""
    return _last_rows(total, prompt_length, sources, int(((QUERY_BUDGET - 1) * total + 1) / len(sources)))


def reread_first_row(total: int, prompt_length: int, sources: Sequence[Sequence[int]],
                     masks: int = REREAD_MASKS) -> int:
    """The first row ``reread`` re-reads: the cache's rows plus (masks + 1) x the re-read rows within
    REREAD_BUDGET x ``total``, not before the first source's second token, the response's rows at least."""
    return _last_rows(total, prompt_length, sources, int(((REREAD_BUDGET - 1) * total + 1) / masks))


def presence_first_row(total: int, prompt_length: int, sources: Sequence[Sequence[int]]) -> int:
    """The first row ``presence`` takes its gradient through: one pass, then the last rows again with the bias and a
    backward pass through them (about twice a forward's work) within PRESENCE_BUDGET x ``total`` rows and at most
    PRESENCE_MAX_ROWS of them (the backward keeps each block's attention of those rows over every key: a fixed
    number of rows keeps that linear in the prompt), not before the first source's second token, the response's rows
    at least."""
    return _last_rows(total, prompt_length, sources, min(int((PRESENCE_BUDGET - 1) * total / 3), PRESENCE_MAX_ROWS))


def _last_rows(total: int, prompt_length: int, sources: Sequence[Sequence[int]], rows: int) -> int:
    """The first of the last ``rows`` rows (T - 1 - rows), not before the first source's second token and not after
    the response's first row ``prompt_length - 1``."""
    start = min(min(members) for members in sources) + 1
    return min(prompt_length - 1, max(start, total - 1 - rows))


def source_readings(handle, ids: Sequence[int], prompt_length: int, sources: Sequence[Sequence[int]],
                    families: Sequence[str], method: str, batch_size: int = 8, whole: Sequence[int] = (),
                    prefix=None) -> tuple[dict[str, np.ndarray], torch.Tensor | None]:
    """{family: [steps, T] float64} for the per-source families asked for: each step's row over the sequence's
    ``T`` tokens, a source's value being its tokens' entries summed (:func:`by_source`; summed over the steps,
    ``tokens`` is the source's size and ``source_knockout`` / ``query_knockout`` its drop in the response's
    log-probability). A per-source value is spread evenly over the source's tokens, ``presence`` kept per token
    (:func:`~normx.methods.decoder.presence.presence_gradients`); each step gets an even share of a whole-response
    reading. ``whole``: the indices of sources ``presence`` reads at full presence (the others at 1/2). ``prefix``: a
    pass over the whole sequence the presence reading continues from (``presence_gradients``). And the logits
    predicting the response (None unless a knockout family ran)."""
    steps, total = len(ids) - prompt_length, len(ids)
    per_source: dict[str, np.ndarray] = {}
    logits = None
    if "tokens" in families:
        per_source["tokens"] = np.repeat(np.array([[len(m) / steps] for m in sources], np.float64), steps, axis=1)
    firsts = {"source_knockout": prompt_length - 1, "query_knockout": query_first_row(len(ids), prompt_length,
                                                                                      sources)}
    drops: dict[int, np.ndarray] = {}  # by first re-read row: one pass where both families re-read the same rows
    for family in (f for f in firsts if f in families):
        if firsts[family] not in drops:
            log_p, logits = hidden_source_outcomes(handle, ids, prompt_length, sources, method, batch_size,
                                                   firsts[family])
            drops[firsts[family]] = (log_p[0][None] - log_p[1:]).numpy()
        per_source[family] = drops[firsts[family]]
    if "reread" in families:
        drawn = balanced_masks(len(sources), REREAD_MASKS)
        first_row = reread_first_row(len(ids), prompt_length, sources)
        log_p, logits = masked_rereads(handle, ids, prompt_length, sources, drawn, method, first_row, batch_size)
        per_source["reread"] = ridge_effects(drawn, log_p)
    out = {family: spread(sources, values, total) for family, values in per_source.items()}
    if "presence" in families or "response_norm" in families:  # one presence pass reads both
        whole = {int(j) for j in whole}
        if not whole <= set(range(len(sources))):
            raise InvalidInputError(f"{method}: whole names sources {sorted(whole)!r:.80}; there are {len(sources)}")
        first_row = presence_first_row(len(ids), prompt_length, sources)
        presence = [1.0 if j in whole else HALF for j in range(len(sources))]
        reading = presence_gradients(handle, ids, prompt_length, sources, method, first_row, presence,
                                     norm="response_norm" in families, prefix=prefix)
        logits = reading.logits
        rows = np.zeros((steps, total))
        rows[:, :prompt_length] = reading.gradients[None] / steps
        out["presence"] = rows
        if reading.norm is not None:
            out["response_norm"] = np.pad(reading.norm, ((0, 0), (0, 1)))  # (no row reads the last token)
    return {family: out[family] for family in families if family in out}, logits


def by_source(rows: np.ndarray, sources: Sequence[Sequence[int]]) -> np.ndarray:
    """[sources, ...]: each source's tokens' entries of ``rows`` [..., T] summed (from [steps, T] rows: each step's
    score per source; from one [T] row, such as a presence reading's tokens: one number per source)."""
    return np.stack([np.asarray(rows)[..., list(m)].sum(-1) for m in sources])


def _knockout_parts(handle, ids, prompt_length: int, families, method: str
                    ) -> tuple[dict[int, dict[str, torch.Tensor]], torch.Tensor | None]:
    """{block l: {family: [heads, steps, tokens]}} for the knockout families asked for (zero in the last token's
    column: no row reads it), and the logits of that pass (None when none is asked for)."""
    wanted = [f for f in families if f in KNOCKOUT]
    if not wanted:
        return {}, None
    grads, logits = knockout_gradients(handle, ids, prompt_length, method)  # [L, H, n, T - 1]
    grads = torch.nn.functional.pad(grads, (0, 1))
    parts = {}
    for index in range(grads.shape[0]):
        g = grads[index]
        parts[index + 1] = {f: (g if f == "knockout" else g.abs()) for f in wanted}
    return parts, logits


def _gradients(model, adapter, last: torch.Tensor, targets: torch.Tensor, handle, wanted: bool
               ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """g_t = d log p(y_t) / d x_(q_t)^L [Q, hidden] through the final norm and the head (None unless ``wanted``),
    and the logits [Q, V]."""
    with handle.using(), torch.set_grad_enabled(wanted):
        x = last.detach().float().requires_grad_(True)
        norm = adapter.norm_module(model)
        hidden = x.to(next(model.parameters()).dtype)
        hidden = norm(hidden) if norm is not None else hidden
        logits = adapter.head(model, hidden, None).float()  # [Q, V]
        if not wanted:
            return None, logits.detach()
        chosen = torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0]
        (grad,) = torch.autograd.grad(chosen.sum(), x)
    return grad.float(), logits.detach()
