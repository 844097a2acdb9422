"""Re-read ablations: the response's log-probability with sets of the prompt's sources removed, approximated on ONE
key/value cache by re-reading only the sequence's last rows.

The prompt's first ``first_row`` tokens are read once (the model's own cache). For each mask (bool per source: True
= kept) the rows from ``first_row`` to the end (the query's last rows and the response's) are run again on a copy
of that cache with

- every token of a removed source hidden from every re-read row after it (a large negative bias on its key at every
  block and head, added to the mask the model builds: :func:`normx.methods.decoder.knockout`'s mechanism), and
- the positions closed up as if the removed tokens were gone: each cached key re-rotated back by the number of
  removed tokens before it, each re-read row given its position minus the removed tokens before it. Relative
  distances are then those of the shortened prompt. A rotary model's keys carry their position as a rotation, so
  the re-rotation uses the model's own embeddings (the ``position_embeddings`` each block's attention module receives
  in the cache's pass, read at the shifts: cos(-d) = cos(d), sin(-d) = -sin(d), divided by their norm so that a
  scaled table rotates once) and its family's own ``apply_rotary_pos_emb``. A model without rotary embeddings
  (learned or ALiBi positions) cannot close them up this way and is refused by name where a removed token comes
  before the first re-read row (where none does, the re-read rows' positions are all that move).

What stays approximate: the cached rows of the prompt after a removed source have read it (what they carry of it
reaches the re-read rows); only rows from ``first_row`` on are run without it. Hiding a source from every row after
it (``first_row`` at the first source) with the positions closed up is the removal itself, up to floating point
(tests/methods/test_rereads.py checks that against leaving the tokens out of the ids).

Cost: one pass over the first ``first_row`` tokens and, per mask, one over the ``T - first_row`` re-read rows
(batched); memory: the cache once per batched mask.

Layer 3 (methods): imports ``normx.core``, ``normx.models`` and the decoder heads.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np

from normx._torch import torch
from normx.core.hooks import record_calls
from normx.errors import InvalidInputError, UnsupportedModelError
from normx.methods.decoder.knockout import _biased, _check_rows, _setup
from normx.models.attention_scores import rotate_keys


def _cache_and_rotations(model, modules, tensor, first_row: int, keywords, method: str):
    """The model's cache of the first ``first_row`` tokens, and per block (in order) the (cos, sin) [first_row, d]
    its attention module received there (each block its own: families rotate some blocks by other bases), or None
    when the model's attention receives no rotary embeddings."""
    with torch.no_grad(), record_calls(modules) as calls:
        out = model(input_ids=tensor[:, :first_row], use_cache=True, **keywords[1])
    cache = next((out[name] for name in ("cache", "past_key_values") if out.get(name) is not None), None)
    if cache is None:
        raise UnsupportedModelError(f"{type(model).__name__} returned no key/value cache with use_cache=True; "
                                    f"{method} re-reads the last rows on the prompt's cache")
    rotations = []
    for key in sorted(modules, key=int):
        embeddings = calls[key].kwargs.get("position_embeddings")
        if not isinstance(embeddings, (tuple, list)) or len(embeddings) != 2:
            return cache, None
        cos, sin = (e[0].float() for e in embeddings)  # [first_row, d]
        size = torch.sqrt(cos ** 2 + sin ** 2).clamp_min(1e-12)
        rotations.append((cos / size, sin / size))
    return cache, rotations


def _shift_keys(modules, cache, rotations, shifts: torch.Tensor, method: str) -> None:
    """Rotate every cached key of batch row b and position j back by ``shifts[b, j]`` positions, in place, each
    block by its own embeddings and its module's family function."""
    layers = getattr(cache, "layers", None)
    if not layers or len(layers) != len(rotations):
        raise UnsupportedModelError(f"{method}: the model's {type(cache).__name__} holds "
                                    f"{len(layers) if layers else 0} key layers for {len(rotations)} blocks")
    for key, layer, (cos, sin) in zip(sorted(modules, key=int), layers, rotations, strict=True):
        keys = getattr(layer, "keys", None)
        if not isinstance(keys, torch.Tensor) or keys.shape[-2] != shifts.shape[1]:
            raise UnsupportedModelError(
                f"{method}: a cached block holds {None if keys is None else keys.shape[-2]} keys for "
                f"{shifts.shape[1]} tokens (a sliding-window or compressed cache), so its positions cannot be "
                "closed up")
        back = (cos[shifts].to(keys.dtype), -sin[shifts].to(keys.dtype))  # [B, first_row, d]: cos(-d), sin(-d)
        rotated = rotate_keys(modules[key], keys, back)
        if isinstance(rotated, str):
            raise UnsupportedModelError(f"{method}: {rotated}")
        layer.keys = rotated


def masked_rereads(handle, ids: Sequence[int], prompt_length: int, sources: Sequence[Sequence[int]],
                   masks: np.ndarray, method: str, first_row: int, batch_size: int = 8, close_up: bool = True
                   ) -> tuple[np.ndarray, torch.Tensor]:
    """``(log p [M, n] float64, logits [n, V] float32)``: each response token's log-probability under each mask
    (bool [M, sources], True = kept), each removed source hidden from the re-read rows from ``first_row`` on that
    come after it, positions closed up (see the module's docstring; ``close_up=False``: the positions kept, the
    removed tokens only hidden); and the logits predicting the response under the first mask."""
    model, modules, keywords, _, tensor = _setup(handle, ids, prompt_length, method)
    total = tensor.shape[1]
    n, keys = total - prompt_length, total - 1
    masks = np.asarray(masks, bool)
    if masks.ndim != 2 or masks.shape[1] != len(sources) or not len(masks):
        raise InvalidInputError(f"{method}: masks must be [masks, {len(sources)} sources], got {masks.shape}")
    _check_rows(sources, prompt_length, first_row, method, "the first re-read row")
    dtype = next(model.parameters()).dtype
    removed = np.zeros((len(masks), keys), bool)
    for j, members in enumerate(sources):
        removed[np.ix_(~masks[:, j], list(members))] = True
    before = np.cumsum(removed, 1) - removed  # removed tokens before each position
    rows = np.arange(first_row, keys)
    targets = tensor[0, prompt_length:]
    log_p = np.zeros((len(masks), n))
    logits = None
    with handle.using(), torch.no_grad():
        cache, rotations = _cache_and_rotations(model, modules, tensor, first_row, keywords, method)
        if close_up and rotations is None and removed[:, :first_row].any():
            raise UnsupportedModelError(
                f"{method} closes up the positions of removed tokens by re-rotating the cached keys, but "
                f"{type(model).__name__}'s attention receives no rotary position embeddings")
        step = max(1, int(batch_size))
        for start in range(0, len(masks), step):
            part = slice(start, min(start + step, len(masks)))
            count = part.stop - part.start
            hide = torch.zeros(count, 1, len(rows), keys, dtype=dtype, device=tensor.device)
            for b, gone in enumerate(removed[part]):  # a removed key, from the re-read rows after it
                cols = np.flatnonzero(gone)
                if len(cols):
                    later = torch.as_tensor(rows[:, None] > cols[None, :], device=tensor.device)
                    low = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=tensor.device)
                    hide[b, 0, :, cols] = torch.where(later, low, torch.zeros((), dtype=dtype, device=low.device))
            copied = copy.deepcopy(cache)
            copied.batch_repeat_interleave(count)
            extra = {}
            if close_up:  # (the cached keys need turning only where a removed token comes before the first row)
                if removed[part, :first_row].any():
                    shifts = torch.as_tensor(before[part, :first_row], device=tensor.device)
                    _shift_keys(modules, copied, rotations, shifts, method)
                extra["position_ids"] = torch.as_tensor(rows[None] - before[part][:, rows], device=tensor.device)
            head = {"logits_to_keep": n} if keywords[1] else {}
            with _biased(model, modules, lambda _key, bias=hide: bias, len(rows), keys, method):
                out = model(input_ids=tensor.expand(count, -1)[:, first_row:keys], use_cache=True,
                            **{keywords[0]: copied}, **head, **extra)
            scores = torch.log_softmax(out.logits[:, -n:].double(), -1)
            log_p[part] = scores.gather(2, targets[None, :, None].expand(count, -1, 1))[..., 0].cpu().numpy()
            if logits is None:
                logits = out.logits[0, -n:].float()
    return log_p, logits
