"""The device and dtype follow the model: half-precision models explain in their own dtype."""

import minilm
import numpy as np
import pytest
import torch

import normx

TEXTS = ["a gripping, beautifully acted film", "the plot is thin and the jokes fall flat"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_follows_the_model(dtype):
    model32, tokenizer = minilm.classifier()
    model, _ = minilm.fresh_classifier()
    model.to(dtype)
    full = normx.explain(model32, tokenizer, TEXTS, target="positive", layer="all")
    half = normx.explain(model, tokenizer, TEXTS, target="positive", layer="all")
    enc = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits.float()
    for i, (f, h) in enumerate(zip(full, half)):
        assert h.settings["dtype"] == str(dtype).replace("torch.", "")
        assert h.scores.dtype == np.float32  # results are float32 whatever the model dtype
        # the head at the pooled position reproduces the half-precision model's own probabilities
        assert h.probabilities["positive"] == pytest.approx(float(logits[i].softmax(-1)[1]), abs=2e-3)
        # and the attributions agree with fp32 up to half-precision rounding
        assert np.corrcoef(f.scores.ravel(), h.scores.ravel())[0, 1] > 0.99
