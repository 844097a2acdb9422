"""Faithfulness for generation: each step's prefix with its top-K % tokens deleted, run again, and the drop in the
generated token's probability, checked against a hand-run deletion on the model itself."""

from __future__ import annotations

import numpy as np
import pytest
import tiny
import torch

import normx
from normx.evaluation.generation import generation_faithfulness

PROMPTS = ["the film was a gripping story of", "a dull movie with a predictable plot and"]


def probability(model, ids: list[int], token: int) -> float:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
    return torch.softmax(logits.float(), -1)[token].item()


def test_drops_are_the_models_own_probabilities_after_deleting_the_top_tokens():
    model, tok = tiny.build("LlamaForCausalLM")
    report = generation_faithfulness(model, tok, PROMPTS, ["normxlogit", "random"], max_new_tokens=3, progress=False)
    assert report.steps == 6 and report.prompts == 2 and report.ks == tuple(k / 10 for k in range(1, 10))
    # by hand, for every step of the first prompt: the per-step AOPC is the mean over K of the drops
    g = normx.explain_generation(model, tok, PROMPTS[0], max_new_tokens=3)
    for t in range(g.steps):
        for mode in ("comprehensiveness", "sufficiency"):
            want = np.mean([report_drop(model, g, t, k, mode) for k in report.ks])
            assert report.per_step["normxlogit"][mode][t] == pytest.approx(want, abs=1e-5)
    table = report.table()
    assert table.count("\n") == 3 and "| normxlogit |" in table and "±" in table
    assert set(report.to_dict()["aopc"]) == {"normxlogit", "random"}


def report_drop(model, g, t, k, mode):
    """The drop the report's protocol gives for one step at one K (ranking, int(n * K), deletion), by hand."""
    p = g.prompt_length + t
    row = g.rows()[t]
    order = [i for i in np.argsort(-row, kind="stable") if i != p - 1]
    count = min(int(p * k), len(order))
    gone = set(order[:count]) if mode == "comprehensiveness" else set(order[count:])
    kept = [g.token_ids[i] for i in range(p) if i not in gone]
    token = g.token_ids[p]
    return probability(model, g.token_ids[:p], token) - probability(model, kept, token)


def test_no_prompts_is_an_error():
    model, tok = tiny.build("LlamaForCausalLM")
    with pytest.raises(normx.InvalidInputError, match="at least one prompt"):
        generation_faithfulness(model, tok, [])
