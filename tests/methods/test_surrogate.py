"""The ``reread`` family's surrogate (normx.methods.calibrated.surrogate): balanced masks keep each source in half of
them and are reproducible; the ridge estimate recovers a linear model's effects exactly where the design determines
them (closed form), shrinks toward zero as lambda grows, and refuses shapes that do not match; the family runs
inside calibrated_attention's per-source readings on a tiny Llama and its outcomes are the re-read ablations'."""

from __future__ import annotations

import numpy as np
import pytest
import tiny

from normx.core.handle import model_handle
from normx.errors import InvalidInputError
from normx.methods.calibrated import readings
from normx.methods.calibrated.surrogate import balanced_masks, ridge_effects
from normx.methods.decoder.rereads import masked_rereads


@pytest.mark.parametrize(("sources", "count"), [(3, 8), (7, 8), (11, 8), (5, 7)])
def test_balanced_masks_keep_each_source_in_half_of_them(sources, count):
    masks = balanced_masks(sources, count)
    assert masks.shape == (1 + count, sources) and masks[0].all()
    kept = masks[1:].sum(0)
    assert set(kept.tolist()) <= {count // 2, count // 2 + count % 2}
    np.testing.assert_array_equal(masks, balanced_masks(sources, count))  # reproducible
    if sources > 3:
        assert not np.array_equal(masks, balanced_masks(sources, count, seed=1))


def test_the_search_finds_less_correlated_columns_than_random_balanced_draws():
    def off_diagonal(design):
        signed = design * 2.0 - 1.0
        gram = signed.T @ signed
        return float((gram ** 2).sum() - (np.diag(gram) ** 2).sum())

    rng = np.random.default_rng(5)
    draws = []
    for _ in range(200):
        design = np.zeros((8, 9), bool)
        for j in range(9):
            design[rng.permutation(8)[:4], j] = True
        draws.append(off_diagonal(design))
    assert off_diagonal(balanced_masks(9, 8)[1:]) <= np.percentile(draws, 5)


def test_ridge_effects_recover_a_linear_model_and_shrink():
    rng = np.random.default_rng(0)
    masks = balanced_masks(5, 8)
    beta = rng.normal(size=(5, 3))
    log_p = -2.0 + masks.astype(float) @ beta  # [M, steps]: intercept -2, effects beta
    np.testing.assert_allclose(ridge_effects(masks, log_p, lam=1e-9), beta, atol=1e-6)
    small, large = ridge_effects(masks, log_p, lam=1.0), ridge_effects(masks, log_p, lam=100.0)
    assert np.abs(large).sum() < np.abs(small).sum() < np.abs(beta).sum()
    with pytest.raises(InvalidInputError, match="masks \\[M, sources\\] and outcomes \\[M, steps\\]"):
        ridge_effects(masks, log_p[:3], lam=1.0)
    with pytest.raises(InvalidInputError, match="at least one source and two masks"):
        balanced_masks(0, 8)


def test_the_reread_family_is_the_surrogate_of_the_re_read_ablations():
    model, tok = tiny.build("LlamaForCausalLM")
    ids = [*tok("the film was good. a dull plot! it was long and the end was sad")["input_ids"], 17, 23, 5]
    length = len(ids) - 3
    sources = [[1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
    handle = model_handle(model)
    values, logits = readings.source_readings(handle, ids, length, sources, ["reread"], "test")
    masks = balanced_masks(3, readings.REREAD_MASKS)
    first_row = readings.reread_first_row(len(ids), length, sources)
    assert 4 <= first_row <= length - 1
    log_p, want_logits = masked_rereads(handle, ids, length, sources, masks, "test", first_row)
    np.testing.assert_allclose(readings.by_source(values["reread"], sources), ridge_effects(masks, log_p), rtol=1e-6,
                               atol=1e-9)
    assert values["reread"].shape == (3, len(ids)) and logits.shape == want_logits.shape
    assert not values["reread"][:, [0, 11, 12]].any()  # tokens in no source
