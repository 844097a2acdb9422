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


def _plan_by_hand(sources, prompt_length, steps, budget, seed, costs, per_pass):
    """The plan counted the slow way: every candidate design's masks counted alone one at a time, then together
    (its runs and stems again for every count), the one buying the most kept (ties: the first seed)."""
    left = planning.SPEND * budget - planning.whole_cost(prompt_length, steps, costs)
    k = len(sources)
    every = designs.distinct(k)

    def together(masks):
        return planning._together(sources, masks, stems.runs(sources, masks, prompt_length), prompt_length, steps,
                                  costs, per_pass)

    for kind in ("fold_over", "screening"):
        bought = {}
        for drawn in range(seed * planning.CANDIDATES, (seed + 1) * planning.CANDIDATES):
            count, spent = 0, 0.0
            for mask in designs.masks(k, min(every, 512), drawn, kind):
                spent += float(planning.mask_costs(sources, mask[None], prompt_length, steps, True, costs,
                                                   per_pass)[0])
                if spent > left:
                    break
                count += 1
            count = min(max(count, planning.MIN_ABLATIONS), min(every, 512))
            while count < min(every, 512) and together(designs.masks(k, count + 1, drawn, kind)) <= left:
                count += 1
            while count > planning.MIN_ABLATIONS and together(designs.masks(k, count, drawn, kind)) > left:
                count -= 1
            bought[drawn] = count
        drawn = max(bought, key=lambda d: (bought[d], -d))
        whole = designs.block(k, "fold_over")
        if kind == "screening" or (whole and bought[drawn] >= whole - 1):
            return designs.masks(k, bought[drawn], drawn, kind)
    raise AssertionError("unreachable")


PLANS = [((30, 25, 40, 35, 30, 28, 32), 300, 6.0, 0), ((150,) * 8, 1250, 6.0, 1), ((20,) * 12, 300, 6.0, 0),
         ((60, 10, 90, 40, 120), 400, 12.0, 2), ((25,) * 10, 300, 2.0, 0), ((5, 7, 9), 60, 24.0, 0)]
COSTS = planning.Costs(2e8, 5e7, 7e4)


def _laid_out(sizes) -> list[list[int]]:
    sources, at = [], 4
    for size in sizes:
        sources.append(list(range(at, at + size)))
        at += size + 1
    return sources


@pytest.mark.parametrize(("sizes", "prompt_length", "budget", "seed"), PLANS)
def test_the_plan_is_the_candidate_that_buys_the_most(sizes, prompt_length, budget, seed):
    costs = COSTS
    sources = _laid_out(sizes)
    want = _plan_by_hand(sources, prompt_length, 8, budget, seed, costs, 8)
    got = planning.plan_masks(sources, prompt_length, 8, budget, seed, True, costs, 8)
    np.testing.assert_array_equal(got, want)
    got[:] = ~got  # (the plan is the caller's: the designs kept for the next plan are not changed by it)
    np.testing.assert_array_equal(planning.plan_masks(sources, prompt_length, 8, budget, seed, True, costs, 8), want)


@pytest.mark.parametrize(("sizes", "prompt_length", "budget", "seed"), PLANS)
def test_whether_a_plan_buys_more_masks_is_told_without_the_plan(sizes, prompt_length, budget, seed):
    """The groups' bisection asks only whether a plan buys more masks than a number (``buys_more``, which stops at the
    first candidate that does): its answer is the whole plan's, on either side of a resolution IV design's size."""
    sources = _laid_out(sizes)
    bought = len(planning.plan_masks(sources, prompt_length, 8, budget, seed, True, COSTS, 8))
    whole = designs.block(len(sources), "fold_over")
    for than in sorted({1, 2, bought - 1, bought, bought + 1, whole - 2, whole - 1, whole} - {0, -1, -2}):
        got = planning.buys_more(sources, than, prompt_length, 8, budget, seed, COSTS, 8)
        assert got == (bought > than), (than, bought)
