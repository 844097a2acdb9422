"""The reference is the model as its user runs it (issue #34): ``model(**tokenizer(text))`` on each text alone,
nothing added. normx's padded batches and forward pass must equal it, and the first-use check must notice when they
do not — it compares with the plain call, never with the model run on normx's own inputs."""

from __future__ import annotations

import architectures
import numpy as np
import pytest
import torch

import normx
from normx.core import verify
from normx.core.batch import collate
from normx.errors import UnsupportedModelError
from normx.models import HeadKind

# decoders that number positions from padding_idx + 1 (their own forward does, given no position_ids)
ROBERTA_DECODERS = [("roberta", "RobertaForCausalLM"), ("roberta-prelayernorm", "RobertaPreLayerNormForCausalLM"),
                    ("data2vec-text", "Data2VecTextForCausalLM"), ("xlm-roberta", "XLMRobertaForCausalLM"),
                    ("camembert", "CamembertForCausalLM"), ("xlm-roberta-xl", "XLMRobertaXLForCausalLM")]


@pytest.mark.parametrize(("model_type", "name"), ROBERTA_DECODERS, ids=[n for _, n in ROBERTA_DECODERS])
def test_roberta_family_decoders_equal_the_plain_call(model_type, name):
    model = architectures.build(model_type, name, "causal_lm")
    assert model.config.is_decoder
    assert architectures.reference_check(model, "causal_lm") <= architectures.TOLERANCE


def test_every_generation_step_equals_the_plain_call_on_its_prefix():
    model = architectures.build("roberta", "RobertaForCausalLM", "causal_lm")
    tokenizer = architectures.word_tokenizer(model, "causal_lm")
    prompt, continuation = architectures.reference_texts(model, "causal_lm")
    generation = normx.explain_generation(model, tokenizer, prompt, target=" " + continuation)
    ids = generation.token_ids
    assert generation.scores.shape[1] == len(ids) - generation.prompt_length > 0
    for t, p in enumerate(range(generation.prompt_length, len(ids))):
        with torch.no_grad():
            own = model(input_ids=torch.tensor([ids[:p]]), output_hidden_states=True)
        want = (own.hidden_states[0][0].float().norm(dim=-1) * own.logits[0, :, ids[p]].float()).numpy()
        got = generation.scores[-1, t, :p]
        assert np.abs(got - want).max() <= architectures.TOLERANCE * np.abs(want).max()


def test_xlm_with_lm_head_is_a_masked_lm_unless_its_config_is_causal():
    masked = architectures.build("xlm", "XLMWithLMHeadModel", "masked_lm")
    assert not masked.config.causal
    assert verify.verified_adapter(masked).kind is HeadKind.MASKED_LM
    assert architectures.reference_check(masked, "masked_lm") <= architectures.TOLERANCE
    causal = architectures.build("xlm", "XLMWithLMHeadModel", "causal_lm")
    assert causal.config.causal
    assert verify.verified_adapter(causal).kind is HeadKind.CAUSAL_LM
    assert architectures.reference_check(causal, "causal_lm") <= architectures.TOLERANCE


def test_a_bidirectional_model_is_not_explained_as_a_causal_lm():
    """A RoBERTa *ForCausalLM left with is_decoder=False attends both ways: one pass does not hold the steps."""
    model = architectures.build("roberta", "RobertaForCausalLM", "masked_lm")  # the default config, not a decoder
    assert not model.config.is_decoder
    with pytest.raises(UnsupportedModelError, match=r"causality.*is_decoder=True"):
        verify.verified_adapter(model)


def _patched_collate(monkeypatch, change):
    def patched(items, pad_id, device):
        return change(collate(items, pad_id, device))

    monkeypatch.setattr(verify, "collate", patched)


def test_the_check_notices_inputs_that_change_the_models_numbering(monkeypatch):
    """normx once passed position_ids = 0..n-1 to every decoder; a RoBERTa decoder numbers from padding_idx + 1.
    Had the check compared with the model run on normx's own inputs, both would agree."""
    def arange_positions(batch):
        mask = batch["attention_mask"]
        return {**batch, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}

    _patched_collate(monkeypatch, arange_positions)
    with pytest.raises(UnsupportedModelError, match=r"embeddings.*probe row 0"):
        verify.verified_adapter(architectures.build("roberta", "RobertaForCausalLM", "causal_lm"))
    llama = architectures.build("llama", "LlamaForCausalLM", "causal_lm")  # numbers from 0: the same computation
    assert verify.verified_adapter(llama).kind is HeadKind.CAUSAL_LM


def test_a_model_whose_padded_batch_differs_gets_one_text_per_pass(monkeypatch):
    """Left padding without position ids shifts a rotary decoder's positions: the check sees the padded batch differ
    from each text alone (while each text alone matches), and normx then explains that model one text per pass."""
    def left_padded(batch):
        mask = batch["attention_mask"]
        out = {key: value.clone() for key, value in batch.items()}
        for r, n in enumerate(mask.sum(-1).tolist()):
            for value in out.values():
                value[r] = torch.cat([value[r, n:], value[r, :n]])
        return out

    model = architectures.build("llama", "LlamaForCausalLM", "causal_lm")
    assert verify.verify(model, verify.get_adapter(model)) is True  # normx's own right padding: the same
    _patched_collate(monkeypatch, left_padded)
    assert verify.verify(model, verify.get_adapter(model)) is False
    verify.verified_adapter(model)
    assert not verify.takes_padding(model)


def test_models_that_ignore_the_attention_mask_are_explained_one_text_at_a_time():
    """FNet mixes tokens by Fourier transforms, with no attention mask: a padded batch would change every row."""
    model = architectures.build("fnet", "FNetForSequenceClassification", "sequence_classification")
    verify.verified_adapter(model)
    assert not verify.takes_padding(model)
    assert architectures.reference_check(model, "sequence_classification") <= architectures.TOLERANCE
    llama = architectures.build("llama", "LlamaForSequenceClassification", "sequence_classification")
    verify.verified_adapter(llama)
    assert verify.takes_padding(llama)


def test_normx_passes_the_model_nothing_but_the_tokenizers_inputs():
    model = architectures.build("llama", "LlamaForCausalLM", "causal_lm")
    tokenizer = architectures.word_tokenizer(model, "causal_lm")
    verify.verified_adapter(model)  # (the first-use check runs the model's own forward too)
    seen = []
    hook = model.model.register_forward_pre_hook(
        lambda _, args, kwargs: seen.append({k for k, v in kwargs.items() if v is not None}), with_kwargs=True)
    try:
        normx.explain(model, tokenizer, architectures.reference_texts(model, "causal_lm"), batch_size=2)
    finally:
        hook.remove()
    assert seen and all(keys <= {"input_ids", "attention_mask", "use_cache"} for keys in seen), seen
