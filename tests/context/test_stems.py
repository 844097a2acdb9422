"""Stems: masks that read the same tokens after the same first removed token run that stretch once, and continue
from it. The plan (closed form on small cases), the outcomes (equal to whole passes, on a tiny Llama, with stems
forced where any row is saved), and what the planner counts (less than the masks run alone)."""

from __future__ import annotations

import numpy as np
import pytest
import tiny
import torch
from test_budgeted import _by_hand, _context

from normx.methods.ablation import designs, planning, prefix, stems
from normx.methods.ablation.forwards import outcomes


@pytest.fixture(scope="module")
def llama():
    return tiny.build("LlamaForCausalLM")


SOURCES = [list(range(a, a + 5)) for a in range(1, 31, 5)]  # six sources of 5 tokens; token 0 and 31.. in none


def test_runs_are_the_kept_tokens_after_the_first_removed_one():
    keeps = np.array([[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1], [1, 1, 0, 1, 0, 1]], bool)
    found = stems.runs(SOURCES, keeps, 34)
    assert [run.mask for run in found] == [1, 2]
    assert found[0].start == 1 and found[0].kept.tolist() == list(range(6, 34))
    assert found[1].start == 11 and found[1].kept.tolist() == [*range(16, 21), *range(26, 34)]


def test_the_stem_is_the_longest_stretch_worth_sharing():
    # three masks remove source 0; two of them keep sources 1 and 2 (10 tokens alike), the third removes source 1
    keeps = np.array([[0, 1, 1, 0, 1, 1], [0, 1, 1, 1, 0, 1], [0, 0, 1, 1, 1, 1]], bool)
    found = stems.runs(SOURCES, keeps, 34)
    chosen = stems.stems(found, share=0.0, call=0.0)
    assert len(chosen) == 1
    assert chosen[0].start == 1 and chosen[0].members == (0, 1)
    assert chosen[0].kept.tolist() == list(range(6, 16))  # sources 1 and 2: 10 rows saved
    # all three share nothing after token 1 (their next kept tokens differ), so no stem holds the third
    assert stems.stems(found, share=0.0, call=10.0) == []  # (10 rows saved do not pay for a pass of 10)
    assert stems.stems(found, share=10.0, call=0.0) == []  # (nor for a row's share of 10)


@pytest.mark.parametrize("prompt_length", [34, 31])
def test_outcomes_with_stems_equal_whole_passes(llama, monkeypatch, prompt_length):
    """At 31 the sources end the prompt, so the first extra mask's sequence is all stem (the second's, which also
    keeps the last source, begins with it): its first response token is predicted from the stem's last token."""
    model, tok = llama
    torch.manual_seed(0)
    ids = torch.randint(5, 200, (40,)).tolist()
    keeps = np.vstack([np.ones((1, 6), bool), designs.masks(6, 16, 0, "fold_over"),
                       np.array([[0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1]], bool)])
    plain = _context(model, tok, ids, prompt_length)
    alone = outcomes(plain, SOURCES, keeps, shared_prefix=True)[0]
    monkeypatch.setattr(prefix, "CALL_ROWS", 0)  # every stem that saves a row is taken
    found = stems.stems(stems.runs(SOURCES, keeps, prompt_length), 0.0, 0.0)
    assert found and max(len(s.members) for s in found) >= 2
    runs = stems.runs(SOURCES, keeps, prompt_length)
    whole_stem = any(len(s.kept) == len(runs[i].kept) for s in found for i in s.members)
    assert whole_stem == (prompt_length == 31)
    ctx = _context(model, tok, ids, prompt_length)
    shared = outcomes(ctx, SOURCES, keeps, shared_prefix=True)[0]
    assert ctx.notes["ablated_tokens"] < plain.notes["ablated_tokens"]
    np.testing.assert_allclose(shared, alone, atol=2e-5)
    for m in (1, 5, len(keeps) - 2, len(keeps) - 1):
        np.testing.assert_allclose(shared[m], _by_hand(model, ids, prompt_length, SOURCES, keeps[m]), atol=2e-5)


def test_the_planner_counts_the_stems(monkeypatch):
    costs = planning.Costs(2e8, 5e7, 7e4)
    sources = [list(range(4 + 152 * j, 4 + 152 * j + 150)) for j in range(8)]  # eight passages of 150 tokens
    masks = designs.masks(8, 16, 0, "fold_over")
    alone = float(planning.mask_costs(sources, masks, 1250, 8, True, costs, 16).sum())
    together = planning.masks_cost(sources, masks, 1250, 8, True, costs, 16)
    with monkeypatch.context() as patched:
        patched.setattr(stems, "stems", lambda *args: [])
        passes = planning.masks_cost(sources, masks, 1250, 8, True, costs, 16)  # the same passes, no stem
    assert passes >= alone  # (each row's attention as its pass reads it: from the pass's largest cut)
    assert 0.8 * passes < together < 0.95 * passes  # (8 % at this seed: the rows shared, less the stems' pass)
    assert planning.masks_cost(sources, masks, 1250, 8, False, costs, 16) == pytest.approx(
        float(planning.mask_costs(sources, masks, 1250, 8, False, costs, 16).sum()))  # whole passes share nothing
    more = planning.plan_masks(sources, 1250, 8, 6.0, 0, True, costs, 16)
    left = planning.SPEND * 6 - planning.whole_cost(1250, 8, costs)
    assert planning.masks_cost(sources, more, 1250, 8, True, costs, 16) <= left
