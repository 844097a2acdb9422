"""The budgeted context method and the shared-prefix engine under it, on a tiny Llama: ablated sequences run from
their first removed source on after one cached pass give the outcomes of whole passes (computed by hand here too);
the masks fit the budget; the scores are the surrogate of those outcomes; the prompt's own sources (``auto``) leave
its question out and take its passages whole."""

from __future__ import annotations

import numpy as np
import pytest
import tiny
import torch

import normx
from normx.core.handle import model_handle
from normx.core.inputs import Encoded
from normx.errors import InvalidInputError
from normx.methods.ablation import ablation_masks, budgeted, planning, prefix
from normx.methods.ablation.forwards import outcomes
from normx.methods.ablation.sources import auto_split, question_start
from normx.methods.calibrated import weights as stored
from normx.methods.calibrated.readings import shape
from normx.methods.response import ResponseContext
from normx.models import get_adapter
from normx.models.identity import model_identity

PROMPT = "Context: the film was good. a dull movie! the end was fine. it was long.\nQuestion: good?\nAnswer:"


@pytest.fixture(scope="module")
def llama():
    return tiny.build("LlamaForCausalLM")


def _context(model, tok, ids, prompt_length, batch=4):
    item = Encoded(text="", text_pair=None, ids=ids, tokens=[""] * len(ids), offsets=[(0, 0)] * len(ids),
                   segments=[0] * len(ids), special=[False] * len(ids))
    return ResponseContext(model_handle(model), tok, "", item, prompt_length, {}, batch)


def _by_hand(model, ids, prompt_length, sources, keep):
    """log p of the response tokens with the removed sources' ids left out, from the model's own forward."""
    removed = {i for members, on in zip(sources, keep) if not on for i in members}
    seq = [t for i, t in enumerate(ids[:prompt_length]) if i not in removed] + ids[prompt_length:]
    n = len(ids) - prompt_length
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([seq])).logits[0].double(), -1)
    return np.array([logp[len(seq) - n - 1 + t, seq[len(seq) - n + t]].item() for t in range(n)])


def test_shared_prefix_equals_whole_passes(llama):
    model, tok = llama
    torch.manual_seed(0)
    ids = torch.randint(5, 200, (40,)).tolist()
    sources = [list(range(a, a + 5)) for a in range(1, 31, 5)]  # six sources; token 0 and 31.. in none
    keeps = np.vstack([np.ones((1, 6), bool), ablation_masks(6, 12, 0.5, 3), ~np.eye(6, dtype=bool),
                       np.zeros((1, 6), bool)])
    whole = outcomes(_context(model, tok, ids, 34), sources, keeps)
    ctx = _context(model, tok, ids, 34)
    shared = outcomes(ctx, sources, keeps, shared_prefix=True)
    assert ctx.notes["shared_prefix"] is True
    np.testing.assert_allclose(shared[0], whole[0], atol=2e-5)
    np.testing.assert_allclose(shared[1], whole[1], atol=2e-5)
    for m in (0, 5, len(keeps) - 2):
        np.testing.assert_allclose(shared[0][m], _by_hand(model, ids, 34, sources, keeps[m]), atol=2e-5)


def test_every_prompt_token_after_the_cut_removed(llama):
    """A mask removing everything from its first removed source to the response: the first response token is
    predicted from the cached prefix's last token."""
    model, tok = llama
    ids = list(range(10, 40))
    sources = [list(range(5, 10)), list(range(10, 25))]
    keeps = np.array([[True, True], [True, False], [False, False]])
    ctx = _context(model, tok, ids, 25)
    shared = outcomes(ctx, sources, keeps, shared_prefix=True)[0]
    for m in range(3):
        np.testing.assert_allclose(shared[m], _by_hand(model, ids, 25, sources, keeps[m]), atol=2e-5)


def test_a_cache_it_cannot_cut_runs_whole_passes(llama, monkeypatch):
    model, tok = llama
    ids = list(range(10, 40))
    sources = [list(range(2, 10)), list(range(10, 25))]
    keeps = np.array([[True, True], [False, True], [True, False]])
    monkeypatch.setattr(prefix, "plain_layers", lambda cache: None)
    monkeypatch.setattr(prefix, "_VERDICTS", type(prefix._VERDICTS)())
    ctx = _context(model, tok, ids, 25)
    shared = outcomes(ctx, sources, keeps, shared_prefix=True)[0]
    assert ctx.notes["shared_prefix"] is False
    np.testing.assert_allclose(shared, outcomes(_context(model, tok, ids, 25), sources, keeps)[0], atol=1e-6)


def test_auto_sources_leave_the_question_out():
    text = "Context: It rained. The river rose. Boats left.\nQuestion: why did boats leave?\nAnswer:"
    assert text[question_start(text):].startswith("Question:")
    how, spans = auto_split(text)
    assert how == "sentences" and [text[a:b] for a, b in spans] == [
        "It rained.", "The river rose.", "Boats left."]  # neither the label nor the question is a source
    passages = ("Context:\n\nA first passage. It has two sentences.\n\nA second passage. Also two.\n\n"
                "A third one. Here.\n\nQuery: which passage?")
    how, spans = auto_split(passages)
    assert how == "paragraphs" and [passages[a:b] for a, b in spans] == [
        "A first passage. It has two sentences.", "A second passage. Also two.", "A third one. Here."]
    heading = "Notes:\n\nFirst part. Two sentences.\n\nSecond part. Two too.\n\nWhich part?"
    assert [heading[a:b] for a, b in auto_split(heading)[1]] == [
        "Notes:\n\nFirst part. Two sentences.", "Second part. Two too."]  # a heading line joins what follows
    assert question_start("One line only? Yes.") == len("One line only? Yes.")


def test_budgeted_scores_are_the_surrogate_of_its_masks(llama):
    model, tok = llama
    g = normx.explain_generation(model, tok, PROMPT, method="budgeted", max_new_tokens=3, budget=4)
    settings = g.settings
    spans = settings["source_spans"]
    assert len(spans) == 4 and settings["shared_prefix"] is True
    assert tok.decode(g.token_ids[spans[-1][0]:spans[-1][1]]).strip() == "it was long."  # the question is none
    assert settings["passes"] <= 4 and settings["masks"] >= 2
    sources = [list(range(a, b)) for a, b in spans]
    masks = planning.plan_masks(sources, g.prompt_length, g.steps, 4.0, 0, True, planning.Costs.of(model), 8)
    assert len(masks) == settings["masks"]
    keeps = np.vstack([np.ones((1, len(sources)), bool), masks])  # the whole pass is a mask that keeps them all
    by_hand = np.array([_by_hand(model, list(g.token_ids), g.prompt_length, sources, m).sum() for m in keeps])
    want = budgeted.surrogate(keeps, by_hand)
    got = np.array([np.nansum(g.scores[0][:, a:b]) for a, b in spans])
    np.testing.assert_allclose(got, want, atol=1e-4)
    again = normx.explain_generation(model, tok, PROMPT, method="budgeted", max_new_tokens=3, budget=4)
    np.testing.assert_array_equal(again.scores, g.scores)


def test_budgets_by_name_and_bad_budgets(llama):
    model, tok = llama
    assert budgeted.budget_value("balanced") == budgeted.BUDGETS["balanced"] and budgeted.budget_value("7") == 7.0
    for bad in (0.5, "cheap", True, float("nan")):
        with pytest.raises(InvalidInputError, match="budget"):
            normx.explain_generation(model, tok, PROMPT, method="budgeted", max_new_tokens=2, budget=bad)
    small = normx.explain_generation(model, tok, PROMPT, method="budgeted", max_new_tokens=2, budget=1)
    assert small.settings["masks"] == 2  # the fewest a surrogate fits on, whatever the budget
    more = normx.explain_generation(model, tok, PROMPT, method="budgeted", max_new_tokens=2, budget="faithful")
    assert more.settings["masks"] > normx.explain_generation(
        model, tok, PROMPT, method="budgeted", max_new_tokens=2).settings["masks"]


def test_threads_sharing_one_model_get_what_they_get_alone(llama):
    """Two budgets at once on one model (the cache check, the cached pass and the masks are each call's own)."""
    from concurrent.futures import ThreadPoolExecutor

    model, tok = llama
    alone = {b: normx.explain_generation(model, tok, PROMPT, method="budgeted", max_new_tokens=2, budget=b).scores
             for b in (3, 5)}
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda b: (b, normx.explain_generation(model, tok, PROMPT, method="budgeted",
                                                                    max_new_tokens=2, budget=b).scores),
                             [3, 5, 3, 5]))
    for budget, scores in runs:
        np.testing.assert_array_equal(np.nan_to_num(scores), np.nan_to_num(alone[budget]))


def test_a_mask_costs_what_its_pass_reads():
    """Closed form: a masked pass on a cut cache reads every key of the pass from every query (a rectangle, through
    its explicit mask); a whole pass reads the keys before each token (a triangle); both in plain passes."""
    costs = planning.Costs(body=100.0, head=40.0, attention=3.0)
    sources, prompt, steps = [list(range(0, 10)), list(range(10, 20))], 24, 2  # tokens 20-23: the question
    masks = np.array([[1, 0], [0, 1]])
    plain = costs.plain(prompt + steps)
    assert plain == (prompt + steps) * (100 + 40) + 3.0 * sum(range(1, prompt + steps + 1))
    call = prefix.CALL_ROWS * 100.0
    shared = planning.mask_costs(sources, masks, prompt, steps, True, costs)
    # [1, 0]: from token 10 on, the question's 4 and the 2 steps, each reading 10 cached keys and the pass's 6
    assert shared[0] == pytest.approx((6 * 100 + 3.0 * 6 * 16 + steps * 40 + call) / plain)
    # [0, 1]: from token 0 on, 10 + 4 + 2 tokens on no cache
    assert shared[1] == pytest.approx((16 * 100 + 3.0 * 16 * 16 + steps * 40 + call) / plain)
    whole = planning.mask_costs(sources, masks, prompt, steps, False, costs)
    assert whole[0] == pytest.approx((16 * 100 + 3.0 * sum(range(1, 17)) + steps * 40 + call) / plain)


def test_a_long_mask_costs_its_windows(monkeypatch):
    """Closed form: a masked pass longer than a window runs a window at a time, each window's queries reading the
    keys up to its end, and each window a pass of its own."""
    monkeypatch.setattr(planning, "WINDOW", 4)
    costs = planning.Costs(body=100.0, head=40.0, attention=3.0)
    sources, prompt, steps = [list(range(0, 10)), list(range(10, 20))], 24, 2
    plain = costs.plain(prompt + steps)
    shared = planning.mask_costs(sources, np.array([[0, 1], [1, 0]]), prompt, steps, True, costs)
    # [0, 1]: 16 tokens on no cache in windows of 4, 4 passes; [1, 0]: 6 tokens after 10 cached, windows of 4 and 2
    call = prefix.CALL_ROWS * 100.0
    assert shared[0] == pytest.approx((16 * 100 + 3.0 * 4 * (4 + 8 + 12 + 16) + steps * 40 + 4 * call) / plain)
    assert shared[1] == pytest.approx((6 * 100 + 3.0 * (4 * 14 + 2 * 16) + steps * 40 + 2 * call) / plain)


def test_the_shared_prior_costs_its_last_rows():
    """Closed form: on the whole pass's cache the prior runs its last rows plain, again with the bias, and a backward
    through them (twice a forward's work: 4 passes of them in all), each row reading every key whole (1 + keys /
    MATERIALIZED_KEYS the forward's per key), the head at the response's positions twice, and three calls."""
    costs = planning.Costs(body=100.0, head=40.0, attention=3.0)
    total, first, steps = 30, 20, 3
    rows, keys = 9, 29
    want = (4 * rows * 100 + 4 * 3.0 * rows * keys * (1 + keys / planning.MATERIALIZED_KEYS) + 2 * steps * 40
            + 3 * prefix.CALL_ROWS * 100) / costs.plain(total)
    assert planning.shared_prior_cost(total, first, steps, costs) == pytest.approx(want)
    assert planning.shared_prior_cost(total, first + 5, steps, costs) < want  # fewer rows, less work


def test_fit_towards_a_prior_closed_form():
    """With a prior the weights are c * prior + d: outcomes the prior explains up to its scale give it back exactly
    (d = 0), and a source no mask varied keeps c times its prior (without one it weighs 0)."""
    rng = np.random.default_rng(4)
    true = np.array([2.0, -1.0, 0.5, 3.0, 0.0])
    masks = rng.random((9, 5)) < 0.5
    masks[:, 3] = True  # source 3 is kept in every mask: the masks say nothing of it
    y = 1.5 + masks @ true
    got = budgeted.fit(masks, y, prior=true / 4)
    np.testing.assert_allclose(got, true, atol=1e-9)
    assert budgeted.fit(masks, y)[3] == 0.0
    off = true + np.array([1.0, 0.0, 0.0, 0.0, 0.0])  # a prior wrong on source 0: the masks pull it back towards 2
    pulled = budgeted.fit(masks, y, prior=off)
    assert abs(pulled[0] - 2.0) < abs(off[0] - 2.0) and pulled[3] != 0.0


def test_surrogate_is_linear_in_the_log_of_the_loss():
    """Outcomes whose negative log-likelihood each source multiplies (log NLL additive in the sources) give the
    sources' log factors back, in nats at the whole context (times its NLL), and a whole context's weight equals the
    slope of log p there; a response the model is sure of (log p = 0) does not break the log."""
    rng = np.random.default_rng(5)
    effect = np.array([0.7, -0.2, 0.0, 0.4])
    masks = np.vstack([np.ones((1, 4), bool), rng.random((11, 4)) < 0.5])
    nll = 3.0 * np.exp(-(masks @ effect))
    got = budgeted.surrogate(masks, -nll)
    np.testing.assert_allclose(got, nll[0] * effect, rtol=1e-2, atol=1e-3 * nll[0])  # (the fit's small ridge)
    assert np.isfinite(budgeted.surrogate(masks, np.where(masks[:, 0], 0.0, -1.0))).all()


def test_prior_from_calibrated_weights(llama, tmp_path, monkeypatch):
    """prior="calibrated_attention": its per-source scores are the prior, its cost comes out of the budget, the
    scores are the fit towards it on the masks the result lists; "auto" reads it only where the budget buys no mask
    after it ("fast"), and returns the prior's own scores there."""
    model, tok = llama
    monkeypatch.setenv("NORMX_CACHE", str(tmp_path / "cache"))
    blocks, heads = shape(model, get_adapter(model))
    stored.store(stored.make_record("calibrated_attention", model_identity(model), ("tokens", "presence"),
                                    {"tokens": np.full((1, 1), 0.1), "presence": np.ones((1, 1))}, (blocks, heads),
                                    0.1, "logprob", 0.5, {"contexts": 3}))
    g = normx.explain_generation(model, tok, PROMPT, method="budgeted", max_new_tokens=3, budget=8,
                                 prior="calibrated_attention")
    settings, response = g.settings, list(g.token_ids[g.prompt_length:])
    spans = settings["source_spans"]
    assert settings["prior"] == "calibrated_attention" and settings["masks"] >= 2
    assert settings["prior_shared"]  # (tokens and presence: read on the whole pass's cache)
    own = normx.explain_generation(model, tok, PROMPT, method="calibrated_attention", target=response, sources=spans)
    prior = [float(np.nansum(own.scores[0][:, a:b])) for a, b in spans]
    np.testing.assert_allclose(settings["prior_scores"], prior, rtol=1e-5, atol=1e-7)
    design = np.array(settings["design"], bool)
    sources = [list(range(a, b)) for a, b in spans]
    np.testing.assert_allclose(settings["outcomes"][-1], _by_hand(model, list(g.token_ids), g.prompt_length, sources,
                                                                  design[-1]).sum(), atol=1e-4)
    got = [float(np.nansum(g.scores[0][:, a:b])) for a, b in spans]
    np.testing.assert_allclose(got, budgeted.surrogate(design, np.array(settings["outcomes"]), np.array(prior)),
                               rtol=1e-4, atol=1e-6)
    plain = normx.explain_generation(model, tok, PROMPT, method="budgeted", target=response, budget=8)
    assert plain.settings["prior"] == "none"  # auto: 8 passes buy masks after the prior, and masks do better
    assert plain.settings["masks"] > max(settings["masks"], len(spans))  # (the prior's cost buys fewer)
    fast = normx.explain_generation(model, tok, PROMPT, method="budgeted", target=response, budget="fast")
    assert fast.settings["prior"] == "calibrated_attention"  # auto: 2 passes buy no mask after the prior
    assert fast.settings["masks"] == 0 and fast.settings["passes"] < 2
    np.testing.assert_allclose([float(np.nansum(fast.scores[0][:, a:b])) for a, b in spans], prior, rtol=1e-5,
                               atol=1e-7)
    with pytest.raises(InvalidInputError, match="prior"):
        normx.explain_generation(model, tok, PROMPT, method="budgeted", target=response, prior="attention")


def test_coarse_groups_follow_the_sources_tokens():
    sources = [list(range(5 * i, 5 * i + 5)) for i in range(7)]
    assert budgeted.coarse(sources, 7) == [[i] for i in range(7)]
    assert budgeted.coarse(sources, 3) == [[0, 1], [2, 3, 4], [5, 6]]
    uneven = [[0], list(range(1, 40)), [40], [41], [42]]
    assert budgeted.coarse(uneven, 2) == [[0, 1], [2, 3, 4]]  # the long source ends the first half
    assert all(g for g in budgeted.coarse(uneven, 5))


def test_sources_the_masks_cannot_tell_apart_are_removed_in_groups(llama):
    """No prior (no weights) and a budget that buys fewer masks than sources: adjacent sources go in groups that the
    masks tell apart, each group's weight spread over its tokens; coarse='none' keeps every source alone."""
    model, tok = llama
    given = [(1 + 4 * i, 5 + 4 * i) for i in range(12)]
    g = normx.explain_generation(model, tok, PROMPT, method="budgeted", max_new_tokens=2, budget=3, sources=given)
    settings = g.settings
    groups, spans = settings["groups"], settings["source_spans"]
    assert len(spans) == 12 and sorted(j for group in groups for j in group) == list(range(12))
    assert settings["masks"] > len(groups) and settings["prior"] == "none"
    design = np.array(settings["design"], bool)
    assert design.shape[1] == len(groups)
    merged = [[i for j in group for i in range(*spans[j])] for group in groups]
    weights = budgeted.surrogate(design, np.array(settings["outcomes"]))
    for group, weight in zip(groups, weights):
        got = sum(float(np.nansum(g.scores[0][:, a:b])) for a, b in (spans[j] for j in group))
        assert abs(got - weight) <= 1e-4 * max(1.0, abs(weight))
    by_hand = _by_hand(model, list(g.token_ids), g.prompt_length, merged, design[-1]).sum()  # a group removed whole
    assert abs(settings["outcomes"][-1] - by_hand) <= 1e-4
    alone = normx.explain_generation(model, tok, PROMPT, method="budgeted", target=list(g.token_ids[g.prompt_length:]),
                                     budget=3, coarse="none", sources=given)
    assert "groups" not in alone.settings and np.array(alone.settings["design"]).shape[1] == 12


PASSAGES = "Ox ran. Cat sat.\n\nSun set. Fog lay.\n\nIt hid. We saw.\n\nWho?"  # (the tiny model takes 64 tokens)


def test_the_finer_stage_scores_the_sentences_of_the_passages_that_weigh_most(llama):
    """finer="sentences": the passages' masks with half of the budget after the whole pass, then the sentences of
    the two passages that weigh most (positive weights) with the rest; each refined passage's tokens carry its
    sentences' surrogate weights, fitted on the sentences' masks and outcomes (computed by hand here too), shifted to
    sum to the passage's own weight, every other passage its own; the budget holds, and finer="none" is the method
    as it was."""
    model, tok = llama
    plain = normx.explain_generation(model, tok, PASSAGES, method="budgeted", max_new_tokens=3, budget=5)
    same = normx.explain_generation(model, tok, PASSAGES, method="budgeted", max_new_tokens=3, budget=5,
                                    finer="none")
    np.testing.assert_array_equal(same.scores, plain.scores)
    assert "refined" not in plain.settings and len(plain.settings["source_spans"]) == 3
    g = normx.explain_generation(model, tok, PASSAGES, method="budgeted", max_new_tokens=3, budget=5,
                                 finer="sentences")
    settings, found = g.settings, g.settings["refined"]
    assert settings["finer"] == "sentences"  # (the option, as every option is recorded)
    assert settings["passes"] <= 5 and settings["masks"] < plain.settings["masks"]  # half the passages' masks
    passages = [list(range(a, b)) for a, b in settings["source_spans"]]
    weights = budgeted.surrogate(np.array(settings["design"], bool), np.array(settings["outcomes"]))
    top = [j for j in np.argsort(-weights, kind="stable") if weights[j] > 0][:2]
    assert found["sources"] == sorted(int(j) for j in top) and found["masks"] >= 2
    units = [list(range(a, b)) for a, b in found["sentences"]]
    assert len(units) == 2 * len(top)  # two sentences in each refined passage
    assert all(any(set(u) <= set(passages[j]) for j in top) for u in units)
    masks = planning.plan_masks(
        units, g.prompt_length, g.steps, 5.0, 0, True, planning.Costs.of(model), 8,
        spent=planning.masks_cost(passages, np.array(settings["design"], bool)[1:], g.prompt_length, g.steps, True,
                                  planning.Costs.of(model), 8))
    keeps = np.vstack([np.ones((1, len(units)), bool), masks])
    assert len(masks) == found["masks"]
    by_hand = np.array([_by_hand(model, list(g.token_ids), g.prompt_length, units, m).sum() for m in keeps])
    want = budgeted.surrogate(keeps, by_hand)
    np.testing.assert_allclose(found["sentence_weights"], want, atol=1e-4)
    got = np.array([np.nansum(g.scores[0][:, u[0]:u[-1] + 1]) for u in units])
    for j in top:  # a refined passage's sentences: the fitted weights, shifted alike to sum to the passage's own
        inside = [k for k, u in enumerate(units) if set(u) <= set(passages[j])]
        shifted = want[inside] + (weights[j] - want[inside].sum()) / len(inside)
        np.testing.assert_allclose(got[inside], shifted, atol=1e-4)
        np.testing.assert_allclose(got[inside].sum(), weights[j], atol=1e-4)
    rest = [j for j in range(3) if j not in top]
    for j in rest:  # a passage not refined keeps its own weight
        np.testing.assert_allclose(np.nansum(g.scores[0][:, passages[j][0]:passages[j][-1] + 1]), weights[j],
                                   atol=1e-4)
    with pytest.raises(InvalidInputError, match="finer"):
        normx.explain_generation(model, tok, PASSAGES, method="budgeted", max_new_tokens=2, finer="words")


def test_long_rows_run_a_window_at_a_time_and_long_sequences_fewer_rows_a_pass(llama, monkeypatch):
    """The memory of a masked pass is bounded whatever the prompt's length: rows longer than a window run a window at
    a time on the cache the last one left (a mask that removes the first token too starts with no cache), and a
    long sequence gets fewer rows a pass; the outcomes are the model's own passes' still."""
    model, tok = llama
    torch.manual_seed(1)
    ids = torch.randint(5, 200, (40,)).tolist()
    sources = [list(range(0, 7))] + [list(range(a, a + 6)) for a in range(7, 31, 6)]  # token 0 in the first
    keeps = np.vstack([np.ones((1, 5), bool), ablation_masks(5, 8, 0.5, 4), ~np.eye(5, dtype=bool)])
    expected = [_by_hand(model, ids, 34, sources, keep) for keep in keeps]
    passes = []
    handle = model.model.register_forward_pre_hook(
        lambda _m, _a, kwargs: passes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    monkeypatch.setattr(prefix, "WINDOW", 4)
    monkeypatch.setattr(prefix, "PASS_TOKENS", 2 * len(ids))  # two rows a pass, of the four asked
    try:
        ctx = _context(model, tok, ids, 34, batch=4)
        assert prefix.pass_rows(ctx) == 2
        shared = outcomes(ctx, sources, keeps, shared_prefix=True)[0]
    finally:
        handle.remove()
    assert ctx.notes["shared_prefix"] is True
    np.testing.assert_allclose(shared, np.array(expected), atol=2e-5)
    masked = passes[1:]  # after the whole pass (and the cut cache's check, two rows)
    assert masked and all(rows <= 2 and width <= 4 for rows, width in masked)
    assert len(masked) > len(keeps)  # rows of up to 37 tokens, four at a time


def test_whole_passes_of_a_long_sequence_go_one_at_a_time(llama, monkeypatch):
    """Where masks run whole (a cache it cannot cut), a padded batch makes the model build a causal mask [rows,
    tokens, tokens]: past WINDOW x PASS_TOKENS entries the sequences go one a pass (unpadded: no mask), outcomes
    unchanged."""
    model, tok = llama
    ids = list(range(10, 40))
    sources = [list(range(2, 10)), list(range(10, 25))]
    keeps = np.array([[True, True], [False, True], [True, False], [False, False]])
    expected = np.array([_by_hand(model, ids, 25, sources, keep) for keep in keeps])
    monkeypatch.setattr(prefix, "plain_layers", lambda cache: None)
    monkeypatch.setattr(prefix, "_VERDICTS", type(prefix._VERDICTS)())
    monkeypatch.setattr(prefix, "WINDOW", 4)
    monkeypatch.setattr(prefix, "PASS_TOKENS", 4 * len(ids))
    ctx = _context(model, tok, ids, 25, batch=4)
    assert (prefix.pass_rows(ctx), prefix.whole_rows(ctx)) == (4, 1)
    passes = []
    handle = model.model.register_forward_pre_hook(
        lambda _m, _a, kwargs: passes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        shared = outcomes(ctx, sources, keeps, shared_prefix=True)[0]
    finally:
        handle.remove()
    assert ctx.notes["shared_prefix"] is False
    np.testing.assert_allclose(shared, expected, atol=2e-5)
    assert passes[1:] and all(rows == 1 for rows, _ in passes[1:])  # (after the whole pass)
