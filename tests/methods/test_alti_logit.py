"""ALTI-Logit for decoders: a closed-form check against the model's own attention outputs, the one-pass generation
rows against the method on each step's prefix, and a refusal."""

from __future__ import annotations

import dataclasses

import architectures
import numpy as np
import pytest
import tiny
import torch

import normx
from normx.errors import UnsupportedModelError
from normx.methods.registry import _METHODS, get_method
from normx.models import get_adapter
from normx.models.decoder_attention import attention_module

# RMSNorm families without an attention output bias (Gemma 3: with a post-attention norm)
FAMILIES = [("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM"), ("mistral", "MistralForCausalLM"),
            ("gemma3_text", "Gemma3ForCausalLM")]
TARGET = 5


def _attention_logits(model, tok, text: str) -> np.ndarray:
    """Per block, the direct logit of TARGET from what its attention adds to the last token's residual stream (its
    output, post-normed where the block norms it), read through the final RMSNorm linearised at the last residual
    state (norm(x) / x elementwise: RMSNorm scales each coordinate) and the LM head's row: from the modules' own
    outputs, independently of normx."""
    base = model
    adapter = get_adapter(model)
    blocks = adapter.block_modules(base)
    added, captured, handles = {}, {}, []
    for i, block in enumerate(blocks):
        post = block.post_attention_layernorm if hasattr(block, "post_feedforward_layernorm") else None
        module = post if post is not None else attention_module(block)
        handles.append(module.register_forward_hook(
            lambda m, a, o, i=i: added.__setitem__(i, (o[0] if isinstance(o, tuple) else o)[0, -1].double())))
    handles.append(blocks[-1].register_forward_hook(  # x^L at the query, before the final norm
        lambda m, a, o: captured.__setitem__("x", (o[0] if isinstance(o, tuple) else o)[0, -1].double())))
    try:
        with torch.no_grad():
            model(**tok(text, return_tensors="pt"))
    finally:
        for handle in handles:
            handle.remove()
    x = captured["x"]
    with torch.no_grad():
        ratio = adapter.norm_module(base)(x.float()[None]).double()[0] / x
    row = model.get_output_embeddings().weight[TARGET].detach().double()
    return np.array([float((added[i] * ratio) @ row) for i in sorted(added)])


@pytest.mark.parametrize(("model_type", "name"), FAMILIES)
def test_scores_sum_to_the_attentions_direct_logits(model_type, name):
    """Each ALTI rollout row sums to one, so the scores at layer l sum to the direct logits of the attention outputs
    of blocks 1..l at the query."""
    model = architectures.build(model_type, name, "causal_lm")
    tok = architectures.word_tokenizer(model, "causal_lm")
    text = architectures.reference_texts(model, "causal_lm")[0]
    e = normx.explain(model, tok, text, method="alti_logit", layer="all", target=[TARGET])
    want = np.cumsum(_attention_logits(model, tok, text))
    np.testing.assert_allclose(e.scores[0, 1:].sum(-1), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    assert np.all(e.scores[0, 0] == 0)  # layer 0: no block read yet


def test_one_pass_generation_rows_equal_each_step_alone(monkeypatch):
    model, tok = tiny.build("LlamaForCausalLM")
    spec = get_method("alti_logit")
    g = normx.explain_generation(model, tok, "the film", method="alti_logit", layer="all",
                                 target=" was a gripping story")
    for t in range(g.steps):
        p = g.prompt_length + t
        prefix = tok.decode(g.token_ids[:p], skip_special_tokens=True)
        want = normx.explain(model, tok, prefix, method="alti_logit", target=g.token_ids[p], layer="all")
        np.testing.assert_allclose(g.step(t).scores, want.scores, rtol=1e-4, atol=1e-6)
    monkeypatch.setitem(_METHODS, "alti_logit", dataclasses.replace(spec, query_rows=None))
    steps = normx.explain_generation(model, tok, "the film", method="alti_logit", layer="all",
                                     target=" was a gripping story", batch_size=2)
    np.testing.assert_allclose(g.scores, steps.scores, rtol=1e-4, atol=1e-6)


def test_a_mixture_of_experts_is_refused():
    model = architectures.build("mixtral", "MixtralForCausalLM", "causal_lm")
    tok = architectures.word_tokenizer(model, "causal_lm")
    with pytest.raises(UnsupportedModelError, match=r"ALTI-Logit for decoders cannot decompose .*no activation module"):
        normx.explain(model, tok, architectures.reference_texts(model, "causal_lm")[0], method="alti_logit")


def test_blocks_made_again_give_the_kept_recordings_scores(monkeypatch):
    """ALTI-Logit's lazy recording (each block's input and call kept; its attention output, queries and keys made
    again by running it alone, one block at a time) gives the scores of the recording that keeps every block's, to
    the bit (a padded batch, every layer), and holds at most one block's at a time."""
    from normx.methods.decoder import alti_logit, decompose

    model, tok = tiny.build("Qwen2ForCausalLM")
    texts = ["the film was a gripping story", "a dull movie"]
    load, held = decompose.DecoderRecording.load, []

    def counted(rec, i):
        load(rec, i)
        held.append(sum(probs is not None for probs in rec.probs))

    monkeypatch.setattr(decompose.DecoderRecording, "load", counted)
    lazy = normx.explain(model, tok, texts, method="alti_logit", layer="all", target=[TARGET])
    assert held and max(held) == 1, held
    monkeypatch.setattr(alti_logit, "record_decoder", lambda run, mlp=True, lazy=False, method="": (
        decompose.record_decoder(run, mlp, method=method)))
    kept = normx.explain(model, tok, texts, method="alti_logit", layer="all", target=[TARGET])
    for mine, theirs in zip(lazy, kept):
        assert np.array_equal(mine.scores, theirs.scores), np.abs(mine.scores - theirs.scores).max()


def test_a_block_that_computes_otherwise_when_run_again_is_refused():
    """A block whose output on its recorded input differs when it runs alone (outside the model's forward) is
    refused rather than read with attention quantities that do not belong to the recorded pass."""
    model, tok = tiny.build("LlamaForCausalLM")
    block = get_adapter(model).block_modules(model)[-1]
    inside, alone = [], []

    def drift(_module, _args, output):
        if inside:
            return None
        alone.append(1)
        return output + 0.5 if isinstance(output, torch.Tensor) else (output[0] + 0.5, *output[1:])

    handles = [model.model.register_forward_pre_hook(lambda *_: inside.append(1)),
               model.model.register_forward_hook(lambda *_: inside.clear()), block.register_forward_hook(drift)]
    try:
        with pytest.raises(UnsupportedModelError, match=r"ALTI-Logit for decoders .*run again alone"):
            normx.explain(model, tok, "the film was a gripping story", method="alti_logit", target=[TARGET])
    finally:
        for handle in handles:
            handle.remove()
    assert alone
