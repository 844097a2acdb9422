"""Source presence gradients at half presence: how much the response's log-probability leans on each source when
about half of the context is there, the regime of ContextCite's random masks (each source kept with probability
1/2) and of the LDS.

A source j's presence p_j enters the attention scores from a row after the source's last token to the source's
tokens as an additive bias log p_j (at every block and head, added to the mask the model builds; p_j = 1 is the
model as it is, p_j -> 0 the source hidden from those rows). The model reads the first ``first_row`` tokens as it
is (its own cache); the last rows, from ``first_row`` to the end, read every source at ``presence`` (1/2 by
default: each source's attention weights halved against the rest), and the reading is

    g_j = d log P(y_1..y_n | prompt) / d log p_j,

the sum of the gradients with respect to those rows' biases over the rows after the source and the source's tokens.
The best linear surrogate of a smooth response to masks that keep each source with probability 1/2 has as
coefficients the response's average slope over the masks; g_j reads the slope at one point near their centre (every
source half present to the last rows at once), in one pass. With ``first_row`` at the first source's second token
every row after a source reads it at half presence; later first rows cost less and leave out the earlier rows'
share.

The reading is kept per token: token i of source j gets the sum of the gradients with respect to the biases on its
own column (from the rows after j), so g_j is its tokens' sum and any part of a source (a sentence of a paragraph,
a differently split sentence) sums to the gradient of its own keys. ``presence`` may give each source its own
value: a source at p = 1 (a question read whole while the documents before it are half present) gets its slope at
full presence.

Cost: one pass over the first ``first_row`` tokens (no gradient: the model's cache; none where a pass over the whole
sequence already kept its cache: ``prefix``), one over the ``T - 1 - first_row`` last rows on it without bias (the
model's own logits for the response, no gradient), one with the bias and gradients on, and one backward pass through
those rows only. Memory: the cache twice, the last rows'
activations and one [rows, keys] bias.

Layer 3 (methods): imports ``normx.core``, ``normx.models`` and the decoder heads.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from normx._torch import torch
from normx.errors import InvalidInputError
from normx.methods.decoder.knockout import _check_rows, _prompt_cache, _rows_forward, _setup
from normx.methods.decoder.norm_rows import NormRows

HALF = 0.5


def _owners(members: Sequence[Sequence[int]], keys: int, method: str) -> tuple[np.ndarray, np.ndarray]:
    """(each key's source or -1 [keys], each source's last token [sources]); a token in two sources is refused."""
    owner = np.full(keys, -1, np.int64)
    flat = np.concatenate([np.asarray(m, np.int64) for m in members]) if members else np.zeros(0, np.int64)
    which = np.repeat(np.arange(len(members)), [len(m) for m in members])
    if len(np.unique(flat)) != len(flat):
        raise InvalidInputError(f"{method}: the sources overlap; each token may be in one source only")
    owner[flat] = which
    return owner, np.array([m[-1] for m in members], np.int64)


def _after_rows(owner: np.ndarray, last: np.ndarray, first_row: int, rows: int) -> np.ndarray:
    """[keys]: the index (among the ``rows`` rows from ``first_row``) of the first row after each key's source, or
    ``rows`` for a key in no source or a source no row comes after."""
    start = np.where(owner >= 0, last[np.maximum(owner, 0)] + 1 - first_row, rows)
    return np.clip(start, 0, rows)


def _presence_bias(owner: np.ndarray, start: np.ndarray, rows: int, values: Sequence[float], dtype,
                   device) -> torch.Tensor:
    """[1, 1, rows, keys]: ``values[j]`` where a row comes after source j's last token (row index >= ``start`` of
    the key) and the key is one of its tokens, 0 elsewhere; built on the device from per-key vectors (no loop over
    the sources)."""
    per_key = torch.as_tensor(np.where(owner >= 0, np.asarray(values, np.float64)[np.maximum(owner, 0)], 0.0),
                              dtype=dtype, device=device)
    after = torch.arange(rows, device=device)[:, None] >= torch.as_tensor(start, device=device)[None]
    return torch.where(after, per_key[None], torch.zeros((), dtype=dtype, device=device))[None, None].contiguous()


def _presences(presence, count: int, method: str) -> list[float]:
    """One presence in (0, 1] per source from ``presence`` (one number for all, or one per source)."""
    values = [presence] * count if isinstance(presence, (int, float)) else list(presence)
    if len(values) != count or not all(isinstance(p, (int, float)) and not isinstance(p, bool) and 0 < p <= 1
                                       for p in values):
        raise InvalidInputError(f"{method}: presence must be a number in (0, 1] or one per source ({count}), got "
                                f"{presence!r:.120}")
    return [float(p) for p in values]


@dataclass(frozen=True)
class Presence:
    """What one presence reading gives: ``gradients`` [prompt_length] float64 (each prompt token's share of its
    source's presence gradient; a source's g_j is its tokens' sum), ``logits`` [n, V] float32
    (the model's own, predicting the response), and ``norm`` [n, T - 1] float64 or None (step t's norm-based
    attention row from the position that predicts y_t, summed over blocks and heads,
    :class:`~normx.methods.decoder.norm_rows.NormRows`, read in the same plain pass when asked for)."""

    gradients: np.ndarray
    logits: torch.Tensor
    norm: np.ndarray | None = None


def presence_gradients(handle, ids: Sequence[int], prompt_length: int, sources: Sequence[Sequence[int]],
                       method: str, first_row: int | None = None, presence: float | Sequence[float] = HALF,
                       norm: bool = False, prefix=None) -> Presence:
    """The :class:`Presence` reading: each prompt token's share of its source's presence gradient (see the module's
    docstring: the gradients with respect to the biases on the token's attention scores from the rows after its
    source; 0 for a token in no source), with the gradient taken through the rows from ``first_row`` (default: the
    response's first row ``prompt_length - 1``) to the end; the model's own logits predicting the response
    (unbiased); with ``norm``, the response's norm-based attention rows read in the plain pass (eager attention
    there). ``presence``: every source's (default 1/2), or one per source. ``handle``:
    :func:`normx.core.handle.model_handle`'s. ``prefix``: a pass already run over the whole sequence whose cache the
    model continues as its own (:class:`normx.methods.ablation.prefix.Prefix`, made with value vectors where ``norm``
    is asked for): the first ``first_row`` tokens' cache and value vectors are cut from it instead of run again."""
    model, modules, keywords, heads, tensor = _setup(handle, ids, prompt_length, method)
    total = tensor.shape[1]
    n, keys = total - prompt_length, total - 1
    first_row = prompt_length - 1 if first_row is None else int(first_row)
    members = [sorted({int(i) for i in m}) for m in sources]
    _check_rows(members, prompt_length, first_row, method, "the first row the gradient is taken through")
    logs = [math.log(p) for p in _presences(presence, len(members), method)]
    dtype = next(model.parameters()).dtype
    rows = keys - first_row
    owner, last = _owners(members, keys, method)
    start = _after_rows(owner, last, first_row, rows)
    reader = NormRows(model, len(modules), heads, n, method) if norm else None
    with handle.using():
        with reader.values() if reader else nullcontext():
            if prefix is None:
                cache = _prompt_cache(model, tensor, first_row, keywords, method)
            else:  # (the rows' passes check the seeded value vectors: NormRows.rows)
                cache = prefix.cache_until(first_row)
                if reader:
                    reader.seed(prefix.values_until(first_row))
            with torch.no_grad(), reader.rows() if reader else nullcontext():
                # the model's own logits for the response: the last rows on a copy of the cache
                plain = _rows_forward(model, modules, tensor, first_row, n, keywords, copy.deepcopy(cache), None,
                                      method).logits[0, -n:].float()
        leaf = _presence_bias(owner, start, rows, logs, dtype, tensor.device).requires_grad_(True)
        with torch.enable_grad():
            out = _rows_forward(model, modules, tensor, first_row, n, keywords, cache, lambda _key: leaf, method)
            scores = out.logits[0, -n:]  # (in float32 at least)
            scores = torch.log_softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), -1)
            chosen = scores.gather(1, tensor[0, prompt_length:, None]).sum()
            (grad,) = torch.autograd.grad(chosen, leaf)
    # each key's gradients summed over the rows after its source: the rows' suffix sums read at the key's first row
    grad = grad[0, 0].double()
    suffix = torch.cat([grad.flip(0).cumsum(0).flip(0), grad.new_zeros(1, keys)])  # [rows + 1, keys]
    g = suffix.gather(0, torch.as_tensor(start, device=grad.device)[None])[0, :prompt_length].cpu().numpy()
    return Presence(g, plain, None if reader is None else reader.result().double().cpu().numpy())
