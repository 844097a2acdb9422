"""Every generation step of a gradient method from ONE forward pass over the whole sequence.

In a causal LM the logit at position q depends only on the tokens at positions <= q, so the gradient of step t's
target logit z_t = logits[p - 1, y_t] (p = prompt_length + t: the generated token's index) with respect to the word
embeddings of the whole sequence is zero after p - 1 and, at positions < p, what a pass on the prefix ids[:p] gives.
So one forward pass over the prompt and its continuation, from the word embeddings, serves every step, and each step
costs one backward pass through it (the per-prefix recipe: one forward and one backward pass per step, over the
prefix). The backward passes run in batches of steps (``torch.autograd.grad(..., is_grads_batched=True)``: one
vectorised backward pass with one one-hot output gradient per step) while the forward's graph is kept
(``retain_graph``); the graph and every gradient are freed before the next sequence.

Batch sizes come from a memory budget, as a stated rule (:func:`steps_per_backward`, :func:`rows_per_forward`):
an activation of one token is ``hidden + intermediate`` numbers of the model's dtype, and a batch holds what fits
``STEP_BUDGET_MIB`` on top of one forward pass's graph:

- steps per backward pass: the budget over what a vectorised backward pass holds for each step it runs
  (``BACKWARD_FACTOR`` activations per token, of the one layer it is going through), at least 1, at most every step;
- Integrated Gradients' interpolation points per forward pass (``internal_batch_size`` when given, as Captum's rows
  per pass): the budget over what a forward pass keeps for its backward pass per point (``ACTIVATION_FACTOR``
  activations per token and layer), at least 1. One forward pass per chunk of points over the whole sequence serves
  every step; the baseline and the input are one more pass (no graph).

Measured on SmolLM2 (30 layers, 576 + 1,536 numbers a token; 512 tokens, 32 steps, CPU, float32): one forward pass's
graph held 846 MiB with one step per backward pass and 1,044 MiB with 8 (so ~28 MiB a step: ~6.5 activations of a
layer per token; the factors round up), and the graph ~5.4 activations per token and layer.

Methods: Gradient Norm and Gradient×Input (the gradient, or gradient × embedding, aggregated as the method's
``aggregation`` option says), AttnLRP (embedding × the gradient taken through its rules,
:func:`normx.methods.decoder.lrp.context.attnlrp_rules`, summed; ``relevance_sum`` and ``conservation`` per step) and
Integrated Gradients (``convergence_delta`` and ``output_difference`` per step). Each method's own registration
(:mod:`normx.methods.gradients`, :mod:`normx.methods.decoder.lrp.method`) sets its ``Method.steps`` from here.

Layer 3 (methods): imports ``normx.core``, ``normx.models``, the parts the gradient methods share
(:mod:`normx.methods.gradient_parts`) and the response context (:mod:`normx.methods.response`); no method module.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import numpy as np

from normx._torch import torch
from normx.core.batch import id_tensor
from normx.core.hooks import output_tensor
from normx.core.inputs import pad_token_id
from normx.errors import InvalidInputError
from normx.methods.gradient_parts import aggregate, rule_parameters, word_embeddings
from normx.methods.response import ResponseContext, ResponseRows, response_positions

STEP_BUDGET_MIB = 128  # what one batch of steps (or of interpolation points) may hold on top of the forward's graph
ACTIVATION_FACTOR = 6  # a forward pass keeps ~6 activations (hidden + intermediate numbers) per token and layer
BACKWARD_FACTOR = 8  # a vectorised backward pass holds ~8 activations per token (of one layer) for each step


def _activation_bytes(model: torch.nn.Module, tokens: int, all_layers: bool = True) -> int:
    """hidden + intermediate numbers of the model's dtype, per token, for ``tokens`` tokens, over all layers (or
    one)."""
    config = getattr(model.config, "get_text_config", lambda: model.config)()
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    inner = int(getattr(config, "intermediate_size", 0) or 4 * hidden)
    layers = int(getattr(config, "num_hidden_layers", 1) or 1) if all_layers else 1
    size = next(model.parameters()).element_size()
    return max(1, tokens * layers * (hidden + inner) * size)


def steps_per_backward(model: torch.nn.Module, tokens: int, steps: int, budget_mib: float | None = None) -> int:
    """How many steps one vectorised backward pass runs over a ``tokens``-token sequence: the budget (default
    ``STEP_BUDGET_MIB``) over ``BACKWARD_FACTOR`` activations per token (of one layer) per step, at least 1, at
    most ``steps``."""
    budget = STEP_BUDGET_MIB if budget_mib is None else budget_mib
    each = BACKWARD_FACTOR * _activation_bytes(model, tokens, all_layers=False)
    return max(1, min(steps, int(budget * 2**20 // each)))


def rows_per_forward(model: torch.nn.Module, tokens: int, budget_mib: float | None = None) -> int:
    """How many copies of a ``tokens``-token sequence (Integrated Gradients' points) one forward pass with its graph
    takes: the budget (default ``STEP_BUDGET_MIB``) over ``ACTIVATION_FACTOR`` activations per token and layer, at
    least 1."""
    budget = STEP_BUDGET_MIB if budget_mib is None else budget_mib
    return max(1, int(budget * 2**20 // (ACTIVATION_FACTOR * _activation_bytes(model, tokens))))


# ---- one forward pass, a backward pass per batch of steps ---------------------------------------------------------

class _Sequence:
    """One sequence's ids, the positions whose prediction is a step, the steps' target ids and word embeddings."""

    def __init__(self, ctx: ResponseContext):
        self.ctx = ctx
        self.model, self.adapter = ctx.model, ctx.adapter
        self.ids = id_tensor(ctx.ids, ctx.handle.device)[None]
        self.where = id_tensor(response_positions(ctx.prompt_length, self.ids.shape[1]), self.ids.device)
        self.targets = self.ids[0, ctx.prompt_length:]  # [n]
        self.embeds = word_embeddings(self.model, self.adapter, self.ids)  # [1, T, H]

    def hidden(self, embeds: torch.Tensor, rules: Callable | None = None) -> torch.Tensor:
        """What the head reads at the steps' positions in a forward pass from ``embeds`` [R, T, H]: [R * n, H]."""
        mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        with rules(self.model, mask) if rules is not None else nullcontext():
            hidden = output_tensor(self.model.base_model(inputs_embeds=embeds, attention_mask=mask,
                                                         **self.adapter.forward_kwargs))
        return hidden[:, self.where].reshape(embeds.shape[0] * self.where.shape[0], -1)

    def logits(self, at: torch.Tensor) -> torch.Tensor:
        """The whole head [R, n, V] on ``at`` [R * n, H], without a graph (read, not differentiated)."""
        with torch.no_grad():
            out = self.adapter.head(self.model, at.detach(), None)
        return out.reshape(-1, self.where.shape[0], out.shape[-1])

    def targets_logit(self, at: torch.Tensor) -> torch.Tensor:
        """Each step's own target logit [R, n] from ``at`` [R * n, H]: the head run at the targets' columns only, so
        that no backward pass carries a gradient over the whole vocabulary."""
        n = self.where.shape[0]
        vocab, index = torch.unique(self.targets, return_inverse=True)
        out = self.adapter.head(self.model, at, vocab).reshape(-1, n, vocab.shape[0])  # [R, n, distinct targets]
        return out.gather(2, index.expand(out.shape[0], -1)[:, :, None])[:, :, 0]

    def step_gradients(self, outputs: torch.Tensor, leaf: torch.Tensor, weights: torch.Tensor | None = None):
        """Yield ``(first step, gradients [m, T, H] float32)`` for batches of steps: the gradient of
        sum_r weights[r] * outputs[r, t] with respect to ``leaf`` [R, T, H], summed over the R rows (``weights``
        None: 1), one vectorised backward pass per batch, the graph kept until the last."""
        rows, n = outputs.shape
        per = steps_per_backward(self.model, leaf.shape[1] * rows, n)
        weight = torch.ones(rows, device=outputs.device) if weights is None else weights.to(outputs.device)
        for start in range(0, n, per):
            m = min(per, n - start)
            grad_out = torch.zeros(m, rows, n, dtype=outputs.dtype, device=outputs.device)
            grad_out[torch.arange(m), :, start + torch.arange(m)] = weight.to(outputs.dtype)
            last = start + m >= n
            (grads,) = torch.autograd.grad(outputs, leaf, grad_outputs=grad_out, retain_graph=not last,
                                           is_grads_batched=True)
            yield start, grads.float().sum(1)  # [m, T, H]


def _rows(step_vectors: Callable[[int, torch.Tensor], torch.Tensor], seq: _Sequence, outputs, leaf,
          weights=None) -> np.ndarray:
    """[n, T] rows: ``step_vectors(first step, gradients [m, T, H]) -> [m, T]`` for every batch of steps."""
    n, length = seq.targets.shape[0], seq.ids.shape[1]
    rows = np.zeros((n, length), np.float32)
    for start, grads in seq.step_gradients(outputs, leaf, weights):
        rows[start:start + grads.shape[0]] = step_vectors(start, grads).cpu().numpy()
    for t in range(n):  # a step reads the positions before its token only (the gradient is 0 there: kept exact)
        rows[t, seq.ctx.prompt_length + t:] = 0.0
    return rows


def gradient_steps(product: bool, rules: Callable | None = None, check: Callable | None = None,
                   relevance: bool = False) -> Callable[[ResponseContext], ResponseRows]:
    """Gradient Norm (``product=False``) or Gradient×Input (``product=True``) per step, aggregated as the
    ``aggregation`` option says; ``relevance=True``: AttnLRP's signed sum with its ``relevance_sum`` and
    ``conservation`` diagnostics. ``rules(model, mask)``: a context manager the forward pass runs under (AttnLRP's
    rules); ``check(ctx)`` refuses a model first."""

    def compute(ctx: ResponseContext) -> ResponseRows:
        if check is not None:
            check(ctx)
        seq = _Sequence(ctx)
        embedding = seq.embeds[0].float()
        how = "sum" if relevance else ctx.options.get("aggregation", "l1")
        with ctx.handle.using(), torch.enable_grad():
            leaf = seq.embeds.detach().requires_grad_(True)
            at = seq.hidden(leaf, rules)
            outputs = seq.targets_logit(at)  # [1, n]
            logits = seq.logits(at)[0]  # [n, V]
            rows = _rows(lambda _, g: aggregate(g * embedding if product else g, how), seq, outputs, leaf)
        diagnostics = {}
        if relevance:
            explained = outputs[0].detach().float().cpu().numpy()
            total = rows.sum(-1)
            diagnostics = {"relevance_sum": total.tolist(),
                           "conservation": np.where(explained != 0, total / np.where(explained != 0, explained, 1),
                                                    np.nan).tolist()}
        return ResponseRows(rows=rows, logits=logits.float(), diagnostics=diagnostics)

    return compute


def integrated_gradients_steps(ctx: ResponseContext) -> ResponseRows:
    """Integrated Gradients per step, as :func:`normx.methods.gradients.integrated_gradients` on each prefix: the
    path from the baseline (zero, or the pad token's embedding at every position) to the word embeddings, the
    integration rule's points and step sizes, the gradient of each step's target logit at every point, summed with
    the step sizes, times (embedding - baseline). One forward pass per chunk of points over the whole sequence
    serves every step; ``convergence_delta`` and ``output_difference`` per step, as on a prefix."""
    options = ctx.options
    seq = _Sequence(ctx)
    embeds = seq.embeds
    if options["baselines"] == "zero":
        baseline = torch.zeros_like(embeds)
    else:
        pad_id = pad_token_id(ctx.tokenizer)
        if pad_id is None:
            raise InvalidInputError("baselines='pad' needs a pad (or end-of-sequence) token, and this tokenizer has "
                                    "neither; use baselines='zero'")
        baseline = word_embeddings(seq.model, seq.adapter, torch.full_like(seq.ids[:, :1], pad_id)).expand_as(embeds)
    sizes, alphas = rule_parameters(options["rule"], options["n_steps"])
    length = embeds.shape[1]
    per_pass = options["internal_batch_size"] or rows_per_forward(seq.model, length)
    start_point, diff = baseline.float(), (embeds.float() - baseline.float())
    n = seq.targets.shape[0]
    total = np.zeros((n, length, embeds.shape[2]), np.float32)
    with ctx.handle.using():
        for first in range(0, len(alphas), per_pass):
            alpha = torch.tensor(alphas[first:first + per_pass], dtype=torch.float32, device=embeds.device)
            weight = torch.tensor(sizes[first:first + per_pass], dtype=torch.float32, device=embeds.device)
            points = (start_point + alpha.view(-1, 1, 1) * diff[0]).to(embeds.dtype)  # [R, T, H]
            with torch.enable_grad():
                leaf = points.detach().requires_grad_(True)
                outputs = seq.targets_logit(seq.hidden(leaf))  # [R, n]
                for start, grads in seq.step_gradients(outputs, leaf, weight):
                    total[start:start + grads.shape[0]] += grads.cpu().numpy()
            del leaf, outputs
        with torch.no_grad():
            ends = seq.logits(seq.hidden(torch.cat([embeds, baseline])))  # [2, n, V]: the input, the baseline
    attributions = torch.from_numpy(total) * diff[0].cpu()  # [n, T, H]
    # a step's attributions are its prefix's: positions from its own token on do not reach its logit (zero)
    for t in range(n):
        attributions[t, ctx.prompt_length + t:] = 0
    logits = ends[0].float()
    columns = seq.targets[:, None]
    change = (logits.gather(1, columns) - ends[1].float().gather(1, columns))[:, 0].cpu()  # [n]
    delta = attributions.sum(dim=(1, 2)) - change
    rows = aggregate(attributions, options["aggregation"]).numpy()
    return ResponseRows(rows=rows, logits=logits,
                        diagnostics={"convergence_delta": delta.tolist(), "output_difference": change.tolist()})
