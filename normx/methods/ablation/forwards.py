"""The ablated forward passes: the response's per-token outcomes with some sources of the prompt removed.

A source is removed by leaving its tokens out of the id sequence: the model reads the remaining prompt ids, then the
response's ids, numbered from 0 as any sequence (the positions close up, as if the text had been written without
it). ContextCite removes the source's text and tokenises again; removing the ids instead keeps every other token the
same token (no re-tokenisation drift at the seams: a space or a merge across the cut) and the response's ids exactly
the ones explained. The sequences are batched (right padding, which a causal model's real tokens never see) and
every pass reads the head at the response positions only. A sequence left with no prompt token (every source
removed, and a tokenizer that adds no BOS) starts from the tokenizer's BOS (else EOS) token, as GPT-2's
``<|endoftext|>`` starts a text.
"""

from __future__ import annotations

import numpy as np

from normx._torch import torch
from normx.core.batch import id_tensor
from normx.core.hooks import output_tensor
from normx.errors import InvalidInputError
from normx.methods.ablation.prefix import pass_rows, whole_rows
from normx.methods.response import ResponseContext, response_positions

HEAD_ELEMENTS = 2 ** 25  # logits one head call makes when many ablated sequences are read at once (128 MiB float32)


def kept_ids(ctx: ResponseContext, sources: list[list[int]], keep: np.ndarray) -> list[int]:
    """The sequence's ids without the tokens of the sources ``keep`` (bool [sources]) marks False."""
    removed = {i for members, kept in zip(sources, keep) if not kept for i in members}
    prompt = [token for i, token in enumerate(ctx.item.ids[:ctx.prompt_length]) if i not in removed]
    if not prompt:  # every prompt token removed (a tokenizer that adds no BOS): start from its BOS / EOS token
        start = next((t for t in (getattr(ctx.tokenizer, "bos_token_id", None),
                                  getattr(ctx.tokenizer, "eos_token_id", None)) if t is not None), None)
        if start is None:
            raise InvalidInputError("removing every source leaves no prompt token, and this tokenizer has no BOS or "
                                    "EOS token to start from; leave some of the prompt out of the sources")
        prompt = [start]
    return prompt + list(ctx.item.ids[ctx.prompt_length:])


def outcomes(ctx: ResponseContext, sources: list[list[int]], keeps: np.ndarray, desc: str = "ablations",
             shared_prefix=False) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """One forward pass per distinct row of ``keeps`` (bool [M, sources]; row 0 should keep every source), batched:
    ``(log-probabilities [M, n], logit-probabilities [M, n], logits [n, V] of row 0)``, float64 outcomes of each
    response token under each ablation; a mask drawn twice is run once (with few sources, random masks repeat). The
    logit-probability of a token is ``log p - log(1 - p)``, computed as ContextCite does: its logit minus the
    log-sum-exp of every other logit. ``shared_prefix``: each ablated sequence runs from its first removed token on,
    after one pass over the whole sequence (:mod:`normx.methods.ablation.prefix`), where the model's cache allows
    (True; or the :class:`~normx.methods.ablation.prefix.Prefix` of that pass, already verified)."""
    keeps = np.asarray(keeps, bool).reshape(len(keeps), len(sources))
    _, first_at, inverse = np.unique(keeps, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first_at)  # each distinct mask once, in the order it first comes (row 0 stays first)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    distinct = keeps[first_at[order]]
    if shared_prefix is not False:
        log_p, logit_p, first = _prefix_outcomes(ctx, sources, distinct, desc, shared_prefix)
    else:
        log_p, logit_p, first = _distinct_outcomes(ctx, sources, distinct, desc)
    where = rank[np.asarray(inverse).reshape(-1)]
    return log_p[where], logit_p[where], first


def read_outcomes(ctx: ResponseContext, hidden: torch.Tensor, repeats: int = 1
                  ) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """From the hidden states [repeats * n, H] that predict the response's tokens (``repeats`` sequences' rows one
    after another): each token's log-probability and logit-probability [repeats * n] (float64) and the logits."""
    targets = id_tensor(ctx.ids[ctx.prompt_length:] * repeats, hidden.device)
    logits = ctx.adapter.head(ctx.model, hidden, None).float()  # [n, V]
    chosen = logits.gather(1, targets[:, None])[:, 0]
    log_p = (chosen - torch.logsumexp(logits, -1)).double().cpu().numpy()
    others = logits.scatter(1, targets[:, None], float("-inf"))
    return log_p, (chosen - torch.logsumexp(others, -1)).double().cpu().numpy(), logits


def masks_per_head(ctx: ResponseContext) -> int:
    """Masks whose response rows one head call reads at once (its weights read once; their logits at most
    :data:`HEAD_ELEMENTS`)."""
    vocabulary = max(int(getattr(ctx.model.config.get_text_config(), "vocab_size", 0) or 0), 1)
    return max(1, HEAD_ELEMENTS // (vocabulary * max(ctx.steps, 1)))


def _prefix_outcomes(ctx: ResponseContext, sources: list[list[int]], keeps: np.ndarray, desc: str, given
                     ) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    import normx.methods.ablation.prefix as shared

    whole = given if isinstance(given, shared.Prefix) else shared.Prefix(ctx)
    if whole is not given and not shared.verified(ctx, whole, shared.tolerance(whole)):
        ctx.notes["shared_prefix"] = False
        return _distinct_outcomes(ctx, sources, keeps, desc)
    ctx.notes["shared_prefix"] = True
    per_pass = pass_rows(ctx)
    bar = _progress(len(keeps), desc) if len(keeps) > per_pass else None
    hidden, tokens = shared.response_hidden(whole, sources, keeps, per_pass, None if bar is None else bar.update)
    if bar is not None:
        bar.close()
    n = ctx.steps
    log_p, logit_p = np.zeros((len(keeps), n)), np.zeros((len(keeps), n))
    first = None
    fresh = [m for m, h in enumerate(hidden) if h is None]  # sequences that start anew: whole passes
    if fresh:
        log_p[fresh], logit_p[fresh], _ = _distinct_outcomes(ctx, sources, keeps[fresh], desc)
    ran = [m for m, h in enumerate(hidden) if h is not None]
    per_head = masks_per_head(ctx)
    with ctx.handle.using(), torch.no_grad():
        for at in range(0, len(ran), per_head):  # the head over many masks' rows at once: its weights read once
            chunk = ran[at:at + per_head]
            stacked = torch.cat([hidden[m] for m in chunk])
            chunk_log_p, chunk_logit_p, logits = read_outcomes(ctx, stacked, len(chunk))
            log_p[chunk], logit_p[chunk] = chunk_log_p.reshape(len(chunk), n), chunk_logit_p.reshape(len(chunk), n)
            if chunk[0] == 0:
                first = logits[:n]
    if first is None:
        first = read_outcomes(ctx, whole.hidden[ctx.prompt_length - 1:len(ctx.ids) - 1])[2]
    ctx.notes["ablated_tokens"] = int(sum(tokens)) + len(ctx.ids)
    return log_p, logit_p, first


def _distinct_outcomes(ctx: ResponseContext, sources: list[list[int]], keeps: np.ndarray, desc: str
                       ) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    model, adapter = ctx.model, ctx.adapter
    n = ctx.steps
    sequences = [kept_ids(ctx, sources, keep) for keep in keeps]
    per_pass = whole_rows(ctx)
    log_p = np.zeros((len(sequences), n))
    logit_p = np.zeros((len(sequences), n))
    first = None
    bar = _progress(len(sequences), desc) if len(sequences) > per_pass else None
    for start in range(0, len(sequences), per_pass):
        chunk = sequences[start:start + per_pass]
        width = max(len(s) for s in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for r, seq in enumerate(chunk):
            ids[r, :len(seq)] = id_tensor(seq)
            mask[r, :len(seq)] = 1
        ids, mask = ids.to(ctx.handle.device), mask.to(ctx.handle.device)
        with ctx.handle.using(), torch.no_grad():
            hidden = output_tensor(model.base_model(input_ids=ids, attention_mask=mask, **adapter.forward_kwargs))
            for r, seq in enumerate(chunk):
                where = torch.tensor(response_positions(len(seq) - n, len(seq)), dtype=torch.long, device=ids.device)
                log_p[start + r], logit_p[start + r], logits = read_outcomes(ctx, hidden[r, where])
                if first is None:
                    first = logits
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return log_p, logit_p, first


def _progress(total: int, desc: str):
    """A progress bar on a terminal (tqdm decides: none when standard error is not one)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="pass", dynamic_ncols=True, leave=False, disable=None)
