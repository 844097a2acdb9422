"""Independent references the benchmarks check their results against (the model's own outputs, hand-written
NormXLogit / LogAt / l2 from ``output_hidden_states``, autograd through ``model(inputs_embeds=...)``, Captum's
Integrated Gradients, DecompX's conservation), written for the two classifier families the benchmarks use:
BERT (pooler + classifier) and Llama (score head at the last token)."""

from __future__ import annotations

import torch
import transformers
from workloads import Workload

from normx.explanations.explain import BatchAttribution
from normx.models import unwrap_model


def _close(work: Workload, actual, expected, what: str, rtol: float = 1e-4):
    """``actual`` equals ``expected`` to ``rtol``, with an absolute tolerance of ``rtol`` x the largest expected
    value; in half precision (bf16 / fp16 models) to 3e-2."""
    if next(work.model.parameters()).dtype in (torch.bfloat16, torch.float16):
        rtol = max(rtol, 3e-2)
    actual, expected = actual.detach().float().cpu(), expected.detach().float().cpu()
    scale = float(expected.abs().max()) if expected.numel() else 1.0
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=rtol * max(scale, 1.0),
                               msg=lambda m: f"{what}: {m}")


def _family(base) -> str:
    if isinstance(base, transformers.BertForSequenceClassification):
        return "bert"
    if isinstance(base, transformers.LlamaForSequenceClassification):
        return "llama"
    raise TypeError(f"the benchmark references cover BERT and Llama classifiers, not {type(base).__name__}")


def _model_inputs(work: Workload) -> dict[str, torch.Tensor]:
    return dict(work.inputs)


def head_on_tokens(base, hidden: torch.Tensor, last: bool) -> torch.Tensor:
    """The classifier head on every token of ``hidden`` [B, T, H] -> [B, T, C] (Llama: final norm first, except on
    the last layer, whose hidden state ``output_hidden_states`` already gives normed)."""
    if _family(base) == "bert":
        return base.classifier(base.bert.pooler.activation(base.bert.pooler.dense(hidden)))
    return base.score(hidden if last else base.model.norm(hidden))


def _pooled(base, inputs) -> torch.Tensor:
    mask = inputs["attention_mask"]
    if _family(base) == "bert":
        return torch.zeros(mask.shape[0], dtype=torch.long, device=mask.device)
    return mask.shape[1] - 1 - mask.flip(-1).argmax(-1)  # last non-padding position (benchmark batches: the last)


def hidden_and_logits(work: Workload):
    base = unwrap_model(work.model)
    with torch.no_grad():
        out = work.model(**_model_inputs(work), output_hidden_states=True)
    return base, [h.float() for h in out.hidden_states], out.logits.float()


def logat_reference(work: Workload, layers: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(LogAt [B, layers, T] at the predicted label (regression: |HoT(x_i) - HoT(x_pooled)|), logits)."""
    base, hidden, logits = hidden_and_logits(work)
    rows = torch.arange(logits.shape[0], device=logits.device)
    pooled = _pooled(base, work.inputs)
    per_layer = []
    with torch.no_grad():
        for layer in layers:
            h = hidden[layer].to(next(base.parameters()).dtype)
            out = head_on_tokens(base, h, last=layer == len(hidden) - 1).float()  # [B, T, C]
            if base.config.num_labels == 1:
                per_layer.append((out - out[rows, pooled][:, None, :]).abs()[..., 0])
            else:
                label = logits.argmax(-1)
                per_layer.append(out[rows, :, label])  # [B, T]
    return torch.stack(per_layer, dim=1), logits


def input_gradients(work: Workload) -> tuple[torch.Tensor, torch.Tensor]:
    """(d logit[label] / d word embeddings [B, T, H], the word embeddings), by autograd through the whole model."""
    model = work.model
    inputs = {k: v for k, v in _model_inputs(work).items() if k != "input_ids"}
    embeds = model.get_input_embeddings()(work.inputs["input_ids"]).detach()
    with torch.no_grad():
        label = model(**_model_inputs(work)).logits.argmax(-1)
    with torch.enable_grad():
        leaf = embeds.clone().requires_grad_(True)
        logits = model(inputs_embeds=leaf, **inputs).logits
        picked = logits[:, 0] if logits.shape[1] == 1 else logits.gather(1, label[:, None])[:, 0]
        (grad,) = torch.autograd.grad(picked.sum(), leaf)
    return grad.float(), embeds.float()


def captum_ig(work: Workload, n_steps: int) -> torch.Tensor:
    from captum.attr import IntegratedGradients

    model = work.model
    inputs = {k: v for k, v in _model_inputs(work).items() if k != "input_ids"}
    embeds = model.get_input_embeddings()(work.inputs["input_ids"]).detach()
    with torch.no_grad():
        logits = model(**_model_inputs(work)).logits
    target = torch.zeros_like(logits[:, 0], dtype=torch.long) if logits.shape[1] == 1 else logits.argmax(-1)

    names = list(inputs)

    def forward(e, *extra):  # Captum repeats the extra inputs along with the steps
        return model(inputs_embeds=e, **dict(zip(names, extra))).logits

    attributions = IntegratedGradients(forward).attribute(
        embeds, baselines=torch.zeros_like(embeds), target=target, n_steps=n_steps, method="gausslegendre",
        additional_forward_args=tuple(inputs[name] for name in names))
    return attributions.detach().float().abs().sum(-1)


# the experimental variants (normx/variants.py): what is read from the head, and which norm weighs it
VARIANTS = {"normx_margin": ("margin", "input"), "logat_margin": ("margin", None), "normx_prob": ("prob", "input"),
            "normx_selfnorm": ("logit", "self"), "normx_window": ("logit", "input")}


def _last_block_output(work: Workload) -> torch.Tensor:
    """The last block's output before any final norm [B, T, H] (``output_hidden_states`` gives Llama's normed)."""
    base = unwrap_model(work.model)
    blocks = base.bert.encoder.layer if _family(base) == "bert" else base.model.layers
    seen = []
    handle = blocks[-1].register_forward_hook(lambda module, args, out: seen.append(
        (out[0] if isinstance(out, tuple) else out).detach().float()))
    try:
        with torch.no_grad():
            work.model(**_model_inputs(work))
    finally:
        handle.remove()
    return seen[0]


def variant_reference(work: Workload, read: str, norm: str | None) -> torch.Tensor:
    """An experimental variant's scores [B, T] at the last layer, from ``output_hidden_states``: the head's logit
    (regression: distance from the pooled token's output), log-odds against the other classes or probability of the
    predicted label, averaged over the ``window`` last layers, times ||x^0||, ||x^L|| or nothing."""
    base, hidden, logits = hidden_and_logits(work)
    last = len(hidden) - 1
    rows = torch.arange(logits.shape[0], device=logits.device)
    label = logits.argmax(-1)
    pooled = _pooled(base, work.inputs)
    window = work.plan.options["window"]
    per_layer = []
    with torch.no_grad():
        for layer in range(max(0, last - window + 1), last + 1):
            out = head_on_tokens(base, hidden[layer].to(next(base.parameters()).dtype), last=layer == last).float()
            if base.config.num_labels == 1:
                per_layer.append((out - out[rows, pooled][:, None, :]).abs()[..., 0])
            elif read == "logit":
                per_layer.append(out[rows, :, label])
            elif read == "prob":
                per_layer.append(out.softmax(-1)[rows, :, label])
            else:
                others = out.clone()
                others[rows, :, label] = float("-inf")
                per_layer.append(out[rows, :, label] - others.logsumexp(-1))
    score = torch.stack(per_layer).mean(0)
    if norm == "input":
        return hidden[0].norm(dim=-1) * score
    if norm == "self":
        return _last_block_output(work).norm(dim=-1) * score
    return score


def check(work: Workload, result, full: bool = True) -> None:
    """Assert that ``result`` of :meth:`Workload.attribute` is right. ``full=False`` skips the references that cost
    as much as the method itself (Captum's Integrated Gradients); the cheap checks still run."""
    method = work.method
    if method == "forward":
        check_forward(work, result)
        return
    assert isinstance(result, BatchAttribution)
    scores = result.scores.float().cpu()
    b, t = work.inputs["input_ids"].shape
    assert scores.shape[0] == b and scores.shape[-1] == t and torch.isfinite(scores).all(), scores.shape
    if method in ("normxlogit", "logat_all"):
        layers = work.plan.layers
        ref, logits = logat_reference(work, layers)
        _close(work, result.logits, logits, "prediction logits")
        if method == "normxlogit":
            _, hidden, _ = hidden_and_logits(work)
            ref = hidden[0].norm(dim=-1)[:, None, :] * ref
        _close(work, scores[:, 0], ref, method)
    elif method == "l2norm":
        _, hidden, _ = hidden_and_logits(work)
        _close(work, scores[:, 0, 0], hidden[0].norm(dim=-1), method)
    elif method in ("gradient_norm", "gradient_x_input"):
        grad, embeds = input_gradients(work)
        ref = grad.abs().sum(-1) if method == "gradient_norm" else (grad * embeds).abs().sum(-1)
        _close(work, scores[:, 0, 0], ref, method, rtol=1e-3)
    elif method == "integrated_gradients":
        if full:
            _close(work, scores[:, 0, 0], captum_ig(work, work.explain_kwargs["n_steps"]), method, rtol=1e-3)
    elif method == "decompx":
        _check_decompx(work, result, scores)
    elif method in VARIANTS:
        _close(work, scores[:, 0, -1], variant_reference(work, *VARIANTS[method]), method)
    else:
        raise KeyError(f"no reference for {method!r}")


def check_forward(work: Workload, logits: torch.Tensor) -> None:
    """The batched forward's logits equal each text's logits run alone."""
    assert logits.shape[0] == work.batch
    for row in range(min(work.batch, 2)):
        alone = {k: v[row:row + 1] for k, v in work.inputs.items()}
        with torch.no_grad():
            expected = work.model(**alone).logits
        _close(work, logits[row:row + 1], expected, "forward logits, batched vs alone")


def _check_decompx(work: Workload, result: BatchAttribution, scores: torch.Tensor) -> None:
    """Conservation: at the last layer the token contributions sum to the model's logit for the label (for
    regression the scores are vector norms: non-negative)."""
    base = unwrap_model(work.model)
    if base.config.num_labels == 1:
        assert (scores >= 0).all()
        return
    with torch.no_grad():
        logits = work.model(**_model_inputs(work)).logits.float().cpu()
    label = result.columns[:, 0].cpu()
    expected = logits.gather(1, label[:, None])[:, 0]
    _close(work, scores[:, 0, -1].sum(-1), expected, "DecompX contributions summed over tokens vs the logit", rtol=1e-3)


def check_end_to_end(work: Workload, result) -> None:
    """``normx.explain``'s explanations equal the encoded-batch computation; the plain path's probabilities equal
    the model's softmax."""
    if work.method == "forward":
        with torch.no_grad():
            expected = work.model(**_model_inputs(work)).logits.float().softmax(-1)
        _close(work, result, expected, "end-to-end forward probabilities")
        return
    batch = attribute_batch_for(work)
    assert len(result) == work.batch
    for row, explanation in enumerate(result):
        _close(work, torch.from_numpy(explanation.scores), batch.scores[row], f"explain() vs the batch, row {row}")


def attribute_batch_for(work: Workload) -> BatchAttribution:
    from normx.explanations.explain import attribute_batch

    return attribute_batch(work.plan, work.inputs)
