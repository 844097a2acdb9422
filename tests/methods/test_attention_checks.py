"""The attention readings' checks run on a model's first pass of each kind, not on every call
(normx.methods.decoder.checked): the second call of a kind makes no checks and gives the same rows; a new kind (a
padded batch) is checked again; a kind found unreadable goes straight to the eager pass after."""

from __future__ import annotations

import numpy as np
import pytest
import tiny

import normx
from normx.methods.decoder import maps
from normx.models import attention_scores

PROMPT = "the film was good. a dull plot! it was long"


@pytest.fixture
def checks(monkeypatch):
    made = []
    init = maps.Checks.__init__

    def spy(self, method, active=True):
        made.append(active)
        init(self, method, active)

    monkeypatch.setattr(maps.Checks, "__init__", spy)
    return made


@pytest.mark.parametrize("method", ["attention", "norm_attention"])
def test_checked_once_per_kind(checks, method):
    model, tok = tiny.build("LlamaForCausalLM", fresh=True)
    first = normx.explain_generation(model, tok, PROMPT, method=method, target=" it was")
    again = normx.explain_generation(model, tok, PROMPT, method=method, target=" it was")
    assert checks == [True, False]
    np.testing.assert_array_equal(first.scores, again.scores)
    normx.explain_generation(model, tok, [PROMPT, "a dull plot"], method=method, target=[" it was", " it"])
    assert checks[2:] == [True]  # padded rows: another kind, checked on its first pass
    normx.explain_generation(model, tok, [PROMPT, "a dull plot"], method=method, target=[" it was", " it"])
    assert checks[3:] == [False]


def test_an_unreadable_kind_goes_to_eager_after(checks, monkeypatch):
    model, tok = tiny.build("LlamaForCausalLM", fresh=True)
    want = normx.explain_generation(model, tok, PROMPT, method="norm_attention", target=" it was").scores
    model, tok = tiny.build("LlamaForCausalLM", fresh=True)  # the same weights, never read
    probabilities = attention_scores.BlockScores.probabilities
    monkeypatch.setattr(attention_scores.BlockScores, "probabilities",  # recomputed rows that are off
                        lambda self, rows, keys=None: probabilities(self, rows, keys).roll(1, -1))
    passes = []
    model.model.register_forward_hook(lambda *_: passes.append(1))
    first = normx.explain_generation(model, tok, PROMPT, method="norm_attention", target=" it was")
    assert len(passes) >= 2  # the recomputed rows failed their check, then the eager pass
    passes.clear()
    again = normx.explain_generation(model, tok, PROMPT, method="norm_attention", target=" it was")
    assert len(passes) == 1  # straight to the eager pass
    np.testing.assert_allclose(first.scores, want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(again.scores, want, rtol=1e-4, atol=1e-6)
