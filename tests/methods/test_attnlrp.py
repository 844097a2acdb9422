"""``attnlrp``: AttnLRP as LXT 2.1's efficient implementation computes it, equal to an independent by-hand
re-implementation from the weights (explicit autograd rules, as LXT writes them); the forward pass is the model's own;
a plain caller of the same model in another thread gets the model's plain gradients meanwhile; models whose parts
the rules do not cover are refused and left as they were; every generation step equals the method on its prefix."""

from __future__ import annotations

import json
import threading

import architectures
import numpy as np
import peft_cases
import pytest
import tiny
import torch

import normx
from normx.cli.main import main
from normx.methods import get_method
from normx.methods.decoder.lrp import attnlrp_rules
from normx.methods.decoder.lrp import method as lrp_method
from normx.methods.decoder.lrp.rules import divide_gradient, identity_rule, norm_identity

TEXT = "a dull movie, with a predictable plot"
CASES = ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
         "LlamaForSequenceClassification", "Qwen3ForSequenceClassification"]


# ---- an independent re-implementation: the forward pass from the weights, the rules as LXT writes them --------------

class Divide(torch.autograd.Function):
    """LXT's ``divide_gradient``: the uniform rule."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad / ctx.factor, None


class Identity(torch.autograd.Function):
    """LXT's ``identity_rule_implicit``: gradient f(x) / (x + 1e-10)."""

    @staticmethod
    def forward(ctx, x, fn):
        y = fn(x)
        ctx.save_for_backward(y / (x + 1e-10))
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.saved_tensors[0], None


def rms(x, weight, eps):
    """RMSNorm with the scale detached (LXT's identity rule for norms)."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps).detach())


def rotary(x, theta):
    """Llama's rotary embedding of x [H, T, d] at positions 0..T-1, from the formula."""
    d, t = x.shape[-1], x.shape[-2]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = torch.arange(t, dtype=torch.float32)[:, None] * inv
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    half = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + half * sin


def linear(x, layer):
    return x @ layer.weight.T + (layer.bias if layer.bias is not None else 0)


def by_hand(model, ids: list[int], column: int) -> tuple[np.ndarray, float]:
    """(relevance of each token, the explained output) for output ``column`` at the last token of ``ids``."""
    config, inner = model.config, model.model
    eps, theta = config.rms_norm_eps, config.rope_parameters["rope_theta"]
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    d = config.hidden_size // heads if getattr(config, "head_dim", None) is None else config.head_dim
    with torch.enable_grad():
        x0 = inner.embed_tokens(torch.tensor(ids)).detach().requires_grad_(True)  # [T, hidden]
        t = x0.shape[0]
        h = x0
        for block in inner.layers:
            attn, mlp = block.self_attn, block.mlp
            a = rms(h, block.input_layernorm.weight, eps)
            q = linear(a, attn.q_proj).view(t, heads, d)
            k = linear(a, attn.k_proj).view(t, kv, d)
            v = linear(a, attn.v_proj).view(t, kv, d).transpose(0, 1)
            if hasattr(attn, "q_norm"):  # Qwen3: per-head norms before the rotary embedding
                q, k = rms(q, attn.q_norm.weight, eps), rms(k, attn.k_norm.weight, eps)
            q, k = rotary(q.transpose(0, 1), theta), rotary(k.transpose(0, 1), theta)
            q, k, v = Divide.apply(q, 4), Divide.apply(k, 4), Divide.apply(v, 2)
            k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
            scores = q @ k.transpose(1, 2) / d ** 0.5 + torch.full((t, t), float("-inf")).triu(1)
            mixed = (torch.softmax(scores, -1) @ v).transpose(0, 1).reshape(t, heads * d)
            h = h + linear(mixed, attn.o_proj)
            a = rms(h, block.post_attention_layernorm.weight, eps)
            gated = Identity.apply(linear(a, mlp.gate_proj), torch.nn.functional.silu) * linear(a, mlp.up_proj)
            h = h + linear(Divide.apply(gated, 2), mlp.down_proj)
        last = rms(h, inner.norm.weight, eps)[-1]
        head = model.lm_head if hasattr(model, "lm_head") else model.score
        output = last @ head.weight[column]
        output.backward()
    return (x0 * x0.grad).sum(-1).detach().numpy(), float(output.detach())


@pytest.mark.parametrize("case", CASES)
def test_equals_the_rules_by_hand(case):
    model, tok = tiny.build(case)
    ids = tok(TEXT)["input_ids"]
    got = normx.explain(model, tok, TEXT, method="attnlrp", target="all" if "Classification" in case else None)
    assert got.settings["reading"] == "signed" and got.layers == [0]
    columns = range(len(got.labels)) if "Classification" in case else [tok.convert_tokens_to_ids(got.labels[0])]
    for row, column in enumerate(columns):
        want, output = by_hand(model, ids, column)
        np.testing.assert_allclose(got.scores[row, 0], want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
        assert got.diagnostics["relevance_sum"][row] == pytest.approx(want.sum(), rel=1e-4, abs=1e-5)
        assert got.diagnostics["conservation"][row] == pytest.approx(want.sum() / output, rel=1e-4, abs=1e-5)


def test_not_the_plain_gradient_and_the_prediction_is_the_models_own():
    model, tok = tiny.build("LlamaForCausalLM")
    lrp = normx.explain(model, tok, TEXT, method="attnlrp")
    plain = normx.explain(model, tok, TEXT, method="gradient_x_input", aggregation="sum", target=lrp.labels[0])
    assert lrp.prediction == plain.prediction
    assert lrp.probabilities.keys() == plain.probabilities.keys()
    for token, probability in lrp.probabilities.items():
        assert probability == pytest.approx(plain.probabilities[token], rel=1e-5, abs=1e-7)
    assert np.abs(lrp.scores - plain.scores).max() > 0.1 * np.abs(plain.scores).max()  # the rules change it


def test_the_rules_one_by_one():
    """Each rule keeps the forward value exactly and has the rule's gradient."""
    x = torch.tensor([-2.0, 0.5, 3.0], requires_grad=True)
    y = torch.nn.functional.silu(x)
    ruled = identity_rule(x, y)
    assert torch.equal(ruled, y)
    (grad,) = torch.autograd.grad(ruled.sum(), x)
    torch.testing.assert_close(grad, (y / x).detach())  # the relevance x * grad = y: passed on unchanged
    halved = divide_gradient(x * 3, 4)
    (grad,) = torch.autograd.grad(halved.sum(), x)
    torch.testing.assert_close(grad, torch.full((3,), 0.75))
    norm = torch.nn.RMSNorm(3, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([0.5, 2.0, -1.0]))
    out = norm(x)
    ruled = norm_identity(norm, x, out)
    assert torch.equal(ruled, out)
    (grad,) = torch.autograd.grad(ruled.sum(), x)
    scale = torch.rsqrt(x.detach().pow(2).mean() + 1e-6)
    torch.testing.assert_close(grad, norm.weight.detach() * scale)  # the scale held constant: linear in x
    assert norm_identity(torch.nn.Tanh(), x, torch.tanh(x)) is None  # not a normalisation


# ---- one model, many threads ---------------------------------------------------------------------------------------

def test_a_plain_caller_in_another_thread_is_unaffected(unchanged):
    model, tok = tiny.build("LlamaForCausalLM", fresh=True)
    unchanged(model)
    ids = torch.tensor([tok(TEXT)["input_ids"]])

    def plain_gradient():
        embeds = model.model.embed_tokens(ids).detach().requires_grad_(True)
        logits = model(inputs_embeds=embeds).logits
        (grad,) = torch.autograd.grad(logits[0, -1, 7], embeds)
        return logits.detach(), grad

    want_logits, want_grad = plain_gradient()
    own = model.config._attn_implementation
    alone = normx.explain(model, tok, TEXT, method="attnlrp")
    seen, worker = {}, threading.get_ident()

    def meanwhile(_module, _args, _output):  # inside the attnlrp pass, with its hooks on: a plain caller runs
        if threading.get_ident() == worker and not seen:
            other = threading.Thread(target=lambda: seen.update(zip(("logits", "grad"), plain_gradient())))
            other.start()
            other.join()
            seen["attention"] = model.config._attn_implementation

    handle = model.model.layers[0].register_forward_hook(meanwhile)
    try:
        during = normx.explain(model, tok, TEXT, method="attnlrp")
    finally:
        handle.remove()
    assert seen["attention"] == own  # it ran during the attnlrp pass, which left the model's attention as it was
    torch.testing.assert_close(seen["logits"], want_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(seen["grad"], want_grad, rtol=1e-4, atol=1e-6)  # plain gradients, no rules
    np.testing.assert_array_equal(during.scores, alone.scores)


def test_the_rules_act_only_inside_the_context():
    model, tok = tiny.build("Qwen3ForCausalLM")
    ids = torch.tensor([tok(TEXT)["input_ids"]])
    mask = torch.ones_like(ids)

    def gradient():
        embeds = model.model.embed_tokens(ids).detach().requires_grad_(True)
        return torch.autograd.grad(model(inputs_embeds=embeds, attention_mask=mask).logits[0, -1, 7], embeds)[0]

    before = gradient()
    with attnlrp_rules(model, mask):
        ruled = gradient()
    torch.testing.assert_close(gradient(), before)
    assert (ruled - before).abs().max() > 1e-3


# ---- what it refuses ------------------------------------------------------------------------------------------------

def test_refusals_name_the_reason_and_leave_the_model_as_it_was(unchanged):
    spec = get_method("attnlrp")
    for case, reason in (("BertForSequenceClassification", "decoder"), ("GPT2LMHeadModel", "gpt2")):
        model, tok = tiny.build(case)
        assert reason in spec.unsupported(model)
        with pytest.raises(normx.UnsupportedModelError, match=reason):
            normx.explain(model, tok, "a film", method="attnlrp")
    model, tok = tiny.build("LlamaForCausalLM", fresh=True)
    unchanged(model)
    layers = model.model.layers
    changes = [  # (module, hook, whether it changes the module's input, the refusal)
        (layers[1].self_attn, lambda _m, _a, out: (out[0] * 2, out[1]), False, r"block 2's LlamaAttention.*outputs"),
        (layers[0].mlp.act_fn, lambda _m, args: (args[0] + 1,), True, "activation does not read gate_proj's"),
        (layers[0].mlp.down_proj, lambda _m, args: (args[0] + 1,), True, "down_proj does not read"),
        (layers[1].mlp, lambda _m, _a, out: out + 1, False, "MLP's output is not down_proj's"),
        (model.model.norm, lambda _m, _a, out: out.tanh(), False, r"model\.norm \(LlamaRMSNorm\) computes something"),
    ]
    for module, hook, before, message in changes:
        handle = module.register_forward_pre_hook(hook) if before else module.register_forward_hook(hook)
        try:
            with pytest.raises(normx.UnsupportedModelError, match=message):
                normx.explain(model, tok, TEXT, method="attnlrp")
        finally:
            handle.remove()
    # eager attention returns its probabilities: they are checked too
    model.config._attn_implementation_internal = "eager"
    handle = layers[0].self_attn.register_forward_hook(lambda _m, _a, out: (out[0], out[1] * 0.5))
    try:
        with pytest.raises(normx.UnsupportedModelError, match="recomputed attention probabilities differ"):
            normx.explain(model, tok, TEXT, method="attnlrp")
    finally:
        handle.remove()
        model.config._attn_implementation_internal = "sdpa"
    assert normx.explain(model, tok, TEXT, method="attnlrp").scores.shape[-1] > 0


# ---- generation and the command line -------------------------------------------------------------------------------

def test_every_generation_step_equals_explain_on_its_prefix():
    model, tok = tiny.build("Qwen2ForCausalLM")
    g = normx.explain_generation(model, tok, "the film", method="attnlrp", target=" was a gripping story",
                                 batch_size=3)
    assert g.settings["reading"] == "signed" and g.steps > 2
    for t in range(g.steps):
        p = g.prompt_length + t
        prefix = tok.decode(g.token_ids[:p], skip_special_tokens=True)
        want = normx.explain(model, tok, prefix, method="attnlrp", target=g.token_ids[p])
        assert want.tokens == g.step(t).tokens and g.step(t).pooled == p - 1
        np.testing.assert_allclose(g.step(t).scores, want.scores, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(g.rows()[t], want.scores[0, 0], rtol=1e-5, atol=1e-6)


def test_generate_command_takes_it(tmp_path, capsys):
    model, tok = tiny.build("LlamaForCausalLM")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert main(["generate", "--model", str(tmp_path), "--json", "--continuation", " was a", "--method", "attnlrp",
                 "the film"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["settings"]["method"] == "attnlrp"
    want = normx.explain_generation(model, tok, "the film", method="attnlrp", target=" was a")
    for row, expected in zip(data["scores"], want.rows()):
        np.testing.assert_allclose(row, expected, rtol=1e-5, atol=1e-6)


# transformers' own tiny models of other families (tests/architectures.py): every pass checks each rule's
# recomputation against the module's own output, so running (and a padded batch equal to each text alone) is the check
FAMILIES = [("gemma", "GemmaForCausalLM"), ("gemma3_text", "Gemma3ForCausalLM"), ("granite", "GraniteForCausalLM"),
            ("olmo2", "Olmo2ForCausalLM"), ("olmo3", "Olmo3ForCausalLM"), ("seed_oss", "SeedOssForCausalLM"),
            ("smollm3", "SmolLM3ForCausalLM"), ("stablelm", "StableLmForCausalLM"),
            ("gemma", "GemmaForSequenceClassification")]
# (the checks' own refusals, with the family let past the list of checked families)
REFUSED = [("gemma2", "Gemma2ForCausalLM", "soft cap"),
           ("phi3", "Phi3ForCausalLM", "Phi3Attention has no separate query, key and value projections"),
           ("cohere", "CohereForCausalLM", "recomputed outputs differ"),  # interleaved rotary
           ("mixtral", "MixtralForCausalLM", "MixtralSparseMoeBlock has no activation module"),
           ("olmo", "OlmoForCausalLM", r"input_layernorm \(OlmoLayerNorm\) computes something else")]


@pytest.mark.parametrize(("family", "name"), FAMILIES)
def test_other_families_pass_every_check(family, name):
    kind = "sequence_classification" if name.endswith("Classification") else "causal_lm"
    model = architectures.build(family, name, kind)
    if family == "smollm3":  # a NoPE layer (no rotary embedding), as SmolLM3 checkpoints have every 4th
        model.model.layers[1].self_attn.use_rope = 0
    tok = architectures.word_tokenizer(model, kind)
    texts = architectures.reference_texts(model, kind)
    together = normx.explain(model, tok, texts, method="attnlrp")
    alone = normx.explain(model, tok, texts[1], method="attnlrp")
    np.testing.assert_allclose(together[1].scores, alone.scores, rtol=1e-4, atol=1e-6)
    assert np.isfinite(together[0].scores).all() and np.isfinite(together[0].diagnostics["conservation"]).all()


@pytest.mark.parametrize(("family", "name", "reason"), REFUSED)
def test_other_families_are_refused_with_the_reason(family, name, reason, monkeypatch):
    model = architectures.build(family, name, "causal_lm")
    tok = architectures.word_tokenizer(model, "causal_lm")
    text = architectures.reference_texts(model, "causal_lm")[0]
    assert family in get_method("attnlrp").unsupported(model)  # not among the checked families
    with pytest.raises(normx.UnsupportedModelError, match=family):
        normx.explain(model, tok, text, method="attnlrp")
    monkeypatch.setattr(lrp_method, "FAMILIES", (*lrp_method.FAMILIES, family))
    with pytest.raises(normx.UnsupportedModelError, match=reason):
        normx.explain(model, tok, text, method="attnlrp")
    for scope in ("step", "response"):  # every step from one pass, and the response's one backward pass, alike
        with pytest.raises(normx.UnsupportedModelError, match=reason):
            normx.explain_generation(model, tok, text, method="attnlrp", target=" a b", scope=scope)


@pytest.mark.parametrize("name", ["llama-causal", "mistral-causal-save", "llama-seqcls-lora-head"])
def test_peft_models_equal_their_merged_weights(name):
    """LoRA layers (on the projections, the head, the embeddings) are linear: the relevance of a PEFT model equals
    that of the same model with the adapters merged; a saved copy of the final norm is the norm that runs."""
    model, tok, _, _ = peft_cases.peft_model(name)
    merged = peft_cases.fresh_peft_model(name)[0].merge_and_unload()
    got = normx.explain(model, tok, TEXT, method="attnlrp")
    want = normx.explain(merged, tok, TEXT, method="attnlrp", target=got.labels[0])
    np.testing.assert_allclose(got.scores, want.scores, rtol=1e-4, atol=1e-5 * np.abs(want.scores).max())
