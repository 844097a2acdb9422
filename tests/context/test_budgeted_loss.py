"""``budgeted``'s surrogate fitted with Huber's loss (the default) or least squares: (nearly) the same weights where the
outcomes are linear in the masks, and where a few masks lie far off a linear surrogate, weights nearer the linear
effects of all the others; the ``loss`` option checked."""

from __future__ import annotations

import numpy as np
import pytest
import tiny

import normx
from normx.errors import InvalidInputError
from normx.methods.ablation import budgeted, designs

PROMPT = "Context: the film was good. a dull movie! the end was fine. it was long.\nQuestion: good?\nAnswer:"


def _design() -> np.ndarray:
    return designs.masks(8, 16, 0, kind="fold_over").astype(bool)


def test_linear_outcomes_give_the_same_weights_either_way():
    masks = _design()
    effect = np.array([0.9, -0.3, 0.0, 0.5, 0.2, -0.7, 0.1, 0.4])
    y = -2.0 + masks @ effect
    squares = budgeted.fit(masks, y, loss="squares")
    huber = budgeted.fit(masks, y, loss="huber")
    np.testing.assert_allclose(huber, squares, atol=2e-3)  # (the ridge's small residuals reweight a little)
    np.testing.assert_allclose(huber, effect, atol=1e-2)  # (the fit's small ridge)
    exact = budgeted.fit(masks, y, loss="huber", strength=0.0, prior=effect)  # no residual at all: least squares
    np.testing.assert_allclose(exact, budgeted.fit(masks, y, loss="squares", strength=0.0, prior=effect), atol=1e-12)


def test_the_ridge_is_its_closed_form_on_the_centred_masks():
    rng = np.random.default_rng(3)
    masks = _design()
    y = masks @ rng.normal(0, 0.5, 8) + rng.normal(0, 0.1, len(masks))
    x, centred = masks - masks.mean(0), y - y.mean()
    for ridge in (0.01, 1.0, 10.0):
        closed = np.linalg.solve(x.T @ x + ridge * np.eye(8), x.T @ centred)
        np.testing.assert_allclose(budgeted.fit(masks, y, loss="squares", ridge=ridge), closed, atol=1e-12)
    np.testing.assert_array_equal(budgeted.fit(masks, y), budgeted.fit(masks, y, ridge=budgeted.RIDGE))
    shrunk = np.abs(budgeted.surrogate(masks, -np.exp(-y), ridge=10.0)).sum()
    assert shrunk < np.abs(budgeted.surrogate(masks, -np.exp(-y))).sum()  # (a stronger ridge: smaller weights)


def test_a_mask_far_off_the_linear_surrogate_tilts_least_squares_not_huber():
    rng = np.random.default_rng(7)
    masks = _design()
    effect = np.array([0.9, -0.3, 0.0, 0.5, 0.2, -0.7, 0.1, 0.4])
    y = masks @ effect + rng.normal(0, 0.02, len(masks))
    y[3] += 4.0  # one removal that changes the answer: far off what the sources add
    squares = budgeted.fit(masks, y, loss="squares")
    huber = budgeted.fit(masks, y, loss="huber")
    assert np.abs(huber - effect).max() < 0.1 < np.abs(squares - effect).max()
    with_prior = budgeted.fit(masks, y, prior=effect * 2, loss="huber")  # (the prior's fit reweighted alike)
    np.testing.assert_allclose(with_prior, effect, atol=0.1)


def test_the_loss_option():
    model, tokenizer = tiny.build("LlamaForCausalLM")
    squares = normx.explain_generation(model, tokenizer, PROMPT, method="budgeted", max_new_tokens=2, budget=4,
                                       loss="squares")
    huber = normx.explain_generation(model, tokenizer, PROMPT, method="budgeted", max_new_tokens=2, budget=4)
    assert huber.settings["loss"] == "huber" and squares.settings["loss"] == "squares"
    design, found = np.array(huber.settings["design"], bool), np.array(huber.settings["outcomes"])
    spans = huber.settings["source_spans"]
    for result, loss in ((huber, "huber"), (squares, "squares")):
        got = np.array([np.nansum(result.scores[0][:, a:b]) for a, b in spans])
        np.testing.assert_allclose(got, budgeted.surrogate(design, found, loss=loss), atol=1e-4)
    with pytest.raises(InvalidInputError, match="loss"):
        normx.explain_generation(model, tokenizer, PROMPT, method="budgeted", max_new_tokens=2, loss="absolute")
