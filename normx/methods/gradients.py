"""Gradient baselines: Gradient Norm, Gradient×Input, Integrated Gradients.

Gradients are taken with respect to the **word embeddings**: ``e = word_embeddings(input_ids)`` is fed to the
backbone as ``inputs_embeds`` (with the batch's attention mask, token type ids and decoder position ids), so the
model adds position / token-type embeddings and applies its embedding LayerNorm exactly once, as it does from
``input_ids``. The differentiated function :class:`HeadForward` is the model's head-on-top at the pooled position
([CLS], the last token, or the mask token), read at the target columns (minus the foil column for contrastive
targets; the single output for regression). LM heads compute only the needed vocabulary columns.

Gradient Norm and Gradient×Input cost one forward and one backward pass per target: their forward pass from the
word embeddings also makes the prediction that picks the default target (:func:`predict_and_differentiate`),
where the usual recipe (and Captum's) runs a separate prediction pass first.

Per-token scores aggregate the [hidden] attribution vector of each token: ``"l1"`` (sum of absolute values; the
NormXLogit paper's), ``"l2"`` (Euclidean norm) or ``"sum"`` (signed sum, as Captum tutorials and ferret do).
The plain gradient's sum is ~0 in models whose word embeddings only reach LayerNorms (BERT-style encoders, GPT-2):
a LayerNorm ignores shifts along (1, ..., 1).

Integrated Gradients follows Captum's ``IntegratedGradients`` (same rules, step sizes and internal batching), with
one forward pass per chunk of steps and one backward pass per target column; its completeness check
``sum(attributions) - (f(x) - f(baseline))`` is reported per text and target as the ``convergence_delta``
diagnostic (over the raw, unaggregated attributions of every position and dimension).

In a causal LM's generation each method's registration also names its computation of every step from one forward
pass (``Method.steps``, :mod:`normx.methods.step_gradients`) and, for Gradient Norm and Gradient×Input, of a whole
response from one backward pass of its log-probability (``Method.response``, :mod:`normx.methods.response`). The
word embeddings, the aggregations and the integration rules are :mod:`normx.methods.gradient_parts`'.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normx._torch import torch
from normx.core.concurrency import pause
from normx.core.hooks import output_tensor
from normx.core.inputs import pad_token_id
from normx.core.labels import head_columns
from normx.errors import InvalidInputError
from normx.methods.gradient_parts import AGGREGATIONS, RULES, aggregate, rule_parameters, word_embeddings
from normx.methods.registry import Context, Method, Option, register_method
from normx.methods.response import gradient_response
from normx.methods.step_gradients import gradient_steps, integrated_gradients_steps
from normx.models import Adapter

BASELINES = ("zero", "pad")


# ---- the differentiated function ---------------------------------------------------------------------------------

class HeadForward:
    """``f(inputs_embeds) -> [N, K]``: the head-on-top at the pooled position, read at the K target columns.

    Built for one batch of B rows. Called with N = R * B rows (R copies of the batch stacked step by step, as
    Captum and Integrated Gradients do), it repeats the batch's other inputs R times.

    RoBERTa-style models number positions from ``inputs_embeds`` sequentially, which is their ``input_ids``
    numbering for right-padded batches (normx pads encoders on the right) without pad tokens inside the text.

    Args:
        model: the transformers model (PEFT-unwrapped; LoRA layers stay injected).
        adapter: its adapter.
        inputs: the batch as given to the model (``input_ids``, ``attention_mask``, ``token_type_ids``,
            decoders' ``position_ids``); ``input_ids`` is only used by :meth:`embed`.
        pooled: [B] pooled positions.
        columns: [B, K] target columns.
        foil: [B] foil column, subtracted from every target, or None.
        regression: read the single regression output (``columns`` is ignored).
    """

    def __init__(self, model: torch.nn.Module, adapter: Adapter, inputs: dict[str, torch.Tensor],
                 pooled: torch.Tensor, columns: torch.Tensor, foil: torch.Tensor | None = None,
                 regression: bool = False):
        self.model, self.adapter = model, adapter
        self.input_ids = inputs["input_ids"]
        self.inputs = {k: v for k, v in inputs.items() if k != "input_ids"}
        self.batch = self.input_ids.shape[0]
        self.pooled, self.regression = pooled, regression
        wanted = head_columns(columns, foil, adapter.kind.vocabulary and not regression)  # LM heads: only those
        self.vocab, self.columns, self.foil = wanted.vocab, wanted.targets, wanted.foil
        self._repeated: dict[int, tuple] = {}

    @classmethod
    def from_context(cls, ctx: Context) -> HeadForward:
        run = ctx.run
        return cls(run.model, run.adapter, run.inputs, run.pooled, ctx.columns, ctx.foil, ctx.labels.regression)

    def embed(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """The word embeddings [B, T, H] of ``ids`` (default: the batch's input ids), without autograd history."""
        return word_embeddings(self.model, self.adapter, self.input_ids if ids is None else ids)

    def _inputs(self, repeats: int):
        if repeats not in self._repeated:
            def rep(t):
                return None if t is None else t.repeat(repeats, *([1] * (t.dim() - 1)))
            self._repeated[repeats] = ({k: rep(v) for k, v in self.inputs.items()}, rep(self.pooled),
                                       rep(self.columns), rep(self.foil))
        return self._repeated[repeats]

    def __call__(self, embeds: torch.Tensor) -> torch.Tensor:
        repeats, rest = divmod(embeds.shape[0], self.batch)
        if rest or not repeats:
            raise ValueError(f"inputs_embeds has {embeds.shape[0]} rows, not a multiple of the batch's {self.batch}")
        inputs, pooled, columns, foil = self._inputs(repeats)
        out = pooled_head(self.model, self.adapter, inputs, pooled, embeds, self.vocab)  # [N, C] or [N, U]
        return out[:, :1] if self.regression else select(out, columns, foil)


def pooled_head(model: torch.nn.Module, adapter: Adapter, inputs: dict[str, torch.Tensor], pooled: torch.Tensor,
                embeds: torch.Tensor, vocab: torch.Tensor | None = None) -> torch.Tensor:
    """The head-on-top [N, C] (LM heads: the ``vocab`` columns, or all) at the pooled positions [N] of a forward
    pass from ``inputs_embeds`` [N, T, H] with the other ``inputs`` (no ``input_ids``)."""
    kwargs = adapter.forward_kwargs
    # decoders' last_hidden_state is after their final norm, encoders' is the last block's output: both are what
    # the model's head reads
    hidden = output_tensor(model.base_model(inputs_embeds=embeds, **inputs, **kwargs))
    return adapter.pooled_head(model, hidden, pooled, inputs["attention_mask"], vocab)


def select(out: torch.Tensor, columns: torch.Tensor, foil: torch.Tensor | None = None) -> torch.Tensor:
    """``out`` [N, C] read at the target columns [N, K], minus the foil column [N] if given: [N, K]."""
    scores = torch.gather(out, 1, columns)
    return scores if foil is None else scores - torch.gather(out, 1, foil[:, None])


# ---- gradients and Integrated Gradients ---------------------------------------------------------------------------

def _target_gradients(forward, embeds: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One forward pass on ``embeds`` (made a leaf), one backward pass per target: (outputs [N, K], K x [N, T, H]).

    Only the inputs' gradients are taken (``torch.autograd.grad``): the parameters' ``requires_grad`` and ``.grad``
    stay as they are, so a model shared with other threads is not changed. (Freezing the parameters for the pass
    saved 0.4-3% on IG on CPU, within run-to-run noise: not worth a change other callers could see.)"""
    with torch.enable_grad():
        leaf = embeds.detach().requires_grad_(True)
        out = forward(leaf)
        k = out.shape[1]
        grads = [torch.autograd.grad(out[:, j].sum(), leaf, retain_graph=j < k - 1)[0] for j in range(k)]
    return out.detach(), grads


def gradients(forward, embeds: torch.Tensor) -> torch.Tensor:
    """d f_k / d embeds for every target k: [K, B, T, H] float32."""
    return torch.stack([g.float() for g in _target_gradients(forward, embeds)[1]])


def integrated_gradients(forward, embeds: torch.Tensor, baseline: torch.Tensor, n_steps: int = 50,
                         rule: str = "gausslegendre", internal_batch_size: int | None = None,
                         output: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Integrated Gradients of every target along the straight path from ``baseline`` to ``embeds``.

    ``internal_batch_size`` is the number of rows per forward pass, as in Captum: ``internal_batch_size // B``
    steps (at least one) go through the model together; ``None`` runs all steps at once. ``output``: f(embeds)
    [B, K] if already known (explain has it from its prediction pass), so that the completeness check only runs
    the baseline through the model.

    Returns (attributions [K, B, T, H] float32, convergence delta [B, K], f(x) - f(baseline) [B, K]).
    """
    batch = embeds.shape[0]
    sizes, alphas = rule_parameters(rule, n_steps)
    per_pass = n_steps if internal_batch_size is None else max(1, internal_batch_size // batch)
    # the path in float32 (half-precision models: the points, not alpha, are rounded to the model's dtype)
    start_point, diff = baseline.float(), embeds.float() - baseline.float()
    total = None
    for start in range(0, n_steps, per_pass):
        alpha = torch.tensor(alphas[start:start + per_pass], dtype=torch.float32, device=embeds.device)
        weight = torch.tensor(sizes[start:start + per_pass], dtype=torch.float32, device=embeds.device)
        steps = alpha.shape[0]
        scaled = (start_point + alpha.view(-1, 1, 1, 1) * diff).to(embeds.dtype)
        if isinstance(forward, HeadForward):  # between two passes: let a waiting exclusive pass of another call run
            pause(forward.model)
        _, grads = _target_gradients(forward, scaled.reshape(steps * batch, *embeds.shape[1:]))
        # sum over the steps of step size x gradient, per target: [K, B, T, H]
        chunk = torch.stack([torch.tensordot(weight, g.reshape(steps, *embeds.shape).float(), dims=1) for g in grads])
        total = chunk if total is None else total + chunk
    attributions = total * diff
    with torch.no_grad():
        if output is None:
            ends = forward(torch.cat([embeds, baseline])).float()
            output, at_baseline = ends[:batch], ends[batch:]
        else:
            at_baseline = forward(baseline).float()
    change = output.float() - at_baseline  # f(x) - f(baseline), [B, K]
    delta = attributions.sum(dim=(2, 3)).T - change
    return attributions, delta, change


def _scores(per_target: torch.Tensor, how: str) -> torch.Tensor:
    """[K, B, T, H] attributions -> [B, K, 1, T] scores."""
    return aggregate(per_target, how).permute(1, 0, 2)[:, :, None, :]


# ---- the methods ----------------------------------------------------------------------------------------------------

def predict_and_differentiate(ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward pass from the word embeddings that both makes the prediction (``ctx.predict``, which resolves
    the targets) and is differentiated, one backward pass per target: (word embeddings [B, T, H], d f_k / d
    embeddings [K, B, T, H] float32). f_k is what :class:`HeadForward` computes: the head at the pooled position,
    read at target k (minus the foil)."""
    run = ctx.run
    embeds = word_embeddings(run.model, run.adapter, run.inputs["input_ids"])
    others = {k: v for k, v in run.inputs.items() if k != "input_ids"}

    def predicted_targets(leaf: torch.Tensor) -> torch.Tensor:
        logits = pooled_head(run.model, run.adapter, others, run.pooled, leaf)  # [B, C] or the whole vocabulary
        return select(logits, ctx.predict(logits), ctx.foil)

    return embeds, gradients(predicted_targets, embeds)


def _gradient_norm(ctx: Context) -> torch.Tensor:
    return _scores(predict_and_differentiate(ctx)[1], ctx.options["aggregation"])


def _gradient_x_input(ctx: Context) -> torch.Tensor:
    embeds, grads = predict_and_differentiate(ctx)
    return _scores(grads * embeds.float(), ctx.options["aggregation"])


def _integrated_gradients(ctx: Context) -> torch.Tensor:
    options = ctx.options
    forward = HeadForward.from_context(ctx)
    embeds = forward.embed()
    if options["baselines"] == "zero":
        baseline = torch.zeros_like(embeds)
    else:
        pad_id = pad_token_id(ctx.labels.tokenizer)
        if pad_id is None:
            raise InvalidInputError("baselines='pad' needs a pad (or end-of-sequence) token, and this tokenizer has "
                                    "neither; use baselines='zero'")
        pad = torch.full_like(forward.input_ids[:1, :1], pad_id)
        baseline = forward.embed(pad).expand_as(embeds)
    output = select(ctx.logits, ctx.columns, ctx.foil)  # f(x) from the prediction pass: no forward pass on x again
    attributions, delta, change = integrated_gradients(forward, embeds, baseline, options["n_steps"], options["rule"],
                                                       options["internal_batch_size"], output)
    ctx.diagnostics["convergence_delta"] = delta
    ctx.diagnostics["output_difference"] = change
    return _scores(attributions, options["aggregation"])


# ---- options ---------------------------------------------------------------------------------------------------------

def _check_ig(options: dict[str, Any]) -> dict[str, Any]:
    n_steps, internal = options["n_steps"], options["internal_batch_size"]
    smallest = 1 if options["rule"] == "gausslegendre" else 2
    if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) or n_steps < smallest:
        raise InvalidInputError(f"n_steps must be an integer >= {smallest} for rule={options['rule']!r}, "
                                f"got {n_steps!r}")
    if internal is not None and internal < 1:
        raise InvalidInputError(f"internal_batch_size must be a positive integer (rows per forward pass) or None "
                                f"(all steps at once), got {internal!r}")
    return options


AGGREGATION = Option("aggregation", "l1", "how each token's attribution vector is summed up over the embedding "
                     "dimensions: l1 (the paper's), l2 or sum (signed)", str, AGGREGATIONS)


def _reading(options) -> str:
    """Summed attributions keep their sign (toward / away); l1 and l2 aggregations are magnitudes."""
    return "signed" if options.get("aggregation") == "sum" else "magnitude"


def _aggregated(vectors: torch.Tensor, options) -> torch.Tensor:
    """The response level's [T, H] attribution vectors summed up as the ``aggregation`` option says."""
    return aggregate(vectors, options["aggregation"])


register_method(Method(
    "gradient_norm", _gradient_norm,
    "Gradient Norm: the gradient of the target's logit w.r.t. each token's word embedding, aggregated over the "
    "embedding dimensions (aggregation: l1 | l2 | sum)",
    display="Gradient Norm", layered=False, predicts=True, options=[AGGREGATION], reading=_reading,
    cost=lambda tokens, targets, options: 1 + targets,  # one forward, one backward per target (~ a forward each)
    # a response: one backward pass of its total log-probability; every step from one forward pass over the sequence
    response=gradient_response(False, aggregate=_aggregated), steps=gradient_steps(False)))
register_method(Method(
    "gradient_x_input", _gradient_x_input,
    "Gradient x Input: gradient times word embedding, aggregated over the embedding dimensions",
    display="Gradient×Input", layered=False, predicts=True, options=[AGGREGATION], reading=_reading,
    cost=lambda tokens, targets, options: 1 + targets,
    response=gradient_response(True, aggregate=_aggregated), steps=gradient_steps(True)))
register_method(Method(
    "integrated_gradients", _integrated_gradients,
    "Integrated Gradients from a zero (or pad-token) embedding baseline to the word embeddings, as Captum "
    "(n_steps, rule, internal_batch_size); reports the convergence delta",
    display="Integrated Gradients", layered=False, check_options=_check_ig, reading=_reading,
    diagnostics=("convergence_delta", "output_difference"),
    cost=lambda tokens, targets, options: 2 + options["n_steps"] * (1 + targets),  # each step: forward + backwards
    steps=integrated_gradients_steps,  # no response level yet (its path integral over the response's objective)
    options=[Option("n_steps", 50, "integration steps", int),
             Option("baselines", "zero", "the baseline embedding: zero, or the pad token's", str, BASELINES),
             Option("rule", "gausslegendre", "the integration rule (as Captum's)", str, RULES),
             Option("internal_batch_size", None, "rows per forward pass (None: all steps at once; in "
                    "explain_generation, the points that fit normx.methods.step_gradients' memory budget)", int,
                    none=True),
             AGGREGATION]))
