"""Response-level methods: one computation for a whole response, not one per generated token.

A method with ``Method.response`` scores a causal LM's whole response (every generated token after a prompt) from
its own forward and backward passes: the ablation methods (:mod:`normx.methods.ablation`: one forward per ablated
context) and the gradient methods' response scope, which differentiates the response's total log-probability
sum_t log p(y_t | y_<t) in ONE backward pass instead of one per token. :func:`normx.explain_generation` calls it
with a :class:`ResponseContext` (``scope="response"``, or always for ``Method.response_only`` methods) and turns its
:class:`ResponseRows` into a Generation's per-step rows.

How the rows split a response-level score over the steps is the method's to state (``ResponseRows.settings["rows"]``);
every split here keeps the sum over the steps equal to the response-level score of each token (:func:`spread`).

Layer 3 (methods): imports ``normx.core`` and ``normx.models`` only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from normx._torch import torch
from normx.core.batch import id_tensor
from normx.core.hooks import output_tensor
from normx.core.inputs import Encoded


@dataclass
class ResponseContext:
    """One sequence (a prompt's ids, then the response's) as a response-level method sees it."""

    handle: Any  # normx.core.handle.ModelHandle: .base, .adapter, .device, .using(), .rows_per_pass()
    tokenizer: Any
    prompt: str  # the prompt as given (the user's text, before any chat template)
    item: Encoded  # the whole sequence: ids, tokens, offsets in its decoded text, special flags
    prompt_length: int  # how many of item.ids are the prompt
    options: dict[str, Any] = field(default_factory=dict)  # the method's options, defaults filled in
    batch_size: int = 8  # sequences per forward pass
    notes: dict[str, Any] = field(default_factory=dict)  # what the computation tells of itself (engines it ran)

    @property
    def model(self) -> torch.nn.Module:
        return self.handle.base

    @property
    def adapter(self):
        return self.handle.adapter

    @property
    def ids(self) -> list[int]:
        return list(self.item.ids)

    @property
    def steps(self) -> int:
        return len(self.item.ids) - self.prompt_length


@dataclass
class ResponseRows:
    """What a response-level method returns for one sequence of T tokens and n response steps."""

    rows: np.ndarray  # [n, T] float32: step t's scores at the positions before its token (later entries ignored)
    logits: torch.Tensor  # [n, V] float32: the model's logits predicting each response token, unablated
    diagnostics: dict[str, list[float]] = field(default_factory=dict)  # per step
    settings: dict[str, Any] = field(default_factory=dict)  # recorded in the Generation's settings


def spread(response_row: np.ndarray, prompt_length: int) -> np.ndarray:
    """A response-level row [T] (one score per token for the whole response) as per-step rows [n, T]: each token's
    score divided evenly over the steps that see it (every step for a prompt token; for response token j, the
    steps after it), so that the sum over the steps is ``response_row`` (the last token, which no step sees, must
    score 0: it is no input to any prediction)."""
    total = len(response_row)
    n = total - prompt_length
    rows = np.zeros((n, total), np.float32)
    for t in range(n):
        p = prompt_length + t
        seen_by = n - np.maximum(np.arange(p) - prompt_length + 1, 0)  # steps t' >= t that see token j < p
        rows[t, :p] = response_row[:p] / seen_by
    return rows


def response_positions(prompt_length: int, total: int) -> list[int]:
    """The positions whose next-token prediction is a response token: prompt_length - 1 .. total - 2."""
    return list(range(prompt_length - 1, total - 1))


def log_probabilities(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) [n] from logits [n, V] (in float32)."""
    return torch.log_softmax(logits.float(), -1).gather(1, targets[:, None])[:, 0]


# ---- the gradient methods at the response level ------------------------------------------------------------------

def gradient_response(product: bool, rules: Callable | None = None, check: Callable | None = None,
                      aggregate: Callable | None = None) -> Callable[[ResponseContext], ResponseRows]:
    """A gradient method's response-level computation: one forward pass from the word embeddings over the prompt
    and the response, ONE backward pass of the response's total log-probability sum_t log p(y_t | y_<t), each
    token's attribution the gradient (``product=False``: Gradient Norm) or gradient x embedding (``product=True``:
    Gradient×Input, AttnLRP), aggregated over the embedding dimensions by ``aggregate(vectors, options)`` (default:
    the signed sum). ``rules(model, attention_mask)``: a context manager the forward runs under (AttnLRP's rules);
    ``check(ctx)`` refuses a model first. The rows spread the response's row over the steps (:func:`spread`)."""

    def compute(ctx: ResponseContext) -> ResponseRows:
        if check is not None:
            check(ctx)
        model, adapter = ctx.model, ctx.adapter
        ids = id_tensor(ctx.ids, ctx.handle.device)[None]
        mask = torch.ones_like(ids)
        where = id_tensor(response_positions(ctx.prompt_length, ids.shape[1]), ids.device)
        targets = ids[0, ctx.prompt_length:]
        with torch.no_grad():
            embeds = adapter.embedding_module(model, "word")(ids).detach()
        with ctx.handle.using(), torch.enable_grad():
            leaf = embeds.detach().requires_grad_(True)
            context = rules(model, mask) if rules is not None else _nothing()
            with context:
                hidden = output_tensor(model.base_model(inputs_embeds=leaf, attention_mask=mask,
                                                        **adapter.forward_kwargs))
                logits = adapter.head(model, hidden[0, where], None)  # [n, V]
            objective = log_probabilities(logits, targets)
            (grad,) = torch.autograd.grad(objective.sum(), leaf)
        vectors = grad[0].float() * (embeds[0].float() if product else 1.0)  # [T, H]
        row = (aggregate(vectors, ctx.options) if aggregate is not None else vectors.sum(-1)).cpu().numpy()
        row[ctx.prompt_length - 1 + ctx.steps:] = 0.0  # the last token is no input to any prediction
        return ResponseRows(
            rows=spread(row.astype(np.float32), ctx.prompt_length), logits=logits.detach().float(),
            diagnostics={"log_probability": objective.detach().float().cpu().tolist()},
            settings={"scope": "response", "rows": "one backward pass of the response's total log-probability; each "
                      "token's score divided evenly over the steps that see it (their sum is the response's row)"})

    return compute


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
