"""What normx.models reads of a decoder block's self-attention (normx.models.decoder_attention): every layout's
value vectors and per-head output maps are the module's own, and a new fused layout, MPT's ``Wqkv`` + ``out_proj``
(q | k | v in three equal blocks, ALiBi instead of rotary positions), needs its reader there and nothing in the
methods: norm_attention and attention_logit explain a tiny MPT, norm_attention equal to Kobayashi et al.'s norms
computed by hand from the model's own weights and probabilities."""

from __future__ import annotations

import architectures
import numpy as np
import pytest
import tiny
import torch

import normx
from normx.models import get_adapter
from normx.models.decoder_attention import AttentionParts, read_block_attention

# (model type, class): the fused layouts (Phi-3's qkv_proj, GPT-2's c_attn, GPT-NeoX's per-head query_key_value,
# MPT's Wqkv) and separate projections with grouped-query heads (Llama)
LAYOUTS = [("llama", "LlamaForCausalLM"), ("phi3", "Phi3ForCausalLM"), ("gpt2", "GPT2LMHeadModel"),
           ("gpt_neox", "GPTNeoXForCausalLM"), ("mpt", "MptForCausalLM")]


def _mpt():
    model = architectures.build("mpt", "MptForCausalLM", "causal_lm")
    return model, architectures.word_tokenizer(model, "causal_lm")


@pytest.mark.parametrize(("family", "name"), LAYOUTS)
def test_the_parts_read_give_the_modules_own_values_and_output(family, name):
    """The query / key / value split of the projection the parts name, mixed by the module's own probabilities and
    projected by W_O per head, is the attention module's own output (causal softmax recomputed from q and k is not
    needed: the probabilities are the module's)."""
    model = architectures.build(family, name, "causal_lm")
    model.set_attn_implementation("eager")
    block = get_adapter(model).block_modules(model)[0]
    parts = get_adapter(model).attention_parts(model, block)
    assert isinstance(parts, AttentionParts), parts
    seen = {}
    hooks = [parts.values.register_forward_hook(lambda _m, _a, out: seen.setdefault("values", out)),
             parts.module.register_forward_hook(lambda _m, _a, out: seen.setdefault("attention", out))]
    ids = torch.arange(5, 12)[None]
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    out, probs = seen["attention"][0], seen["attention"][1]
    values = parts.value_vectors(seen["values"])  # [1, T, kv, d]
    heads = probs.shape[1]
    values = values.repeat_interleave(heads // values.shape[2], dim=2)
    mixed = torch.einsum("bhqt,bthd->bqhd", probs, values)
    w_o = parts.head_projections(heads)
    bias = parts.output(torch.zeros(1, heads * parts.head_dim))
    again = torch.einsum("bqhd,hdo->bqo", mixed, w_o) + bias
    torch.testing.assert_close(again, out, rtol=1e-4, atol=1e-5)
    if parts.split is not None:  # a fused projection: the split's value third is the values read
        q, k, v = parts.split(seen["values"])
        torch.testing.assert_close(v, parts.value_vectors(seen["values"]))
        assert q.shape[-1] == k.shape[-1] == parts.head_dim


def test_an_attention_without_a_known_layout_is_named():
    model, _ = tiny.build("LlamaForCausalLM", fresh=True)
    attention = model.model.layers[0].self_attn
    del attention.v_proj
    assert "has none of" in read_block_attention(model.model.layers[0], model.config)
    assert "has no self_attn / attn / attention" in read_block_attention(torch.nn.Linear(2, 2))


def test_mpt_norm_attention_equals_the_norms_by_hand():
    model, tok = _mpt()
    text = architectures.reference_texts(model, "causal_lm")[0]
    eager = architectures.build("mpt", "MptForCausalLM", "causal_lm")
    eager.set_attn_implementation("eager")
    ids = torch.tensor([tok(text)["input_ids"]])
    q, heads, hidden = ids.shape[1] - 1, eager.config.n_heads, eager.config.d_model
    d = hidden // heads
    with torch.no_grad():
        out = eager(input_ids=ids, output_attentions=True, output_hidden_states=True, use_cache=False)
        want = []
        for block, alpha, x in zip(eager.transformer.blocks, out.attentions, out.hidden_states):
            v = block.attn.Wqkv(block.norm_1(x[0]))[:, 2 * hidden:].view(-1, heads, d)
            f = torch.einsum("thd,ohd->tho", v, block.attn.out_proj.weight.view(hidden, heads, d))
            want.append(torch.einsum("ht,tho->to", alpha[0][:, q], f).norm(dim=-1).numpy())
    got = normx.explain(model, tok, text, method="norm_attention", layer="all", aggregate=False)
    for layer, row in enumerate(want, 1):
        np.testing.assert_allclose(got.scores[0, layer], row, rtol=1e-5, atol=1e-6 * row.max())
    logit = normx.explain(model, tok, text, method="attention_logit", layer="all")
    assert np.isfinite(logit.scores).all()
