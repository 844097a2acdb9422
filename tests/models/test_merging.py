"""Merging PEFT adapters for serving (normx.models.merge_adapters): the merged model is the plain transformers model
with fewer operations, its logits and NormXLogit scores those of the adapter model; a merge that moves the logits
is undone; anything that is not a mergeable PEFT model comes back untouched."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from peft_cases import PEFT_CASES, fresh_peft_model
from tiny import TEXTS, build

import normx
from normx.errors import ModelLoadError
from normx.models import merge_adapters
from normx.models.merging import mergeable

CASES = ["bert-seqcls-save", "gpt2-seqcls", "llama-seqcls-lora-head", "llama-causal", "mistral-causal-save",
         "roberta-mlm-save"]


def logits(model, tokenizer, text):
    with torch.no_grad():
        return model(**tokenizer(text, return_tensors="pt")).logits


def lora_layers(model) -> int:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return sum(isinstance(m, BaseTunerLayer) for m in model.modules())


def forward_ops(model, tokenizer, text) -> int:
    from torch.overrides import TorchFunctionMode

    class Count(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    with Count():
        logits(model, tokenizer, text)
    return Count.calls


@pytest.mark.parametrize("name", CASES)
def test_merged_model_is_the_adapter_model_with_fewer_operations(name):
    assert name in PEFT_CASES
    model, tokenizer, _, _ = fresh_peft_model(name)
    before = {text: logits(model, tokenizer, text) for text in TEXTS[:3]}
    text = TEXTS[0] + (f" {tokenizer.mask_token}" if "MaskedLM" in type(model.get_base_model()).__name__ else "")
    scores = normx.explain(model, tokenizer, text, layer="all").scores
    ops = forward_ops(model, tokenizer, TEXTS[1])
    assert lora_layers(model) > 0

    merged, done = merge_adapters(model, tokenizer)

    assert done and not hasattr(merged, "peft_config") and lora_layers(merged) == 0
    for other, expected in before.items():  # texts other than the probe
        torch.testing.assert_close(logits(merged, tokenizer, other), expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(normx.explain(merged, tokenizer, text, layer="all").scores, scores,
                               rtol=1e-3, atol=1e-4)
    assert forward_ops(merged, tokenizer, TEXTS[1]) < ops


def test_a_merge_that_moves_the_logits_is_undone(caplog):
    model, tokenizer, _, _ = fresh_peft_model("bert-seqcls-save")
    expected = logits(model, tokenizer, TEXTS[0])
    with caplog.at_level(logging.WARNING, logger="normx.models.merging"):
        same, done = merge_adapters(model, tokenizer, rtol=0.0)  # float merging always moves the last bits
    assert not done and same is model and lora_layers(model) > 0
    from peft.tuners.tuners_utils import BaseTunerLayer

    assert not any(layer.merged for layer in model.modules() if isinstance(layer, BaseTunerLayer))
    # peft subtracts what it added: the weights are back up to float32 rounding
    torch.testing.assert_close(logits(model, tokenizer, TEXTS[0]), expected, rtol=1e-5, atol=1e-5)
    assert "not merged" in caplog.text and "moved by" in caplog.text


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_not_merged(dtype):
    model, tokenizer, _, _ = fresh_peft_model("bert-seqcls-save")
    model.to(dtype)
    weights = {name: p.clone() for name, p in model.named_parameters()}
    same, done = merge_adapters(model, tokenizer)
    assert not done and same is model and lora_layers(model) > 0
    assert all(torch.equal(p, weights[name]) for name, p in model.named_parameters())


def test_other_models_come_back_untouched():
    model, tokenizer = build("BertForSequenceClassification")
    assert not mergeable(model)
    assert merge_adapters(model, tokenizer) == (model, False)


def test_prompt_learning_is_not_mergeable():
    from peft import PromptTuningConfig, get_peft_model

    base, tokenizer = build("BertForSequenceClassification", fresh=True)
    model = get_peft_model(base, PromptTuningConfig(task_type="SEQ_CLS", num_virtual_tokens=2))
    assert not mergeable(model)
    assert merge_adapters(model.eval(), tokenizer) == (model, False)


def test_a_model_in_training_mode_is_refused():
    model, tokenizer, _, _ = fresh_peft_model("bert-seqcls-save")
    with pytest.raises(ModelLoadError, match="eval mode"):
        merge_adapters(model.train(), tokenizer)
