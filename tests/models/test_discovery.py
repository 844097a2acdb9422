"""Architectures normx has no adapter registered for: discovered from their conventions, verified against their own
outputs on first use, and explained exactly as a reference read from the model's own forward pass; adapters that
misread a model are refused, naming the part."""

from __future__ import annotations

import architectures
import numpy as np
import pytest
import tiny
import torch

import normx
from normx.core import verify
from normx.models import Adapter, HeadKind, get_adapter
from normx.models.registry import _REGISTRY

TEXTS = ["the film was a gripping story", "a dull movie with a predictable plot"]


def tokenizer():
    """A small byte-level BPE tokenizer (ids < 400, inside every shrunk vocabulary of 512)."""
    return tiny.bpe_tokenizer("llama")


def build(model_type: str, name: str, kind: str, **config):
    """A tiny model of the architecture whose vocabulary is the test tokenizers' (400 tokens)."""
    made = architectures.config(model_type, kind)
    for key, value in {"vocab_size": len(tokenizer()), **config}.items():
        setattr(made, key, value)
    torch.manual_seed(0)
    return getattr(__import__("transformers"), name)(made).eval()


def reference_lm(model, text_ids: torch.Tensor):
    """(||x_i^0||, logits at every position) from the model's own forward: hidden_states[0] and its logits."""
    with torch.no_grad():
        out = model(input_ids=text_ids, attention_mask=torch.ones_like(text_ids), output_hidden_states=True)
    return out.hidden_states[0][0].float().norm(dim=-1), out.logits[0].float()


def check_causal_lm(model, tok=None):
    """NormXLogit and LogAt of every layer's last position equal the model's own logits at every position (the head on
    every token is what a causal LM computes) times ||hidden_states[0]||."""
    tok = tok or tokenizer()
    for text in TEXTS:
        e = normx.explain(model, tok, text, method="normxlogit")
        ids = torch.tensor([tok(text)["input_ids"]])
        norms, logits = reference_lm(model, ids)
        target = int(logits[-1].argmax())
        assert e.labels == [tok.convert_ids_to_tokens(target)]
        want = (norms * logits[:, target]).numpy()
        np.testing.assert_allclose(e.score, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        logat = normx.explain(model, tok, text, method="logat", target=target)
        np.testing.assert_allclose(logat.score, logits[:, target].numpy(), rtol=1e-4, atol=1e-5)
    return e


def test_gemma_scaled_embeddings_are_x0():
    """Gemma multiplies its embeddings by sqrt(hidden): x^0 is the scaled vector, as hidden_states[0] says."""
    model = build("gemma", "GemmaForCausalLM", "causal_lm")
    tok = tokenizer()
    ids = torch.tensor([tok(TEXTS[0])["input_ids"]])
    raw = model.get_input_embeddings().weight[ids[0]].float().norm(dim=-1)
    norms, _ = reference_lm(model, ids)
    torch.testing.assert_close(norms, raw * model.config.hidden_size ** 0.5, rtol=1e-3, atol=1e-3)
    assert get_adapter(model).embeddings is None  # x^0 read where the model reports it: the first block's input
    check_causal_lm(model, tok)


@pytest.mark.parametrize(("model_type", "name"),
                         [("gemma2", "Gemma2ForCausalLM"), ("gemma3_text", "Gemma3ForCausalLM")])
def test_gemma_final_logit_softcapping(model_type, name):
    model = build(model_type, name, "causal_lm", final_logit_softcapping=3.0)  # small: the cap really bends logits
    e = check_causal_lm(model)
    assert np.isfinite(e.score).all()
    # without the soft-capping the head reads other logits: such an adapter is refused at the head
    plain = get_adapter(model)
    uncapped = Adapter(plain.family, plain.kind, None, plain.blocks,
                       lambda m, h, c=None: normx.models.linear_columns(m.get_output_embeddings(), h, c),
                       plain.pooling, final_norm=plain.final_norm)
    with pytest.raises(normx.UnsupportedModelError, match="does not match at the head"):
        verify.verify(model, uncapped)


@pytest.mark.parametrize("tied", [True, False])
def test_tied_and_untied_lm_heads(tied):
    model = build("olmo2", "Olmo2ForCausalLM", "causal_lm", tie_word_embeddings=tied)
    if tied:
        model.tie_weights()
    same = model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert same is tied
    check_causal_lm(model)


def test_gpt_neox():
    model = build("gpt_neox", "GPTNeoXForCausalLM", "causal_lm")
    adapter = get_adapter(model)
    assert (adapter.blocks, adapter.final_norm) == ("gpt_neox.layers", "gpt_neox.final_layer_norm")
    check_causal_lm(model)


def test_decoder_score_head_matches_the_models_per_token_scores():
    """A decoder classifier computes its score layer on every token before pooling the last one: LogAt is exactly
    those per-token scores (read from the model's own score layer with a hook), NormXLogit times ||x^0||."""
    model = build("gemma2", "Gemma2ForSequenceClassification", "sequence_classification")
    tok = tokenizer()
    seen = {}
    handle = model.score.register_forward_hook(lambda _m, _a, out: seen.setdefault("scores", out))
    try:
        ids = torch.tensor([tok(TEXTS[1])["input_ids"]])
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True)
    finally:
        handle.remove()
    per_token = seen["scores"][0].float()
    label = int(out.logits[0].argmax())
    e = normx.explain(model, tok, TEXTS[1], method="normxlogit")
    assert e.labels == [model.config.id2label[label]]
    want = (out.hidden_states[0][0].float().norm(dim=-1) * per_token[:, label]).numpy()
    np.testing.assert_allclose(e.score, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_modernbert_cls_pooling_is_the_head_on_each_token():
    model = build("modernbert", "ModernBertForSequenceClassification", "sequence_classification",
                  classifier_pooling="cls")
    adapter = verify.verified_adapter(model)
    assert adapter.pooling == "first" and adapter.kind is HeadKind.SEQUENCE_CLASSIFICATION
    e = normx.explain(model, tiny.bpe_tokenizer("roberta"), TEXTS[0])
    with torch.no_grad():
        ids = torch.tensor([tiny.bpe_tokenizer("roberta")(TEXTS[0])["input_ids"]])
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
    assert e.prediction == model.config.id2label[int(logits.argmax())]


def test_modernbert_mean_pooling_is_the_head_on_each_tokens_representation():
    """With classifier_pooling="mean" the model's head reads the mean of the tokens: the prediction is that, and
    LogAt is the model's own head modules run on each token's (final-normed) representation alone."""
    model = build("modernbert", "ModernBertForSequenceClassification", "sequence_classification",
                  classifier_pooling="mean")
    assert verify.verified_adapter(model).pooling == "mean"
    tok = tiny.bpe_tokenizer("roberta")
    ids = torch.tensor([tok(TEXTS[1])["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
        last = model.model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0]
        per_token = model.classifier(model.drop(model.head(last)))  # [T, C]: the head on each token alone
    label = int(logits.argmax())
    e = normx.explain(model, tok, TEXTS[1], method="logat")
    assert e.prediction == model.config.id2label[label]
    np.testing.assert_allclose(e.score, per_token[:, label].numpy(), rtol=1e-4, atol=1e-5)
    e = normx.explain(model, tok, TEXTS[1], method="gradient_x_input")  # gradients differentiate the mean's head
    assert np.isfinite(e.score).all() and e.prediction == model.config.id2label[label]


@pytest.mark.parametrize("name", ["AlbertForSequenceClassification", "AlbertForMaskedLM"])
def test_albert_shared_layers_are_read_at_each_call(name):
    """ALBERT runs one shared group of layers num_hidden_layers times: x^l is the group's l-th output, as the
    model's own hidden_states say (the l2 norms at every layer), and NormXLogit matches the model's outputs."""
    kind = "sequence_classification" if "Sequence" in name else "masked_lm"
    model = build("albert", name, kind, num_hidden_layers=3, num_hidden_groups=1)
    blocks = get_adapter(model).block_modules(model)
    assert len(blocks) == 3 and blocks[0] is blocks[1] is blocks[2]
    tok = tiny.bpe_tokenizer("roberta")
    text = TEXTS[0] + (" <mask>" if kind == "masked_lm" else "")
    e = normx.explain(model, tok, text, method="l2norm", layer="all")
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True).hidden_states
    want = np.stack([h[0].float().norm(dim=-1).numpy() for h in hidden])
    np.testing.assert_allclose(e.scores[0], want, rtol=1e-5, atol=1e-5)
    assert np.abs(np.diff(want, axis=0)).min(axis=1).max() > 1e-3  # the layers differ: each call was read
    assert architectures.reference_check(model, kind) < 1e-4


def test_encoder_decoder_models_are_refused_with_the_reason():
    model = build("bart", "BartForConditionalGeneration", "masked_lm")
    with pytest.raises(normx.UnsupportedModelError, match="encoder-decoder"):
        get_adapter(model)


# ---- a registered adapter that misreads its model is refused at first use ----------------------------------------

def _register(monkeypatch, name: str, adapter: Adapter):
    monkeypatch.setitem(_REGISTRY, name, adapter)


def test_a_head_missing_its_bias_is_refused(monkeypatch):
    model, tok = tiny.build("BertForSequenceClassification", fresh=True)
    good = get_adapter(model)

    def no_bias(m, h, columns=None):
        pooled = m.bert.pooler(h[:, None, :])
        return pooled @ m.classifier.weight.T  # the classifier's bias left out

    _register(monkeypatch, "BertForSequenceClassification", Adapter(
        "bert", good.kind, good.embeddings, good.blocks, no_bias, good.pooling, encoder_block=good.encoder_block))
    with pytest.raises(normx.UnsupportedModelError, match=r"does not match at the head: .*register a corrected"):
        normx.explain(model, tok, tiny.TEXTS[0])


def test_a_skipped_final_norm_is_refused(monkeypatch):
    model, tok = tiny.build("LlamaForCausalLM", fresh=True)
    good = get_adapter(model)
    _register(monkeypatch, "LlamaForCausalLM", Adapter(good.family, good.kind, good.embeddings, good.blocks,
                                                       good.head, good.pooling, final_norm=None))
    with pytest.raises(normx.UnsupportedModelError, match="does not match at the final norm"):
        normx.explain(model, tok, tiny.TEXTS[0])


def test_wrong_embeddings_are_refused(monkeypatch):
    model, tok = tiny.build("GPT2LMHeadModel", fresh=True)
    good = get_adapter(model)
    _register(monkeypatch, "GPT2LMHeadModel", Adapter(good.family, good.kind, "transformer.wte", good.blocks,
                                                      good.head, good.pooling, final_norm=good.final_norm))
    with pytest.raises(normx.UnsupportedModelError, match="does not match at the embeddings"):
        normx.explain(model, tok, tiny.TEXTS[0])


def test_verification_runs_once_per_model_and_threads_share_it(monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    model, tok = tiny.build("Qwen2ForCausalLM", fresh=True)
    calls = []
    real = verify.verify
    monkeypatch.setattr(verify, "verify", lambda *a: (calls.append(1), real(*a))[1])
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda text: normx.explain(model, tok, text), tiny.TEXTS * 2))
    assert len(calls) == 1 and len(results) == 2 * len(tiny.TEXTS)


def test_discovered_models_wrapped_by_peft_and_in_bfloat16():
    from peft import LoraConfig, get_peft_model

    model = build("gemma2", "Gemma2ForCausalLM", "causal_lm")
    torch.manual_seed(1)
    wrapped = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"],
                                               init_lora_weights=False)).eval()
    e = normx.explain(wrapped, tokenizer(), TEXTS[0])
    assert e.settings["peft"] is True and e.family == "gemma2 (discovered)"
    with torch.no_grad():
        ids = torch.tensor([tokenizer()(TEXTS[0])["input_ids"]])
        logits = wrapped(input_ids=ids).logits[0, -1]
    assert e.labels == [tokenizer().convert_ids_to_tokens(int(logits.argmax()))]  # the LoRA model's prediction
    half = build("olmo2", "Olmo2ForCausalLM", "causal_lm").to(torch.bfloat16)
    e = normx.explain(half, tokenizer(), TEXTS[1])
    assert e.settings["dtype"] == "bfloat16" and np.isfinite(e.score).all()


def test_eurobert_late_pooling_logat_averages_to_the_models_logit():
    """EuroBERT's classifier_pooling="late" predicts the mean of its head on every token: LogAt is each token's
    term, so LogAt averaged over the tokens is the model's own logit, and the prediction is the model's."""
    model = build("eurobert", "EuroBertForSequenceClassification", "sequence_classification",
                  classifier_pooling="late")
    assert verify.verified_adapter(model).pooling == "late"
    tok = tokenizer()
    ids = torch.tensor([tok(TEXTS[0])["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
    for label in range(model.config.num_labels):
        e = normx.explain(model, tok, TEXTS[0], method="logat", target=label)
        assert e.prediction == model.config.id2label[int(logits.argmax())]
        np.testing.assert_allclose(e.score.mean(), logits[label].item(), rtol=1e-4, atol=1e-5)
    bos = build("eurobert", "EuroBertForSequenceClassification", "sequence_classification", classifier_pooling="bos")
    assert verify.verified_adapter(bos).pooling == "first"


@pytest.mark.parametrize(("model_type", "name", "kind"), [
    ("xlm", "XLMWithLMHeadModel", "causal_lm"), ("xlm", "XLMForSequenceClassification", "sequence_classification"),
    ("flaubert", "FlaubertForSequenceClassification", "sequence_classification")])
def test_xlm_and_flaubert_blocks_are_their_last_layer_norms(model_type, name, kind):
    """XLM keeps a block's parts in parallel module lists; the override names the LayerNorms whose outputs the
    model reports, and the l2 norms at every layer equal its own hidden_states."""
    model = build(model_type, name, kind)
    adapter = verify.verified_adapter(model)
    assert adapter.blocks.endswith("layer_norm2") and adapter.embeddings.endswith("layer_norm_emb")
    tok = tokenizer()
    e = normx.explain(model, tok, TEXTS[0], method="l2norm", layer="all")
    ids = torch.tensor([tok(TEXTS[0])["input_ids"]])
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True).hidden_states
    np.testing.assert_allclose(e.scores[0], np.stack([h[0].norm(dim=-1).numpy() for h in hidden]), rtol=1e-5)
    assert architectures.reference_check(model, kind) < architectures.TOLERANCE


def test_flaubert_masked_lm():
    model = build("flaubert", "FlaubertWithLMHeadModel", "masked_lm")
    assert verify.verified_adapter(model).blocks.endswith("layer_norm2")
    assert architectures.reference_check(model, "masked_lm") < architectures.TOLERANCE


def test_an_lm_head_stops_at_the_output_embedding():
    """LUKE registers an entity head after its LM head: the LM head is the modules up to the output embedding."""
    model = build("luke", "LukeForMaskedLM", "masked_lm")
    verify.verified_adapter(model)
    assert architectures.reference_check(model, "masked_lm") < architectures.TOLERANCE


def test_a_head_that_pools_itself_skips_the_base_pooler():
    """BigBird's base model has a pooler its classification head does not read (the head takes token 0 itself)."""
    model = build("big_bird", "BigBirdForSequenceClassification", "sequence_classification")
    assert model.bert.pooler is not None
    verify.verified_adapter(model)
    assert architectures.reference_check(model, "sequence_classification") < architectures.TOLERANCE


def test_one_call_resolves_the_model_once(monkeypatch):
    """explain looks the model's adapter up once per call, and the handle is what the input and concurrency
    layers receive."""
    from normx.core import handle as handle_module
    from normx.models import registry

    model, tok = tiny.build("BertForSequenceClassification")
    normx.explain(model, tok, tiny.TEXTS[0])  # verified on first use
    calls, real = [], registry.get_adapter
    for module in (registry, verify):
        monkeypatch.setattr(module, "get_adapter", lambda m: (calls.append(1), real(m))[1])
    made = []
    real_handle = handle_module.model_handle
    monkeypatch.setattr("normx.explanations.explain.model_handle", lambda m: made.append(real_handle(m)) or made[-1])
    normx.explain(model, tok, tiny.TEXTS, batch_size=1)
    assert len(made) == 1 and len(calls) == 1


def test_a_discovered_model_offloaded_by_device_map_gives_the_same_scores(tmp_path):
    pytest.importorskip("accelerate", reason="device_map needs accelerate")
    model = build("olmo2", "Olmo2ForCausalLM", "causal_lm")
    model.save_pretrained(tmp_path / "model")
    layers = model.config.num_hidden_layers
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.norm": "cpu", "lm_head": "cpu",
                  **{f"model.layers.{i}": "disk" if i == layers - 1 else "cpu" for i in range(layers)}}
    offloaded = __import__("transformers").AutoModelForCausalLM.from_pretrained(
        tmp_path / "model", device_map=device_map, offload_folder=str(tmp_path / "off"))
    assert "disk" in offloaded.hf_device_map.values()
    for method in ("normxlogit", "gradient_x_input"):
        layer = "all" if method == "normxlogit" else None
        for a, b in zip(normx.explain(model, tokenizer(), TEXTS, method=method, layer=layer),
                        normx.explain(offloaded, tokenizer(), TEXTS, method=method, layer=layer)):
            assert a.family == b.family == "olmo2 (discovered)"
            np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5, atol=1e-5)
