"""GlobEnc, ALTI and Value Zeroing (normx.methods.mixing) against references that never call normx.methods.mixing.

- GlobEnc / ALTI: a forward pass written out here in plain tensor algebra from the model's weights (checked against
  the model's own output), with the papers' formulas applied to it head by head.
- Value Zeroing: a brute-force loop that re-runs the whole model once per (layer, source) with that source's value
  vector zeroed by a hook on the layer's value projection.
- Conservation: the decomposed vectors summed over sources, plus the bias term, are the real first-LayerNorm output.
"""

from __future__ import annotations

import copy
import math

import minilm
import numpy as np
import pytest
import tiny
import torch
import torch.nn.functional as F
from leaks import assert_no_hooks

import normx
from normx.errors import InvalidInputError, UnsupportedModelError
from normx.methods.mixing import MIXING_METHODS, batch_maps, contribution_maps, ln1_decomposition, record_blocks

ATOL = 1e-5
CONSERVATION_ATOL = 1e-4
ENCODERS = ["BertForSequenceClassification", "RobertaForMaskedLM", "ElectraForSequenceClassification",
            "XLMRobertaForSequenceClassification"]



def text_of(case_id: str, tokenizer, index: int = 0) -> str:
    return tiny.texts_for(tiny.CASE_BY_ID[case_id], tokenizer)[index]


# ---- the plain-algebra reference -------------------------------------------------------------------------------------

def layer_norm(z, module):
    return (z - z.mean(-1, keepdim=True)) / torch.sqrt(z.var(-1, unbiased=False, keepdim=True) + module.eps) \
        * module.weight + module.bias


def manual_pass(model, enc):
    """Per block of a BERT / RoBERTa encoder on one unpadded text: input x, probs A, values v, LN inputs z1, z2 and
    outputs h1, out, computed from the weights (no padding mask needed)."""
    base = model.base_model
    x = base.embeddings(input_ids=enc["input_ids"], token_type_ids=enc.get("token_type_ids"))[0]
    blocks = []
    for block in base.encoder.layer:
        att, out = block.attention.self, block.attention.output
        heads, size = att.num_attention_heads, att.attention_head_size
        t = x.shape[0]
        q, k, v = (F.linear(x, m.weight, m.bias) for m in (att.query, att.key, att.value))
        qh, kh, vh = (a.view(t, heads, size).transpose(0, 1) for a in (q, k, v))
        probs = torch.softmax(qh @ kh.transpose(1, 2) / math.sqrt(size), dim=-1)  # [H, T, T]
        context = (probs @ vh).transpose(0, 1).reshape(t, heads * size)
        z1 = F.linear(context, out.dense.weight, out.dense.bias) + x
        h1 = layer_norm(z1, out.LayerNorm)
        ffn = F.linear(F.gelu(F.linear(h1, block.intermediate.dense.weight, block.intermediate.dense.bias)),
                       block.output.dense.weight, block.output.dense.bias)
        z2 = ffn + h1
        new = layer_norm(z2, block.output.LayerNorm)
        blocks.append(dict(x=x, probs=probs, v=v, z1=z1, h1=h1, z2=z2, out=new, block=block))
        x = new
    return blocks


def reference_maps(model, enc, method: str) -> np.ndarray:
    """GlobEnc (N_Enc) or ALTI maps [L, T, T], row-normalised, from :func:`manual_pass`."""
    maps = []
    with torch.no_grad():
        blocks = manual_pass(model, enc)
        final = model.base_model(**enc).last_hidden_state[0]
        torch.testing.assert_close(blocks[-1]["out"], final, atol=1e-5, rtol=1e-5)  # the reference is the model
        for b in blocks:
            block = b["block"]
            att, out = block.attention.self, block.attention.output
            heads, size = att.num_attention_heads, att.attention_head_size
            t = b["x"].shape[0]
            w_o = out.dense.weight  # [hidden, hidden]; head h reads columns h*size:(h+1)*size
            ln1, ln2 = out.LayerNorm, block.output.LayerNorm
            s1 = torch.sqrt(b["z1"].var(-1, unbiased=False) + ln1.eps)
            s2 = torch.sqrt(b["z2"].var(-1, unbiased=False) + ln2.eps)
            # f[h, j] = W_O^h v_j^h: source j's value through head h's slice of the output projection
            f = torch.stack([b["v"][:, h * size:(h + 1) * size] @ w_o[:, h * size:(h + 1) * size].T
                             for h in range(heads)])  # [H, T, hidden]
            scores = torch.zeros(t, t)
            for i in range(t):
                y = (b["probs"][:, i, :, None] * f).sum(0)  # [T(sources), hidden]: sum_h A^h_ij f[h, j]
                y[i] += b["x"][i]  # the residual
                t1 = ln1.weight * (y - y.mean(-1, keepdim=True)) / s1[i]
                if method == "globenc":
                    scores[i] = (ln2.weight * (t1 - t1.mean(-1, keepdim=True)) / s2[i]).norm(dim=-1)
                else:
                    h1 = b["h1"][i]
                    scores[i] = (h1.abs().sum() - (h1 - t1).abs().sum(-1)).clamp(min=0)
            maps.append((scores / scores.sum(-1, keepdim=True)).numpy())
    return np.stack(maps)


def brute_value_zeroing(model, enc) -> np.ndarray:
    """Value Zeroing maps [L, T, T]: the whole model re-run once per (layer, source) with a value-zeroing hook."""
    base = model.base_model
    t = enc["input_ids"].shape[1]
    maps = []
    for block in base.encoder.layer:
        seen = {}

        def record(_module, _args, out, seen=seen):
            seen["out"] = out

        keep = block.register_forward_hook(record)
        try:
            with torch.no_grad():
                base(**enc)
                original = seen["out"][0]
                scores = torch.zeros(t, t)
                for j in range(t):
                    def zero(_m, _a, out, j=j):
                        out = out.clone()
                        out[:, j] = 0
                        return out
                    handle = block.attention.self.value.register_forward_hook(zero)
                    try:
                        base(**enc)
                    finally:
                        handle.remove()
                    scores[:, j] = (1 - F.cosine_similarity(seen["out"][0].double(), original.double(), dim=-1)).float()
        finally:
            keep.remove()
        maps.append((scores / scores.sum(-1, keepdim=True)).numpy())
    return np.stack(maps)


def our_maps(model, tokenizer, text, method, **kwargs) -> np.ndarray:
    return contribution_maps(model, tokenizer, text, method=method, **kwargs)[0].maps


# ---- against the references ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["globenc", "alti"])
@pytest.mark.parametrize("case_id", ["BertForSequenceClassification", "RobertaForMaskedLM"])
def test_decomposition_matches_hand_computed_reference(case_id, method):
    model, tokenizer = tiny.build(case_id)
    text = text_of(case_id, tokenizer)
    enc = tokenizer(text, return_tensors="pt")
    ours = our_maps(model, tokenizer, text, method)
    assert ours.shape == (tiny.LAYERS + 1, enc["input_ids"].shape[1], enc["input_ids"].shape[1])
    np.testing.assert_allclose(ours[0], np.eye(ours.shape[1]))  # layer 0: every token is itself
    np.testing.assert_allclose(ours[1:], reference_maps(model, enc, method), atol=ATOL)
    assert model.config._attn_implementation == "sdpa"  # eager only for the pass
    assert not np.allclose(ours[1:], np.eye(ours.shape[1]), atol=1e-2)  # real mixing, not a trivial map


@pytest.mark.parametrize("case_id", ["BertForSequenceClassification", "RobertaForMaskedLM",
                                     "XLMRobertaForSequenceClassification"])
def test_value_zeroing_matches_brute_force(case_id):
    model, tokenizer = tiny.build(case_id)
    text = text_of(case_id, tokenizer, 2)
    enc = tokenizer(text, return_tensors="pt")
    ours = our_maps(model, tokenizer, text, "value_zeroing", internal_batch_size=3)  # several chunks per layer
    np.testing.assert_allclose(ours[1:], brute_value_zeroing(model, enc), atol=ATOL)


def test_methods_differ():
    model, tokenizer = tiny.build("BertForSequenceClassification")
    text = text_of("BertForSequenceClassification", tokenizer)
    maps = {m: our_maps(model, tokenizer, text, m) for m in MIXING_METHODS}
    for a in MIXING_METHODS:
        for b in MIXING_METHODS:
            if a < b:
                assert np.abs(maps[a][1:] - maps[b][1:]).max() > 1e-2, (a, b)


# ---- conservation ----------------------------------------------------------------------------------------------------

def check_conservation(model, tokenizer, texts, atol=CONSERVATION_ATOL):
    base = normx.models.unwrap_model(model)
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    layers = list(range(1, base.config.num_hidden_layers + 1))
    with torch.no_grad():
        records = record_blocks(base, dict(enc), layers, decompose=True)
        for rec in records.values():
            for row in range(len(texts)):
                keep = enc["attention_mask"][row].nonzero().flatten()
                vectors, bias = ln1_decomposition(rec, row, keep, keep)
                assert vectors.shape == (keep.numel(), keep.numel(), base.config.hidden_size)
                torch.testing.assert_close(vectors.sum(1) + bias, rec.ln1_out[row, keep].to(vectors.dtype),
                                           atol=atol, rtol=0)
                assert vectors.norm(dim=-1).min() >= 0 and (vectors.norm(dim=-1) > 1e-3).all()
    assert_no_hooks(base)


@pytest.mark.parametrize("case_id", ENCODERS)
def test_conservation_tiny(case_id):
    model, tokenizer = tiny.build(case_id)
    check_conservation(model, tokenizer, tiny.texts_for(tiny.CASE_BY_ID[case_id], tokenizer))


def test_conservation_and_rows_on_minilm():
    model, tokenizer = minilm.classifier()
    texts = ["a gripping, beautifully acted film", "the plot is thin and the jokes fall flat, sadly"]
    check_conservation(model, tokenizer, texts)
    for method in MIXING_METHODS:
        for result in contribution_maps(model, tokenizer, texts, method=method):
            assert result.maps.shape[0] == 7
            np.testing.assert_allclose(result.maps.sum(-1), 1, atol=1e-5)
            assert (result.maps >= 0).all()


def test_minilm_against_references():
    model, tokenizer = minilm.classifier()
    text = "not a bad film"
    enc = tokenizer(text, return_tensors="pt")
    np.testing.assert_allclose(our_maps(model, tokenizer, text, "globenc")[1:], reference_maps(model, enc, "globenc"),
                               atol=ATOL)
    np.testing.assert_allclose(our_maps(model, tokenizer, text, "value_zeroing")[1:], brute_value_zeroing(model, enc),
                               atol=ATOL)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")
def test_minilm_sst2_preset():
    """The shipped LoRA preset (LoRA in query/key/value and the dense layers): conservation, rows, explain."""
    model, tokenizer = normx.load_model("minilm-sst2")
    texts = ["a gripping, beautifully acted film", "the plot is thin and the jokes fall flat"]
    check_conservation(model, tokenizer, texts)
    merged = copy.deepcopy(model).merge_and_unload().eval()
    for method in MIXING_METHODS:
        ours = contribution_maps(model, tokenizer, texts, method=method)
        for result, reference in zip(ours, contribution_maps(merged, tokenizer, texts, method=method)):
            np.testing.assert_allclose(result.maps, reference.maps, atol=1e-4)
            np.testing.assert_allclose(result.maps.sum(-1), 1, atol=1e-5)
        e = normx.explain(model, tokenizer, texts[0], method=method, layer="all", rollout=True)
        rolled = contribution_maps(model, tokenizer, texts[0], method=method, rollout=True)[0].maps
        np.testing.assert_allclose(e.scores[0], rolled[:, 0], atol=ATOL)
    assert_no_hooks(model)


# ---- maps: rows, padding, batching, rollout --------------------------------------------------------------------------

@pytest.mark.parametrize("method", MIXING_METHODS)
def test_rows_sum_to_one_and_padding_gets_nothing(method):
    model, tokenizer = tiny.build("RobertaForMaskedLM")
    texts = tiny.texts_for(tiny.CASE_BY_ID["RobertaForMaskedLM"], tokenizer)
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    mask = enc["attention_mask"].bool()
    assert not mask.all()  # the batch really is padded
    with torch.no_grad():
        maps = batch_maps(model, dict(enc), method, list(range(tiny.LAYERS + 1)))
    for m in maps.values():
        assert m.shape == (3, mask.shape[1], mask.shape[1])
        rows = m.sum(-1)
        torch.testing.assert_close(rows[mask], torch.ones(int(mask.sum())), atol=1e-5, rtol=0)
        assert (m[~mask] == 0).all() and (m.transpose(1, 2)[~mask] == 0).all()  # pad rows and pad columns


@pytest.mark.parametrize("method", MIXING_METHODS)
def test_batch_and_padding_invariance(method):
    model, tokenizer = tiny.build("BertForSequenceClassification")
    texts = tiny.TEXTS
    alone = our_maps(model, tokenizer, texts[2], method)
    together = contribution_maps(model, tokenizer, texts, method=method, batch_size=3)
    assert together[2].maps.shape == alone.shape  # padding trimmed
    np.testing.assert_allclose(together[2].maps, alone, atol=ATOL)
    reordered = contribution_maps(model, tokenizer, [texts[2], texts[1]], method=method)
    np.testing.assert_allclose(reordered[0].maps, alone, atol=ATOL)


def test_value_zeroing_chunking_does_not_change_scores():
    model, tokenizer = tiny.build("ElectraForSequenceClassification")
    texts = tiny.TEXTS
    one = contribution_maps(model, tokenizer, texts, method="value_zeroing", internal_batch_size=1)
    many = contribution_maps(model, tokenizer, texts, method="value_zeroing", internal_batch_size=1000)
    for a, b in zip(one, many):
        np.testing.assert_allclose(a.maps, b.maps, atol=ATOL)


@pytest.mark.parametrize("method", MIXING_METHODS)
def test_rollout_is_the_product_of_layer_maps(method):
    model, tokenizer = tiny.build("BertForSequenceClassification")
    text = tiny.TEXTS[0]
    local = our_maps(model, tokenizer, text, method)
    rolled = our_maps(model, tokenizer, text, method, rollout=True)
    joint = np.eye(local.shape[1])
    for layer in range(local.shape[0]):
        joint = local[layer] @ joint
        np.testing.assert_allclose(rolled[layer], joint, atol=ATOL)
    np.testing.assert_allclose(rolled.sum(-1), 1, atol=1e-5)


# ---- the registered methods -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", MIXING_METHODS)
@pytest.mark.parametrize("case_id", ["BertForSequenceClassification", "RobertaForMaskedLM"])
def test_registered_method_reads_the_pooled_row(case_id, method):
    model, tokenizer = tiny.build(case_id)
    texts = tiny.texts_for(tiny.CASE_BY_ID[case_id], tokenizer)
    for rollout in (False, True):
        options = {} if not rollout else {"rollout": True}
        explanations = normx.explain(model, tokenizer, texts, method=method, layer="all", **options)
        for e, text in zip(explanations, texts):
            maps = our_maps(model, tokenizer, text, method, rollout=rollout)
            pooled = e.pooled
            if case_id.endswith("MaskedLM"):
                assert e.tokens[pooled] == tokenizer.mask_token and pooled > 0
            else:
                assert pooled == 0
            np.testing.assert_allclose(e.scores[0], maps[:, pooled], atol=ATOL)
            assert e.settings["rollout"] is rollout and e.settings["label_dependent"] is False


def test_registered_method_is_label_independent_and_defaults():
    model, tokenizer = tiny.build("BertForSequenceClassification")
    e = normx.explain(model, tokenizer, tiny.TEXTS[0], method="alti", target="all", layer=[0, 2])
    assert e.layers == [0, 2]
    np.testing.assert_allclose(e.scores[0], e.scores[2])
    np.testing.assert_allclose(e.scores[0, 0], np.eye(len(e.tokens))[0])  # layer 0: the pooled token itself
    assert normx.methods.get_method("globenc").defaults == {"rollout": False}
    assert normx.methods.get_method("value_zeroing").defaults["rollout"] is False


def test_option_validation():
    model, tokenizer = tiny.build("BertForSequenceClassification")
    with pytest.raises(InvalidInputError, match="rollout must be True or False"):
        normx.explain(model, tokenizer, "a film", method="globenc", rollout="yes")
    with pytest.raises(InvalidInputError, match="internal_batch_size"):
        normx.explain(model, tokenizer, "a film", method="value_zeroing", internal_batch_size=0)
    with pytest.raises(InvalidInputError, match="does not take"):
        normx.explain(model, tokenizer, "a film", method="alti", internal_batch_size=4)
    with pytest.raises(InvalidInputError, match="one of"):
        contribution_maps(model, tokenizer, "a film", method="attention")


# ---- PEFT, dtypes ----------------------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")
def test_peft_uses_the_effective_weights():
    from peft import LoraConfig, get_peft_model

    model, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False, task_type="SEQ_CLS",
                        target_modules=["query", "key", "value", "dense"])
    torch.manual_seed(7)
    wrapped = get_peft_model(model, config).eval()
    merged = copy.deepcopy(wrapped).merge_and_unload().eval()
    text = tiny.TEXTS[1]
    check_conservation(wrapped, tokenizer, tiny.TEXTS)
    for method in MIXING_METHODS:
        ours = our_maps(wrapped, tokenizer, text, method)
        np.testing.assert_allclose(ours, our_maps(merged, tokenizer, text, method), atol=ATOL)
        with wrapped.disable_adapter():
            without = our_maps(wrapped, tokenizer, text, method)
        assert np.abs(ours - without).max() > 1e-3  # the adapter matters
    e = normx.explain(wrapped, tokenizer, text, method="globenc", layer="all")
    np.testing.assert_allclose(e.scores[0], our_maps(merged, tokenizer, text, "globenc")[:, 0], atol=ATOL)
    assert_no_hooks(wrapped)


def test_bfloat16_follows_the_model():
    model, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    text = tiny.TEXTS[0]
    reference = {m: our_maps(model, tokenizer, text, m) for m in MIXING_METHODS}
    model.to(torch.bfloat16)
    for method in MIXING_METHODS:
        maps = our_maps(model, tokenizer, text, method)
        assert np.isfinite(maps).all()
        np.testing.assert_allclose(maps.sum(-1), 1, atol=1e-5)
        assert np.abs(maps - reference[method]).max() < 0.05  # bf16 rounding, same maps


def test_float64_models_decompose_in_float64():
    model, tokenizer = tiny.build("RobertaForMaskedLM", fresh=True)
    model.double()
    check_conservation(model, tokenizer, tiny.texts_for(tiny.CASE_BY_ID["RobertaForMaskedLM"], tokenizer), atol=1e-10)


# ---- hooks, attention setting, errors --------------------------------------------------------------------------------

def test_hooks_removed_and_attention_restored_after_success():
    model, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    for method in MIXING_METHODS:
        contribution_maps(model, tokenizer, tiny.TEXTS, method=method)
        normx.explain(model, tokenizer, tiny.TEXTS[0], method=method)
        assert_no_hooks(model)
        assert model.config._attn_implementation == "sdpa"
        assert not model.training


@pytest.mark.parametrize("method", ["globenc", "value_zeroing"])
def test_hooks_removed_and_attention_restored_when_the_pass_fails(method, monkeypatch):
    model, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(model.bert.encoder.layer[1].intermediate, "forward", boom)
    with pytest.raises(RuntimeError, match="boom"):
        contribution_maps(model, tokenizer, tiny.TEXTS[0], method=method)
    assert_no_hooks(model)
    assert model.config._attn_implementation == "sdpa"


def test_value_hook_removed_when_a_rerun_fails(monkeypatch):
    from normx.core.verify import verified_adapter

    model, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    verified_adapter(model)  # the first-use check's own forward pass, before the counted calls
    block = model.bert.encoder.layer[0]
    real = block.output.forward
    calls = []

    def second_call_fails(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:  # the real pass runs it once; the first value-zeroing re-run fails
            assert block.attention.self.value._forward_hooks  # the zeroing hook is on
            raise RuntimeError("rerun failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(block.output, "forward", second_call_fails)
    with pytest.raises(RuntimeError, match="rerun failed"):
        contribution_maps(model, tokenizer, tiny.TEXTS[0], method="value_zeroing")
    assert len(calls) == 2
    assert_no_hooks(model)


@pytest.mark.parametrize("case_id", ["DistilBertForSequenceClassification", "GPT2ForSequenceClassification",
                                     "LlamaForCausalLM", "DebertaV2ForSequenceClassification"])
def test_unsupported_models_are_a_clear_error(case_id):
    model, tokenizer = tiny.build(case_id)
    text = text_of(case_id, tokenizer)
    for method in MIXING_METHODS:
        with pytest.raises(UnsupportedModelError, match=case_id.split("-")[0]) as error:
            normx.explain(model, tokenizer, text, method=method)
        message = str(error.value)
        assert "BertForSequenceClassification" in message and "RobertaForMaskedLM" in message
        with pytest.raises(UnsupportedModelError, match="Supported model classes"):
            contribution_maps(model, tokenizer, text, method=method)
    assert_no_hooks(model)
