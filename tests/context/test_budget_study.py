"""studies/context/budget.py's timing (#56): a method is called as a user calls it, its wall time read against plain
forward passes timed right before and right after it; only the process's first call is marked as the one that does
the first-use work; a spec names the method and options that are called."""

from __future__ import annotations

import numpy as np
import pytest
import tiny

from studies.context import budget

PROMPT = "Context: the film was good. a dull movie! the end was fine. it was long.\nQuestion: good?\nAnswer:"


@pytest.fixture(scope="module")
def llama():
    return tiny.build("LlamaForCausalLM")


def test_a_spec_names_the_call():
    spans = [(2, 5), (6, 9)]
    assert budget.call_of("budgeted:seed=0,budget=fast", spans) == ("budgeted", {"seed": 0, "budget": "fast"})
    assert budget.call_of("contextcite@32", spans) == ("contextcite", {"n_ablations": 32, "sources": spans})
    assert budget.call_of("budgeted:sources=given", spans) == ("budgeted", {"sources": [[2, 5], [6, 9]]})


def test_a_call_is_timed_between_two_forward_passes(llama, monkeypatch):
    model, tokenizer = llama
    ids = tokenizer(PROMPT)["input_ids"]
    response = tokenizer(" yes it was", add_special_tokens=False)["input_ids"][:3]
    whole = ids + response
    spans = [(1, 8), (8, 14)]
    monkeypatch.setattr(budget, "_CALLED", [])
    runs = [budget._run(model, tokenizer, PROMPT, "attention", {}, response, whole, spans, 1.0, 0) for _ in range(2)]
    for scores, took, _settings, around in runs:
        assert scores.shape == (2,) and np.isfinite(scores).all()
        assert took > 0 and len(around) == 2 and all(seconds > 0 for seconds in around)
    np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=1e-6)  # the same call: the same scores
    assert runs[0][2].get("first_call") is True and "first_call" not in runs[1][2]
    scores, took, settings, around = budget._run(model, tokenizer, PROMPT, "position", {}, response, whole, spans,
                                                 0.5, 0)
    assert scores.tolist() == [0.0, 1.0] and took == 0.0 and around == [0.5, 0.5] and settings == {}
