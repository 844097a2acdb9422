"""Re-read masks packed on the whole pass's own cache (normx.methods.ablation.rereads): equal to the decoder's
re-reads on a cache of their own with the positions kept (normx.methods.decoder.rereads, ``close_up=False``), per
rotary family, in float64, whatever the masks a pass packs; the keep-everything mask is the model's own pass; a
source inside the re-read rows is hidden from the rows after it; threads sharing a model get their own outcomes."""

from __future__ import annotations

import numpy as np
import pytest
import tiny
from threads import in_threads

import normx
from normx._torch import torch
from normx.core.handle import model_handle
from normx.core.inputs import Encoded
from normx.errors import InvalidInputError
from normx.methods.ablation import ablation_masks, designs, planning, rereads, surrogate_fit
from normx.methods.ablation.planning import Costs
from normx.methods.ablation.prefix import CALL_ROWS, Prefix
from normx.methods.decoder.rereads import masked_rereads
from normx.methods.response import ResponseContext

SOURCES = [list(range(a, a + 5)) for a in range(1, 31, 5)]  # six sources; token 0 and 31.. in none
PROMPT = 36


def _sequence():
    torch.manual_seed(0)
    return torch.randint(5, 200, (40,)).tolist()


def _context(model, tok, ids, prompt_length):
    item = Encoded(text="", text_pair=None, ids=ids, tokens=[""] * len(ids), offsets=[(0, 0)] * len(ids),
                   segments=[0] * len(ids), special=[False] * len(ids))
    return ResponseContext(model_handle(model), tok, "", item, prompt_length, {}, 4)


def _keeps():
    return np.vstack([np.ones((1, 6), bool), ablation_masks(6, 10, 0.5, 3), ~np.eye(6, dtype=bool)])


@pytest.mark.parametrize("case", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"])
@pytest.mark.parametrize("packed", [1, 3, 64])
def test_packed_rereads_equal_rereads_on_their_own_cache(case, packed, monkeypatch):
    model, tok = tiny.build(case, fresh=True)
    model = model.double()
    ids = _sequence()
    keeps = _keeps()
    first = rereads.first_row(SOURCES, PROMPT)
    assert first == 31
    monkeypatch.setattr(rereads, "masks_per_pass", lambda total, first, costs: packed)
    found = rereads.reread_log_p(Prefix(_context(model, tok, ids, PROMPT)), SOURCES, keeps, first)
    own, _ = masked_rereads(model_handle(model), ids, PROMPT, SOURCES, keeps, "test", first, 4, close_up=False)
    np.testing.assert_allclose(found, own, rtol=1e-6, atol=2e-6)  # (the head reads float32)
    with torch.no_grad():  # the keep-everything mask: the model's own pass
        plain = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, PROMPT - 1:-1].double(), -1)
    np.testing.assert_allclose(found[0], plain.gather(1, torch.tensor(ids[PROMPT:])[:, None])[:, 0].numpy(),
                               rtol=1e-6, atol=2e-6)  # (the head reads float32)
    assert not np.allclose(found[1], found[0])  # (a removal moved something)


def test_a_source_among_the_reread_rows_is_hidden_from_the_rows_after_it():
    model, tok = tiny.build("LlamaForCausalLM", fresh=True)
    model = model.double()
    ids = _sequence()
    sources = [*SOURCES, [33, 34]]  # (the last source inside the prompt's last rows: re-read from 31 on)
    keeps = np.vstack([np.ones((1, 7), bool), ablation_masks(7, 8, 0.5, 5)])
    found = rereads.reread_log_p(Prefix(_context(model, tok, ids, PROMPT)), sources, keeps, 31)
    own, _ = masked_rereads(model_handle(model), ids, PROMPT, sources, keeps, "test", 31, 4, close_up=False)
    np.testing.assert_allclose(found, own, rtol=1e-6, atol=2e-6)  # (the head reads float32)
    assert rereads.first_row(sources, PROMPT) == PROMPT - 1  # (at most the prompt's last row)


def test_a_first_row_outside_the_prompt_is_refused():
    model, tok = tiny.build("LlamaForCausalLM")
    ids = _sequence()
    prefix = Prefix(_context(model, tok, ids, PROMPT))
    for bad in (0, PROMPT):
        with pytest.raises(InvalidInputError, match="re-reads start"):
            rereads.reread_log_p(prefix, SOURCES, _keeps(), bad)


def test_threads_sharing_one_model_get_what_they_get_alone():
    model, tok = tiny.build("LlamaForCausalLM")
    ids = _sequence()
    keeps = _keeps()

    def read(k):
        return rereads.reread_log_p(Prefix(_context(model, tok, ids, PROMPT)), SOURCES, np.roll(keeps, k, 1), 31)

    alone = [read(k) for k in range(4)]
    found = in_threads(read, 4)
    for k in range(4):
        np.testing.assert_allclose(found[k], alone[k], rtol=1e-5, atol=1e-5)


BUDGET_PROMPT = ("Context: the film was good. a dull movie! the end was fine. it was long.\nQuestion: good?\nAnswer:")


def test_budgeted_reads_rereads_beside_its_masks_where_they_cost_about_a_mask(monkeypatch):
    """Forced on the tiny model (re-reads priced as on a long prompt, a 500th of a pass each: on its short prompt
    they cost several real masks): the real masks that pay for the re-reads are left out, the scores are the
    covariate fit of the recorded real and re-read outcomes, the re-reads are those run on their own, and every
    source is scored even where the masks remove groups; the call costs no more than without them."""
    model, tok = tiny.build("LlamaForCausalLM")
    given = [(1 + 4 * i, 5 + 4 * i) for i in range(12)]
    call = {"method": "budgeted", "max_new_tokens": 2, "budget": 3, "sources": given}
    plain = normx.explain_generation(model, tok, BUDGET_PROMPT, **call)
    assert "rereading" not in plain.settings  # (not the default)
    monkeypatch.setattr(rereads, "cost", lambda total, first, steps, count, costs: 0.002 * count)
    g = normx.explain_generation(model, tok, BUDGET_PROMPT, rereads="auto", **call)
    settings, found = g.settings, g.settings["rereading"]
    assert settings["groups"] == plain.settings["groups"]  # (the masks remove groups of the sources)
    assert settings["masks"] < plain.settings["masks"] and settings["passes"] <= plain.settings["passes"] + 1e-3
    design = np.array(settings["design"], bool)
    assert (design[:, 1:] == np.array(plain.settings["design"], bool)[:len(design), 1:]).all()  # (the plan's first)
    sources = [list(range(a, b)) for a, b in given]
    column = [k for k, group in enumerate(settings["groups"]) for _ in group]
    extra = np.array(found["extra"], bool)
    assert extra.shape == (rereads.EXTRA, 12) and found["masks"] == len(design) - 1 + rereads.EXTRA
    ctx = _context(model, tok, list(g.token_ids), g.prompt_length)
    again = rereads.reread_log_p(Prefix(ctx), sources, np.vstack([design[1:, column], extra]), found["first_row"])
    np.testing.assert_allclose(again.sum(1), found["outcomes"], rtol=1e-5, atol=1e-5)
    sizes = np.array([b - a for a, b in given], np.float64)
    spread = np.zeros((12, len(settings["groups"])))
    for k, group in enumerate(settings["groups"]):
        spread[group, k] = sizes[group] / sizes[group].sum()
    want = surrogate_fit.with_rereads(design, np.array(settings["outcomes"]), design[:, column],
                                  np.array(found["outcomes"]), extra, spread)
    got = np.array([np.nansum(g.scores[0][:, a:b]) for a, b in given])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert len(set(np.round(got, 9))) > len(settings["groups"])  # (sources within a group told apart)
    off = normx.explain_generation(model, tok, BUDGET_PROMPT, **call)
    assert "rereading" not in off.settings and off.settings["masks"] == plain.settings["masks"]


def test_rereads_are_bought_on_long_prompts_only():
    """At the model's work per token (a 135M model's shape), a 20-token question after the sources: on a ~300- or
    ~2,000-token prompt the re-reads cost more than :data:`~normx.methods.ablation.rereads.WORTH` real masks and are
    not bought; on a ~7,000-token one they are, paid for by real masks left out."""
    costs = Costs(body=2 * 1.0e8, head=2 * 2.8e7, attention=4.0 * 576 * 30)

    def plan(length: int, sources: int = 10):
        size = (length - 20) // sources
        spans = [list(range(1 + k * size, 1 + (k + 1) * size)) for k in range(sources)]
        masks = designs.masks(sources, 14, 0, "fold_over")
        return rereads.bought(spans, spans, masks, length, 8, 0, costs, 8), spans, masks

    assert plan(300)[0] is None and plan(2000)[0] is None
    found, spans, masks = plan(7000)
    assert found is not None and 10 <= found.real < len(masks) and found.extra.shape == (rereads.EXTRA, 10)
    assert found.first == spans[-1][-1] + 1
    spend = planning.masks_cost(spans, masks[:found.real], 7000, 8, True, costs, 8) + found.cost
    assert spend <= planning.masks_cost(spans, masks, 7000, 8, True, costs, 8)


def test_reread_cost_counts_rows_keys_calls_and_the_head():
    costs = Costs(body=100.0, head=3.0, attention=0.5)
    total, first, steps = 100, 80, 4
    width = total - 1 - first  # (19 rows a mask)
    assert rereads.masks_per_pass(total, first, costs) == 5  # (sqrt(64 x 100 / 0.5) = 113 rows a pass)

    def packed(masks):  # (one pass: its rows, each reading the cache and the pass's rows, its call, the head)
        rows = masks * width
        return rows * 100.0 + 0.5 * rows * (first + rows) + CALL_ROWS * 100.0 + masks * steps * 3.0

    for count, passes in ((1, [1]), (2, [2]), (5, [5]), (7, [5, 2])):
        want = sum(packed(m) for m in passes) / costs.plain(total)
        assert rereads.cost(total, first, steps, count, costs) == pytest.approx(want)


def test_the_covariate_fit_is_the_rereads_surrogate_where_the_real_masks_read_alike():
    """Real outcomes equal to the re-reads': the corrections vanish, and the weights are the re-reads' surrogate in
    nats; real outcomes off the re-reads by a source's effect: the correction finds that source."""
    rng = np.random.default_rng(0)
    on_sources = np.vstack([np.ones((1, 6), bool), rng.random((12, 6)) < 0.5])
    extra = rng.random((40, 6)) < 0.5
    effect = np.array([0.9, 0.1, 0.5, 0.0, 0.3, 0.2])
    every = np.vstack([on_sources, extra])
    loss = np.exp(-(every @ effect) + 0.4)
    log_p = -loss
    spread = np.eye(6)
    found = surrogate_fit.with_rereads(on_sources, log_p[:13], on_sources, log_p[1:], extra, spread)
    want = loss[0] * surrogate_fit.fit(every, -np.log(loss))
    np.testing.assert_allclose(found, want, rtol=1e-9, atol=1e-12)
    off = log_p[:13] * np.exp(0.8 * ~on_sources[:, 3])  # (the real masks say source 3 matters, the re-reads not)
    moved = surrogate_fit.with_rereads(on_sources, off, on_sources, log_p[1:], extra, spread)
    assert np.argmax(moved - found) == 3
