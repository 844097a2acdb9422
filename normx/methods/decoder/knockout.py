"""Attention knockout gradients at the response's rows: how the response's log-probability would change, to first
order, if the position that predicts a response token attended less to a token of the prompt.

For a prompt of P tokens and a response y_1..y_n, the rows are the positions q_t = P - 1 + t that predict y_t.
Every block l and query head h gets an additive bias b^(l,h)_(t,i) on its attention scores from row q_t to key i
(added to the mask the model itself builds, so causal, sliding-window and padding rules stay the model's); at
b = 0 the pass IS the model's. The reading is the gradient

    G^(l,h)_(t,i) = d log P(y_1..y_n | prompt) / d b^(l,h)_(t,i)  at b = 0
                  = alpha^(l,h)_(q_t,i) * (dlogP/dalpha_i - sum_k alpha_k dlogP/dalpha_k),

the first-order change in the whole response's log-probability when row q_t's attention to key i is scaled by
e^b: removing key i from that row (b -> -inf) moves log P by about -G, so G is the key's first-order support.

Cost: one forward pass over the prompt's first P - 1 tokens (no gradient; the model's own key/value cache), one
over the n rows with that cache and gradients on, and one backward pass through those n rows only. Memory: the
cache plus n rows' activations plus G (blocks x heads x n x (P + n - 1) numbers).

The model's attention implementation must hand each attention module a mask to add to (eager and sdpa do; a
flash-attention kernel takes none, which is an :class:`UnsupportedModelError` naming it).

The exact counterpart (:func:`hidden_source_outcomes`): the response's per-step log-probabilities with whole
sources (sets of prompt tokens) hidden from the response's rows (a large negative bias on their keys at every block
and head), each on the same cache, batched: a source's drop is what the response loses when the tokens that write
it can no longer read that source directly; what the later prompt tokens read of it stays.

Layer 3 (methods): imports ``normx.core``, ``normx.models`` and the decoder heads.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence

import numpy as np

from normx._torch import torch
from normx.core.batch import id_tensor
from normx.core.hooks import change_inputs
from normx.errors import InvalidInputError, UnsupportedModelError
from normx.methods.decoder.heads import block_attention, check_response, decoder_shape


def _keywords(model) -> tuple[str, dict]:
    """The keyword the model's forward takes its key/value cache by (transformers 5 renames it), and what the
    prompt's pass asks of the head (its logits at one position, where the forward can keep only those)."""
    names = inspect.signature(model.forward).parameters
    keyword = next((name for name in ("cache", "past_key_values") if name in names), None)
    if keyword is None:
        raise UnsupportedModelError(f"{type(model).__name__}.forward takes no key/value cache (neither `cache` nor "
                                    "`past_key_values`), which the knockout reading runs the response's rows on")
    return keyword, ({"logits_to_keep": 1} if "logits_to_keep" in names else {})


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The model's attention mask as an additive float mask (True / 1 = may attend)."""
    if mask.dtype == torch.bool:
        return torch.where(mask, torch.zeros((), dtype=dtype, device=mask.device),
                           torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=mask.device))
    return mask.to(dtype)


def _setup(handle, ids: Sequence[int], prompt_length: int, method: str):
    """(model, attention modules by block, (cache keyword, prompt pass keywords), heads, ids tensor) after the checks
    every reading makes."""
    model, adapter = handle.base, handle.adapter
    check_response(model, adapter, len(ids), prompt_length, method, least=2)
    blocks, heads = decoder_shape(model, adapter)
    modules = {str(layer): read.attention for layer, read in
               block_attention(model, list(range(1, blocks + 1)), method, values=False).items()}
    return model, modules, _keywords(model), heads, id_tensor(ids, handle.device)[None]


def _prompt_cache(model, tensor: torch.Tensor, first_row: int, keywords: tuple[str, dict], method: str):
    """The model's own key/value cache of the sequence's first ``first_row`` tokens (the rows that read
    everything)."""
    with torch.no_grad():  # (the head on one position only, where it can: the cache is what is wanted)
        first = model(input_ids=tensor[:, :first_row], use_cache=True, **keywords[1])
    cache = next((first[name] for name in ("cache", "past_key_values") if first.get(name) is not None), None)
    if cache is None:
        raise UnsupportedModelError(f"{type(model).__name__} returned no key/value cache with use_cache=True; "
                                    f"{method} runs the response's rows on the prompt's cache")
    return cache


def _biased(model, modules, bias_of, rows: int, keys: int, method: str):
    """``change_inputs`` adding ``bias_of(key)`` to the attention mask each block's module gets."""
    dtype = next(model.parameters()).dtype

    def add_bias(key, _args, kwargs):
        mask = kwargs.get("attention_mask")
        if mask is None and rows == 1:  # one row (a one-token response): sdpa builds no mask, every key is read
            mask = torch.zeros(1, 1, 1, keys, dtype=dtype, device=next(modules[key].parameters()).device)
        if not isinstance(mask, torch.Tensor):
            implementation = getattr(model.config, "_attn_implementation", None)
            raise UnsupportedModelError(
                f"{method} adds a bias to the attention mask the model builds, but block {key}'s attention "
                f"module got {type(mask).__name__} for it (attention implementation {implementation!r}; "
                "eager and sdpa pass one for more than one row)")
        if mask.shape[-2:] != (rows, keys):
            raise UnsupportedModelError(f"{method}: block {key}'s attention mask has shape {tuple(mask.shape)}, "
                                        f"not [..., {rows} rows, {keys} keys]")
        kwargs["attention_mask"] = (_additive(mask, dtype) + bias_of(key)).clamp_min(torch.finfo(dtype).min)
        return kwargs

    return change_inputs(modules, add_bias)


def _check_rows(sources: Sequence[Sequence[int]], prompt_length: int, first_row: int, method: str, what: str
                ) -> None:
    """Every source non-empty and inside the prompt; ``first_row`` (``what`` names it) after the first token and at
    most the response's first row."""
    for row, members in enumerate(sources):
        if not members or any(not 0 <= i < prompt_length for i in members):
            raise InvalidInputError(f"{method}: source {row} is empty or holds tokens outside the prompt's "
                                    f"{prompt_length}")
    if not 0 < first_row <= prompt_length - 1:
        raise InvalidInputError(f"{method}: {what} must be after the first token and at most the response's first row "
                                f"{prompt_length - 1}; got {first_row}")


def _rows_forward(model, modules, tensor, first_row: int, keep: int, keywords: tuple[str, dict], cache, bias_of,
                 method: str):
    """The model's output over the rows at positions first_row .. T - 2 on ``cache`` (of the first ``first_row``
    tokens), its logits at the last ``keep`` rows (the head on those only, where the forward can); ``bias_of=None``:
    the model's own pass, nothing added to its mask."""
    total = tensor.shape[1]
    head = {"logits_to_keep": keep} if keywords[1] else {}
    if bias_of is None:
        return model(input_ids=tensor[:, first_row:total - 1], use_cache=True, **{keywords[0]: cache}, **head)
    try:
        with _biased(model, modules, bias_of, total - 1 - first_row, total - 1, method):
            return model(input_ids=tensor[:, first_row:total - 1], use_cache=True, **{keywords[0]: cache}, **head)
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, ValueError) as exc:  # the attention code refuses a per-head or per-row float mask
        raise UnsupportedModelError(
            f"{method}: {type(model).__name__}'s attention did not run with a bias added to its mask "
            f"({type(exc).__name__}: {str(exc)[:200]})") from exc


def hidden_source_outcomes(handle, ids: Sequence[int], prompt_length: int, sources: Sequence[Sequence[int]],
                           method: str, batch_size: int = 8, first_row: int | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log p [1 + sources, n] float64, logits [n, V] float32)``: each response token's log-probability with
    nothing hidden (row 0) and with each source's tokens (indices into the prompt) hidden from the response's rows
    (positions ``prompt_length - 1`` .. T - 2) and, where ``first_row`` is earlier, from the prompt's rows between
    ``first_row`` and the response that come after the source's last token (those read the source neither; a row
    inside or before a source still reads it); ``batch_size`` hidden sources per pass on copies of one cache of the
    first ``first_row`` tokens."""
    model, modules, keywords, _, tensor = _setup(handle, ids, prompt_length, method)
    total = tensor.shape[1]
    first_row = prompt_length - 1 if first_row is None else int(first_row)
    n, keys = total - prompt_length, total - 1
    _check_rows(sources, prompt_length, first_row, method, "the first row that cannot read the sources")
    dtype = next(model.parameters()).dtype
    # row j + 1 hides source j from the rows after it (the response's always), built at once from [sources, keys]
    member = np.zeros((len(sources), keys), bool)
    if sources:
        member[np.repeat(np.arange(len(sources)), [len(m) for m in sources]),
               np.concatenate([np.asarray(m, np.int64) for m in sources])] = True
    after = np.clip([max(m) + 1 for m in sources], first_row, prompt_length - 1) - first_row
    hidden = (torch.as_tensor(member, device=tensor.device)[:, None, :]
              & (torch.arange(total - 1 - first_row, device=tensor.device)[None, :, None]
                 >= torch.as_tensor(after, device=tensor.device)[:, None, None]))  # [sources, rows, keys]
    low, zero = (torch.full((), value, dtype=dtype, device=tensor.device) for value in (torch.finfo(dtype).min, 0))
    hide = torch.cat([torch.zeros(1, *hidden.shape[1:], dtype=dtype, device=tensor.device),
                      torch.where(hidden, low, zero)])[:, None]
    targets = tensor[0, prompt_length:]
    log_p = torch.zeros(1 + len(sources), n, dtype=torch.float64)
    logits = None
    with handle.using(), torch.no_grad():
        cache = _prompt_cache(model, tensor, first_row, keywords, method)
        step = max(1, int(batch_size))
        for start in range(0, len(hide), step):
            part = hide[start:start + step]
            copied = copy.deepcopy(cache)
            copied.batch_repeat_interleave(len(part))
            out = _rows_forward(model, modules, tensor.expand(len(part), -1), first_row, n, keywords, copied,
                                lambda _key, b=part: b, method)
            scores = torch.log_softmax(out.logits[:, -n:].double(), -1)  # [B, n, V]: the response's rows
            log_p[start:start + len(part)] = scores.gather(2, targets[None, :, None].expand(len(part), -1, 1)
                                                           )[..., 0].double().cpu()
            if logits is None:
                logits = out.logits[0, -n:].float()
    return log_p, logits


def knockout_gradients(handle, ids: Sequence[int], prompt_length: int, method: str
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(G [blocks, heads, n, T - 1] float32, logits [n, V] float32)`` for a sequence of ``prompt_length`` prompt
    tokens and a response (see the module's docstring). ``handle``: :func:`normx.core.handle.model_handle`'s."""
    model, modules, keywords, heads, tensor = _setup(handle, ids, prompt_length, method)
    total = tensor.shape[1]
    n, keys = total - prompt_length, total - 1
    dtype = next(model.parameters()).dtype
    with handle.using():
        cache = _prompt_cache(model, tensor, prompt_length - 1, keywords, method)
        biases = {key: torch.zeros(1, heads, n, keys, dtype=dtype, device=handle.device, requires_grad=True)
                  for key in modules}
        with torch.enable_grad():
            out = _rows_forward(model, modules, tensor, prompt_length - 1, n, keywords, cache,
                                biases.__getitem__, method)
            logits = out.logits[0].float()
            chosen = torch.log_softmax(logits, -1).gather(1, tensor[0, prompt_length:, None]).sum()
            grads = torch.autograd.grad(chosen, [biases[key] for key in modules])
    return torch.stack([g[0] for g in grads]).float(), logits.detach()
