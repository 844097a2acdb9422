"""explain_generation's per-step computations: every step of a gradient method (and AttnLRP) from ONE forward pass
over the whole sequence equals the per-prefix recipe (one forward and backward pass on each step's prefix) to float
rounding, however the steps and interpolation points are batched; the baselines that read no model run no forward
pass at all."""

from __future__ import annotations

import numpy as np
import pytest
import tiny

import normx
from normx.explanations import generation_steps
from normx.explanations.generation import _causal_plan, _encoded
from normx.methods import step_gradients

TARGET = " was a gripping story and the cast"
CASES = ["LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen2ForCausalLM"]
METHODS = [("gradient_norm", {}), ("gradient_x_input", {}), ("gradient_x_input", {"aggregation": "sum"}),
           ("integrated_gradients", {"n_steps": 6}),
           ("integrated_gradients", {"n_steps": 5, "rule": "riemann_trapezoid", "baselines": "pad"}),
           ("attnlrp", {})]


def both_ways(case: str, method: str, options: dict, prompts=("the film", "a dull movie with")):
    """(one forward pass per sequence, one pass per prefix): each the five lists explain_generation builds from."""
    model, tok = tiny.build(case)
    plan = _causal_plan(model, tok, method, None, dict(options), "test")
    target = tok(TARGET, add_special_tokens=False)["input_ids"]
    items = [_encoded(tok, tok(p)["input_ids"] + target) for p in prompts]
    lengths = [len(tok(p)["input_ids"]) for p in prompts]
    one = generation_steps.from_one_pass(plan, tok, list(prompts), items, lengths, 8)
    each = generation_steps.per_prefix(plan, tok, items, lengths, 3)
    return one, each


def assert_same(one, each, rtol=1e-5):
    (s1, p1, q1, a1, d1), (s2, p2, q2, a2, d2) = one, each
    for x, y in zip(s1, s2):
        assert x.shape == y.shape and np.array_equal(np.isnan(x), np.isnan(y))
        scale = np.nanmax(np.abs(y))
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * scale, equal_nan=True)
    for x, y in zip(p1, p2):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
    assert q1 == q2
    for x, y in zip(a1, a2):
        assert [list(step) for step in x] == [list(step) for step in y]  # the same top tokens, in order
    for x, y in zip(d1, d2):
        assert set(x) == set(y)
        for name in x:
            np.testing.assert_allclose(x[name], y[name], rtol=1e-4, atol=1e-5 * max(1.0, np.abs(y[name]).max()))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("method,options", METHODS, ids=lambda v: v if isinstance(v, str) else
                         ",".join(f"{k}={x}" for k, x in v.items()) or "default")
def test_one_forward_pass_gives_every_prefix_own_pass(case, method, options):
    assert_same(*both_ways(case, method, options))


def test_batches_of_steps_and_points_change_nothing(monkeypatch):
    """One step per backward pass and one interpolation point per forward pass (a budget of nothing) give what the
    default batches give; so does Integrated Gradients' internal_batch_size."""
    wide = {name: both_ways("LlamaForCausalLM", name, options)[0]
            for name, options in [("gradient_x_input", {}), ("integrated_gradients", {"n_steps": 6})]}
    narrow_ig = both_ways("LlamaForCausalLM", "integrated_gradients", {"n_steps": 6, "internal_batch_size": 4})[0]
    assert_same(narrow_ig, wide["integrated_gradients"])
    monkeypatch.setattr(step_gradients, "STEP_BUDGET_MIB", 0)
    model, _ = tiny.build("LlamaForCausalLM")
    assert step_gradients.steps_per_backward(model, 10, 7) == 1 and step_gradients.rows_per_forward(model, 10) == 1
    for name, options in [("gradient_x_input", {}), ("integrated_gradients", {"n_steps": 6})]:
        assert_same(both_ways("LlamaForCausalLM", name, options)[0], wide[name])


def test_the_memory_rule_as_documented():
    """Steps per backward pass: STEP_BUDGET_MIB over BACKWARD_FACTOR x tokens x (hidden + intermediate) x the
    dtype's bytes, clipped to 1 .. steps; points per forward pass: over ACTIVATION_FACTOR x tokens x layers x
    (hidden + intermediate) x bytes, at least 1."""
    model, _ = tiny.build("LlamaForCausalLM")
    config = model.config
    each = config.num_hidden_layers * (config.hidden_size + config.intermediate_size) * 4
    budget = step_gradients.STEP_BUDGET_MIB * 2**20
    tokens = 4096
    assert step_gradients.steps_per_backward(model, tokens, 10**6) == budget // (
        step_gradients.BACKWARD_FACTOR * tokens * each // config.num_hidden_layers)
    assert step_gradients.steps_per_backward(model, tokens, 3) == 3
    points = budget // (step_gradients.ACTIVATION_FACTOR * tokens * each)
    assert points > 1 and step_gradients.rows_per_forward(model, tokens) == points
    assert step_gradients.rows_per_forward(model, 10**9) == 1


@pytest.mark.parametrize("method", ["random", "random_types", "recency", "recency_first"])
def test_baselines_that_read_no_model_run_no_forward_pass(method):
    model, tok = tiny.build("LlamaForCausalLM", fresh=True)
    normx.explain_generation(model, tok, "a", method=method, target=" b")  # the model's first-use checks run here
    calls = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        g = normx.explain_generation(model, tok, "the film", method=method, target=TARGET)
    finally:
        hook.remove()
    assert calls == [] and g.steps == len(tok(TARGET, add_special_tokens=False)["input_ids"])
    assert np.isnan(g.probabilities).all() and g.predictions == [-1] * g.steps
    for t, p in enumerate(g.generated):
        assert np.isfinite(g.rows()[t]).all() and len(g.rows()[t]) == p
    if method == "recency":
        assert list(g.rows()[-1]) == list(range(g.generated[-1]))
