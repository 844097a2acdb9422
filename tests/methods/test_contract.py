"""The contract every registered method keeps, on one model of each kind of head (encoder and decoder classifiers,
a masked LM, causal LMs): result shapes, the same scores in a padded batch as alone, nothing left changed on the
model, the model's dtype followed. Methods that do not support a family say so (``Method.unsupported``) and must
then refuse it with ``UnsupportedModelError`` rather than give an answer.
"""

from __future__ import annotations

import numpy as np
import pytest
import tiny
import torch

import normx
from normx.methods import get_method

FAMILIES = ["BertForSequenceClassification", "LlamaForSequenceClassification-eos-pad", "RobertaForMaskedLM",
            "GPT2LMHeadModel", "Qwen3ForCausalLM"]
OPTIONS = {"integrated_gradients": {"n_steps": 3}, "value_zeroing": {"internal_batch_size": 16}}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", normx.list_methods(experimental=True))
def test_method_contract(method, family, unchanged):
    model, tokenizer = tiny.build(family)
    unchanged(model)
    texts = tiny.texts_for(tiny.CASE_BY_ID[family], tokenizer)
    spec = get_method(method)
    options = OPTIONS.get(method, {})
    if spec.unsupported(model) is not None:
        with pytest.raises(normx.UnsupportedModelError):
            normx.explain(model, tokenizer, texts[0], method=method, **options)
        return
    layer = "all" if spec.layered else None
    batched = normx.explain(model, tokenizer, texts, method=method, layer=layer, **options)
    for text, together in zip(texts, batched):
        alone = normx.explain(model, tokenizer, text, method=method, layer=layer, **options)
        expected_layers = list(range(tiny.LAYERS + 1)) if spec.layered else [0]
        assert together.layers == expected_layers and together.method == method
        assert together.scores.shape == (len(together.labels), len(expected_layers), len(together.tokens))
        assert together.scores.dtype == np.float32 and np.isfinite(together.scores).all()
        assert together.tokens == alone.tokens and together.prediction == alone.prediction
        np.testing.assert_allclose(together.scores, alone.scores, rtol=1e-4, atol=2e-5)  # padding changes nothing
        assert together.settings["dtype"] == "float32" and together.pooled is not None
        assert set(together.diagnostics) == set(spec.diagnostics)  # what it reports is what it says it reports


@pytest.mark.parametrize("method", normx.list_methods(experimental=True))
def test_dtype_follows_the_model(method, unchanged):
    encoder, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    if get_method(method).unsupported(encoder) is not None:  # the decoder methods: a decoder
        encoder, tokenizer = tiny.build("LlamaForSequenceClassification", fresh=True)
    model = encoder
    model.to(torch.bfloat16)
    unchanged(model)
    e = normx.explain(model, tokenizer, tiny.TEXTS[0], method=method, **OPTIONS.get(method, {}))
    assert e.settings["dtype"] == "bfloat16" and e.scores.dtype == np.float32 and np.isfinite(e.scores).all()
    assert next(model.parameters()).dtype == torch.bfloat16
