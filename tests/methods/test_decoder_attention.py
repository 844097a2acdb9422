"""The decoder attention methods (``attention``, ``norm_attention``) and the ``recency`` baseline: the scores are the
model's own attention weights (``output_attentions=True`` with eager attention) averaged over heads, and Kobayashi et
al.'s norms computed by hand from them and the model's v_proj / o_proj weights; padding keys get nothing; every
generation step read from one pass equals the method run on that step's prefix alone; models whose attention the
methods cannot read are refused, and the model is left as it was."""

from __future__ import annotations

import dataclasses
import json

import architectures
import numpy as np
import pytest
import tiny
import torch

import normx
from normx.cli.main import main
from normx.core.forward import Pass
from normx.explanations import generation
from normx.methods import get_method
from normx.methods.decoder import query_rows
from normx.methods.registry import _METHODS
from normx.models import get_adapter

CASES = ["LlamaForCausalLM", "Qwen2ForCausalLM"]  # Llama: grouped-query (4 heads, 2 kv heads); Qwen2: value bias
TEXT = "a dull movie, with a predictable plot"
ATTENTION = ("attention", "norm_attention")


def own_attention(case: str, text: str):
    """(ids, every block's attention probabilities [L][H, T, T], hidden states, the eager model) from the model's own
    forward pass with output_attentions=True and eager attention."""
    model, tok = tiny.build(case, fresh=True)
    model.set_attn_implementation("eager")
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True, output_hidden_states=True)
    return ids, [a[0] for a in out.attentions], out.hidden_states, model


def by_hand_norms(model, attentions, hidden_states, query: int) -> list[torch.Tensor]:
    """||sum_h alpha^h_(q,j) W_O^h v^h_j|| per block from v_proj / o_proj's weights and the model's own alphas."""
    config = model.config
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    d = model.model.layers[0].self_attn.head_dim
    norms = []
    with torch.no_grad():
        for layer, alpha in zip(model.model.layers, attentions):
            x = layer.input_layernorm(hidden_states[len(norms)][0])  # the attention block's input
            attn = layer.self_attn
            v = attn.v_proj(x).view(-1, kv, d).repeat_interleave(heads // kv, dim=1)  # [T, H, d]
            w_o = attn.o_proj.weight.view(-1, heads, d)  # [hidden, H, d]
            f = torch.einsum("thd,ohd->tho", v, w_o)  # each token's value through each head's W_O slice
            norms.append(torch.einsum("ht,tho->to", alpha[:, query], f).norm(dim=-1))
    return norms


@pytest.mark.parametrize("case", CASES)
def test_attention_is_the_models_own_weights_averaged_over_heads(case):
    model, tok = tiny.build(case)
    ids, attentions, _, _ = own_attention(case, TEXT)
    q = ids.shape[1] - 1
    for alpha in attentions:  # each head's row sums to one before averaging
        np.testing.assert_allclose(alpha[:, q].sum(-1).numpy(), 1, rtol=1e-5)
    per_block = normx.explain(model, tok, TEXT, method="attention", layer="all", aggregate=False)
    aggregate = normx.explain(model, tok, TEXT, method="attention", layer="all")
    want = [alpha[:, q].mean(0).numpy() for alpha in attentions]
    assert per_block.layers == [0, 1, 2] and per_block.tokens == tok.convert_ids_to_tokens(ids[0])
    np.testing.assert_array_equal(per_block.scores[0, 0], np.eye(q + 1)[q])  # layer 0: the query token alone
    for layer, row in enumerate(want, 1):
        np.testing.assert_allclose(per_block.scores[0, layer], row, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(aggregate.scores[0, layer], np.mean(want[:layer], 0), rtol=1e-5, atol=1e-7)
        assert per_block.scores[0, layer].sum() == pytest.approx(1, rel=1e-5)
    default = normx.explain(model, tok, TEXT, method="attention")  # the last layer: the mean over every block
    assert default.layers == [tiny.LAYERS] and default.settings["aggregate"] is True
    np.testing.assert_allclose(default.scores[0, 0], np.mean(want, 0), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("case", CASES)
def test_norm_attention_equals_the_norms_by_hand(case):
    model, tok = tiny.build(case)
    ids, attentions, hidden_states, eager = own_attention(case, TEXT)
    q = ids.shape[1] - 1
    want = [n.numpy() for n in by_hand_norms(eager, attentions, hidden_states, q)]
    per_block = normx.explain(model, tok, TEXT, method="norm_attention", layer="all", aggregate=False)
    summed = normx.explain(model, tok, TEXT, method="norm_attention", layer="all")
    for layer, row in enumerate(want, 1):
        np.testing.assert_allclose(per_block.scores[0, layer], row, rtol=1e-5, atol=1e-6 * row.max())
        np.testing.assert_allclose(summed.scores[0, layer], np.sum(want[:layer], 0), rtol=1e-5, atol=1e-5)
    assert (per_block.scores >= 0).all()


def test_padding_keys_get_nothing_and_no_query_sees_later_tokens():
    model, tok = tiny.build("LlamaForCausalLM")
    texts = ["the film", TEXT]
    inputs = tok(texts, padding=True, return_tensors="pt")
    assert tok.padding_side == "right"
    lengths = inputs["attention_mask"].sum(-1).tolist()
    width = inputs["input_ids"].shape[1]
    queries = torch.arange(width).repeat(2, 1)
    adapter = get_adapter(model)
    for kind in ATTENTION:
        run = Pass(model, adapter, dict(inputs), [1, 2]).locate()
        with torch.no_grad():
            rows = query_rows(run, queries, kind, aggregate=False)  # [B, Q, layers, T]
        for b, n in enumerate(lengths):
            assert (rows[b, :, :, n:] == 0).all()  # padding keys
            for q in range(n):
                assert (rows[b, q, :, q + 1:] == 0).all()  # causal
                if kind == "attention":
                    np.testing.assert_allclose(rows[b, q].sum(-1).numpy(), 1, rtol=1e-5)
        alone = normx.explain(model, tok, texts[0], method=kind, layer=[1, 2], aggregate=False)
        np.testing.assert_allclose(rows[0, lengths[0] - 1, :, :lengths[0]].numpy(), alone.scores[0], rtol=1e-5,
                                   atol=1e-7)


@pytest.mark.parametrize(("case", "method"), [(case, method) for case in CASES for method in ATTENTION]
                         + [("LlamaForCausalLM", "recency")])
def test_one_pass_rows_equal_each_step_run_alone(case, method, monkeypatch):
    model, tok = tiny.build(case)
    spec = get_method(method)
    layer = "all" if spec.layered else None
    g = normx.explain_generation(model, tok, "the film", method=method, layer=layer, target=" was a gripping story")
    # the per-step path: the method with its one-pass facts removed runs once per prefix
    monkeypatch.setitem(_METHODS, method, dataclasses.replace(spec, query_rows=None, per_position=False))
    steps = normx.explain_generation(model, tok, "the film", method=method, layer=layer,
                                     target=" was a gripping story", batch_size=2)
    np.testing.assert_allclose(g.scores, steps.scores, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g.probabilities, steps.probabilities, rtol=1e-5, atol=1e-7)
    assert g.predictions == steps.predictions
    for t in range(g.steps):
        p = g.prompt_length + t
        prefix = tok.decode(g.token_ids[:p], skip_special_tokens=True)
        want = normx.explain(model, tok, prefix, method=method, target=g.token_ids[p], layer=layer)
        assert want.tokens == g.step(t).tokens and g.step(t).pooled == p - 1
        np.testing.assert_allclose(g.step(t).scores, want.scores, rtol=1e-5, atol=1e-6)
        if method == "recency":
            np.testing.assert_array_equal(g.rows()[t], np.arange(p))


@pytest.mark.parametrize("method", [*ATTENTION, "recency"])
def test_explain_generation_takes_one_pass_for_them(method, monkeypatch):
    model, tok = tiny.build("Qwen2ForCausalLM")

    def refuse(*args):
        raise AssertionError("the per-step path ran")

    monkeypatch.setattr(generation, "per_prefix", refuse)
    g = normx.explain_generation(model, tok, ["the film", "a dull movie with a"], method=method, max_new_tokens=3)
    assert [x.steps for x in g] == [3, 3] and all(np.isfinite(x.rows()[-1]).all() for x in g)


# transformers' own tiny models of other families (tests/architectures.py): the reading is checked on every pass
# (the values mixed by the probabilities give the attention module's output), so running is the check
FAMILIES = [("gemma", "GemmaForCausalLM"), ("gemma2", "Gemma2ForCausalLM"), ("phi3", "Phi3ForCausalLM"),
            ("olmo", "OlmoForCausalLM"), ("olmo2", "Olmo2ForCausalLM"), ("gpt_neox", "GPTNeoXForCausalLM"),
            ("mistral", "MistralForSequenceClassification")]


@pytest.mark.parametrize(("family", "name"), FAMILIES)
def test_other_families_are_read_and_checked(family, name):
    kind = "sequence_classification" if name.endswith("Classification") else "causal_lm"
    model = architectures.build(family, name, kind)
    tok = architectures.word_tokenizer(model, kind)
    texts = architectures.reference_texts(model, kind)
    for method in ATTENTION:
        together = normx.explain(model, tok, texts, method=method, layer="all")
        alone = normx.explain(model, tok, texts[1], method=method, layer="all")
        np.testing.assert_allclose(together[1].scores, alone.scores, rtol=1e-4, atol=1e-6)
        assert np.isfinite(together[0].scores).all() and (together[0].scores >= 0).all()


def test_gpt2_norms_by_hand():
    """GPT-2 keeps q, k, v in one Conv1D (c_attn) and projects with c_proj."""
    model, tok = tiny.build("GPT2LMHeadModel")
    eager, _ = tiny.build("GPT2LMHeadModel", fresh=True)
    eager.set_attn_implementation("eager")
    ids = torch.tensor([tok(TEXT)["input_ids"]])
    q, heads, hidden = ids.shape[1] - 1, eager.config.n_head, eager.config.n_embd
    with torch.no_grad():
        out = eager(input_ids=ids, output_attentions=True, output_hidden_states=True)
        want = []
        for block, alpha, x in zip(eager.transformer.h, out.attentions, out.hidden_states):
            v = block.attn.c_attn(block.ln_1(x[0]))[:, 2 * hidden:].view(-1, heads, hidden // heads)
            f = torch.einsum("thd,hdo->tho", v, block.attn.c_proj.weight.view(heads, hidden // heads, hidden))
            want.append(torch.einsum("ht,tho->to", alpha[0][:, q], f).norm(dim=-1).numpy())
    got = normx.explain(model, tok, TEXT, method="norm_attention", layer="all", aggregate=False)
    for layer, row in enumerate(want, 1):
        np.testing.assert_allclose(got.scores[0, layer], row, rtol=1e-5, atol=1e-6 * row.max())


def test_refusals_name_the_reason_and_leave_the_model_as_it_was(unchanged):
    bert, bert_tok = tiny.build("BertForSequenceClassification")
    for method in ATTENTION:
        assert "decoder" in get_method(method).unsupported(bert)
        with pytest.raises(normx.UnsupportedModelError):
            normx.explain(bert, bert_tok, "a film", method=method)
    model, tok = tiny.build("LlamaForCausalLM", fresh=True)
    unchanged(model)
    attention = model.model.layers[1].self_attn
    handle = attention.register_forward_hook(lambda _m, _a, out: (out[0] * 2, out[1]))  # output no longer mixed values
    try:  # both read the values now: the recomputed rows are checked against the module's output
        for method in ATTENTION:
            with pytest.raises(normx.UnsupportedModelError, match=r"block 2's LlamaAttention.*own output"):
                normx.explain(model, tok, TEXT, method=method)
    finally:
        handle.remove()
    assert model.config._attn_implementation != "eager"  # restored after the errors too
    implementation = model.config._attn_implementation
    model.set_attn_implementation("eager")  # probabilities the module returns are read as they are: checked too
    handle = attention.register_forward_hook(lambda _m, _a, out: (out[0], out[1] * 0.5))  # not a softmax
    try:
        with pytest.raises(normx.UnsupportedModelError, match="sum to one"):
            normx.explain(model, tok, TEXT, method="attention")
    finally:
        handle.remove()
        model.set_attn_implementation(implementation)


def test_generate_command_takes_the_methods(tmp_path, capsys):
    model, tok = tiny.build("Qwen2ForCausalLM")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    for method, extra in (("norm_attention", []), ("attention", ["--per-block"]), ("recency", [])):
        assert main(["generate", "--model", str(tmp_path), "--json", "--continuation", " was a", "--method", method,
                     *extra, "the film"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["settings"]["method"] == method
        want = normx.explain_generation(model, tok, "the film", method=method, target=" was a",
                                        **({"aggregate": False} if extra else {}))
        for row, expected in zip(data["scores"], want.rows()):
            np.testing.assert_allclose(row, expected, rtol=1e-5, atol=1e-6)
