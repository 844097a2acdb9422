"""The registered ``attnlrp`` method: AttnLRP's relevance of each token for the target's logit, as LXT 2.1 computes
it (the sum over the embedding dimensions of input embedding × gradient, the gradient taken through the rules of
:func:`~normx.methods.decoder.lrp.context.attnlrp_rules`), with its conservation as diagnostics.

The differentiated output is the head at the pooled position read at the target column (minus the foil's), as the
gradient methods' (:mod:`normx.methods.gradients`): one forward pass from the word embeddings makes the prediction,
one backward pass per target. The word embeddings e are the input: x^0 is e itself in Llama, Mistral and Qwen, and a
constant multiple c e in Gemma, whose e × d/de equals x^0 × d/dx^0.
"""

from __future__ import annotations

from normx._torch import torch
from normx.errors import UnsupportedModelError
from normx.methods.decoder.heads import decoder_reason
from normx.methods.decoder.lrp.context import attnlrp_rules
from normx.methods.gradients import pooled_head, select, word_embeddings
from normx.methods.registry import Context, Method, register_method
from normx.methods.response import gradient_response
from normx.methods.step_gradients import gradient_steps
from normx.models.discovery import logit_softcap

NAME = "attnlrp"
# the families whose blocks pass every check of the rules (tests/methods/test_attnlrp.py); another decoder family
# is refused here, before any pass
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma3_text", "granite", "olmo2", "olmo3", "seed_oss",
            "smollm3", "stablelm")


def family(adapter) -> str:
    """The adapter's family as a model type (``"gemma"`` for a discovered ``"gemma (discovered)"``)."""
    return adapter.family.removesuffix(" (discovered)")


def supports(adapter) -> str | None:
    """Why ``attnlrp`` cannot explain a model family (None: it can; each pass still checks the model)."""
    reason = decoder_reason(adapter)
    if reason is not None:
        return reason
    if family(adapter) not in FAMILIES:
        return (f"its rules are implemented and checked for the {', '.join(FAMILIES)} decoders, and this is a "
                f"{family(adapter)} model")
    return None


def check_model(model, adapter) -> None:
    """:class:`UnsupportedModelError` for a model AttnLRP cannot explain: its family (:func:`supports`) or a soft
    cap on its logits."""
    reason = supports(adapter)
    cap = logit_softcap(model.config)  # a nonlinearity on the logits which no rule covers
    if cap is not None and reason is None:
        reason = f"its logits go through a soft cap (tanh(z / {cap:g}) * {cap:g}), which no AttnLRP rule covers"
    if reason is not None:
        raise UnsupportedModelError(f"{NAME} does not explain {type(model).__name__}: {reason}")


def _attnlrp(ctx: Context) -> torch.Tensor:
    run = ctx.run
    check_model(run.model, run.adapter)
    model, adapter, inputs = run.model, run.adapter, run.inputs
    embeds = word_embeddings(model, adapter, inputs["input_ids"])
    others = {k: v for k, v in inputs.items() if k != "input_ids"}
    with torch.enable_grad():
        leaf = embeds.detach().requires_grad_(True)
        with attnlrp_rules(model, inputs["attention_mask"], NAME):
            logits = pooled_head(model, adapter, others, run.pooled, leaf)  # [B, C] or the whole vocabulary
        outputs = select(logits, ctx.predict(logits), ctx.foil)  # [B, K]
        k = outputs.shape[1]
        grads = [torch.autograd.grad(outputs[:, j].sum(), leaf, retain_graph=j < k - 1)[0] for j in range(k)]
    relevance = torch.stack([(g.float() * embeds.float()).sum(-1) for g in grads], dim=1)  # [B, K, T]
    total = relevance.sum(-1)
    explained = outputs.detach().float()
    ctx.diagnostics["relevance_sum"] = total
    ctx.diagnostics["conservation"] = torch.where(explained != 0, total / explained, torch.nan)
    return relevance[:, :, None, :]


def _rules(model, mask):
    return attnlrp_rules(model, mask, NAME)


def _check(ctx) -> None:
    check_model(ctx.model, ctx.adapter)


register_method(Method(
    NAME, _attnlrp,
    "AttnLRP (Achtibat et al., ICML 2024), as LXT 2.1's efficient implementation: input embedding x gradient summed "
    "over the embedding dimensions, the gradient of the target's logit taken through AttnLRP's rules (identity rule "
    "for norms with their scale held constant and for the MLP activation, uniform rule for the gate product and the "
    "attention's matrix products, softmax rule); each pass checks that the rules' recomputations equal the model's "
    "own modules. Reports relevance_sum and conservation (relevance_sum / the explained logit). Causal decoders "
    "(causal LMs and decoder classifiers) of the Llama, Mistral, Qwen2/3, Gemma 1/3, Granite, OLMo 2/3, Seed-OSS, "
    "SmolLM3 and StableLM families; one forward pass with the model's own attention, one backward pass per target",
    display="AttnLRP", layered=False, predicts=True, exclusive=True, reading="signed", supports=supports,
    diagnostics=("relevance_sum", "conservation"),
    # measured: 2.2x a plain forward pass at one target (SmolLM2, 64 tokens, 1 thread; Gradient×Input 1.8x)
    cost=lambda tokens, targets, options: 1.3 + targets,
    # a response: one backward pass of its total log-probability through the rules (the relevance starts at each
    # step's logits as d log p / d z = onehot(y) - softmax(z): the token's logit against the expected logit);
    # every generation step from one forward pass over the sequence, with relevance_sum and conservation per step
    response=gradient_response(True, rules=_rules, check=_check),
    steps=gradient_steps(True, rules=_rules, check=_check, relevance=True)))
