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


def far_drop(model, g, t, k, mode, keep):
    """The position-controlled protocol's drop for one step at one K, by hand: the ``keep`` tokens before the
    generated one stay; the method's order restricted to the earlier ones; int(m * K) of those m deleted."""
    p = g.prompt_length + t
    row = g.rows()[t]
    order = [i for i in np.argsort(-row, kind="stable") if i < p - keep]
    count = int(len(order) * k)
    gone = set(order[:count]) if mode == "comprehensiveness" else set(order[count:])
    kept = [g.token_ids[i] for i in range(p) if i not in gone]
    token = g.token_ids[p]
    return probability(model, g.token_ids[:p], token) - probability(model, kept, token)


def test_position_controlled_protocol_deletes_only_beyond_the_recent_tokens():
    model, tok = tiny.build("LlamaForCausalLM")
    keep = 12  # the first prompt has 16 tokens: 4 far tokens at step 0; the second has 20
    report = generation_faithfulness(model, tok, PROMPTS, ["recency", "normxlogit"], max_new_tokens=3,
                                     progress=False, keep_recent=keep, min_far=5)
    g = normx.explain_generation(model, tok, PROMPTS[0], max_new_tokens=3, method="normxlogit")
    far = [g.prompt_length + t - keep >= 5 for t in range(g.steps)]
    assert far == [False, True, True] and report.far_steps == 2 + 3
    for t in range(g.steps):
        for mode in ("comprehensiveness", "sufficiency"):
            got = report.per_step["normxlogit"]["far_" + mode][t]
            if not far[t]:
                assert got is None
                continue
            want = np.mean([far_drop(model, g, t, k, mode, keep) for k in report.ks])
            assert got == pytest.approx(want, abs=1e-5)
    # the standard protocol is unchanged by keep_recent
    plain = generation_faithfulness(model, tok, PROMPTS, ["normxlogit"], max_new_tokens=3, progress=False)
    np.testing.assert_allclose(plain.per_step["normxlogit"]["comprehensiveness"],  # batched with other rows: rounding
                               report.per_step["normxlogit"]["comprehensiveness"], atol=1e-6)
    assert "far_comprehensiveness" not in plain.aopc["normxlogit"]
    assert report.position_correlation["recency"] == pytest.approx(1.0)


def test_rankings_that_differ_only_among_the_recent_tokens_score_the_same_far():
    """recency, and a ranking equal to it on the far tokens but reversed among the recent ones: the same far AOPC
    (the recent tokens are never ranked there), different rankings on the standard protocol."""
    from normx.methods import Method, register_method

    keep = 6

    def recent_reversed(ctx):  # run per step on the step's prefix (not per_position): it knows where the prefix ends
        mask = ctx.run.inputs["attention_mask"]
        positions = ((mask.cumsum(-1) - 1).clamp_min(0) * mask).float()
        length = mask.sum(-1, keepdim=True).float()
        recent = positions >= length - keep
        return ctx.expand(torch.where(recent, 3 * length - positions, positions)[:, None])

    register_method(Method("test_recent_reversed", recent_reversed, "test", label_dependent=False, layered=False,
                           experimental=True), overwrite=True)
    model, tok = tiny.build("LlamaForCausalLM")
    report = generation_faithfulness(model, tok, PROMPTS, ["recency", "test_recent_reversed"], max_new_tokens=3,
                                     progress=False, keep_recent=keep)
    assert report.far_steps == report.steps == 6
    for mode in ("far_comprehensiveness", "far_sufficiency"):  # the same deletions, so the same cached runs
        assert report.per_step["test_recent_reversed"][mode] == report.per_step["recency"][mode]
    assert report.position_correlation["test_recent_reversed"] < report.position_correlation["recency"] == 1.0


def test_a_label_runs_a_registered_method_at_its_options():
    model, tok = tiny.build("LlamaForCausalLM")
    report = generation_faithfulness(model, tok, PROMPTS, ["at1", "normxlogit"], max_new_tokens=2, progress=False,
                                     method_options={"at1": {"method": "normxlogit", "layer": 1}})
    direct = generation_faithfulness(model, tok, PROMPTS, ["normxlogit"], max_new_tokens=2, progress=False,
                                     method_options={"normxlogit": {"layer": 1}})
    assert report.per_step["at1"] == direct.per_step["normxlogit"]
    assert report.settings["methods_run"] == {"at1": "normxlogit", "normxlogit": "normxlogit"}


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_keep_recent_must_be_a_positive_count(bad):
    model, tok = tiny.build("LlamaForCausalLM")
    with pytest.raises(normx.InvalidInputError, match="keep_recent"):
        generation_faithfulness(model, tok, PROMPTS, ["recency"], keep_recent=bad, progress=False)


@pytest.mark.parametrize("method", ["normxlogit", "gradient_x_input"])
def test_supplied_rows_score_as_the_methods_own(method):
    """Rows computed elsewhere are scored by the same protocol: a method's own rows, supplied as its explained
    generations or returned by a function of the protocol's generations, give exactly its AOPC; other rows other
    numbers (the rows are really read)."""
    model, tok = tiny.build("LlamaForCausalLM")
    first = normx.explain_generation(model, tok, PROMPTS, max_new_tokens=3)
    explained = normx.explain_generation(model, tok, PROMPTS, method=method,
                                         target=[g.token_ids[g.prompt_length:] for g in first])
    seen = []

    def computed(generations):
        seen.extend(generations)
        return [e.rows() for e in explained]

    report = generation_faithfulness(model, tok, PROMPTS, [method], max_new_tokens=3, progress=False,
                                     rows={"given": explained, "computed": computed})
    assert report.steps == 6 and report.methods == [method, "given", "computed"]
    assert [g.token_ids for g in seen] == [g.token_ids for g in first]  # the function got the protocol's steps
    assert report.settings["supplied_rows"] == ["given", "computed"]
    for mode in ("comprehensiveness", "sufficiency"):
        assert report.per_step["given"][mode] == report.per_step[method][mode]
        assert report.per_step["computed"][mode] == report.per_step[method][mode]
        assert report.aopc["given"][mode] == report.aopc[method][mode]
    shuffled = [[np.random.default_rng(t).permutation(r) for t, r in enumerate(e.rows())] for e in explained]
    other = generation_faithfulness(model, tok, PROMPTS, [], max_new_tokens=3, progress=False,
                                    rows={"shuffled": lambda generations: shuffled})
    assert other.methods == ["shuffled"]
    assert other.per_step["shuffled"] != report.per_step[method]


def test_supplied_rows_for_other_ids_of_the_wrong_length_or_not_finite_are_refused():
    model, tok = tiny.build("LlamaForCausalLM")
    first = normx.explain_generation(model, tok, PROMPTS, max_new_tokens=3)
    rows = [g.rows() for g in first]

    def score(value, methods=()):
        return generation_faithfulness(model, tok, PROMPTS, list(methods), max_new_tokens=3, progress=False,
                                       rows={"external": value})

    other = normx.explain_generation(model, tok, PROMPTS, max_new_tokens=2)
    with pytest.raises(normx.InvalidInputError, match="other ids"):
        score(other)
    with pytest.raises(normx.InvalidInputError, match="one row per generated token"):
        score(lambda generations: [[r[:-1] for r in prompt] for prompt in rows])
    with pytest.raises(normx.InvalidInputError, match="one row per generated token"):
        score(lambda generations: [prompt[:-1] for prompt in rows])
    with pytest.raises(normx.InvalidInputError, match="for 1 generations"):
        score(lambda generations: rows[:1])
    with pytest.raises(normx.InvalidInputError, match="NaN"):
        score(lambda generations: [[np.where(np.arange(len(r)) == 0, np.nan, r) for r in p] for p in rows])
    with pytest.raises(normx.InvalidInputError, match="also among methods"):
        score(first, methods=["external"])
