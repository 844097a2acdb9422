"""The two-level designs behind the budgeted method: Hadamard matrices, the resolution III (screening) and IV
(fold-over) designs made from them, and the order a budget takes their masks in."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from normx.errors import InvalidInputError
from normx.methods.ablation import designs


@pytest.mark.parametrize("order", [1, 2, 4, 8, 12, 16, 20, 24, 32, 40, 44, 48, 96])
def test_hadamard_rows_are_orthogonal(order):
    matrix = designs.hadamard(order).astype(np.int64)
    assert set(np.unique(matrix)) <= {-1, 1}
    np.testing.assert_array_equal(matrix @ matrix.T, order * np.eye(order, dtype=np.int64))


def test_orders_without_a_construction_here():
    assert designs.hadamard(28) is None and designs.hadamard(6) is None
    assert designs.design_order(25) == 32 and designs.design_order(8) == 8 and designs.design_order(9) == 12


def _coded(masks):
    return np.where(masks, 1, -1).astype(np.int64)


@pytest.mark.parametrize("sources", [1, 2, 3, 5, 7, 8, 9, 11, 13, 20])
def test_fold_over_is_resolution_iv(sources):
    x = _coded(designs.fold_over(sources, seed=3))
    assert len(x) == 2 * designs.design_order(sources)
    np.testing.assert_array_equal(x.T @ x, len(x) * np.eye(sources, dtype=np.int64))  # main effects orthogonal
    for i, j in itertools.combinations(range(sources), 2):  # and clear of every pair's interaction
        assert not (x.T @ (x[:, i] * x[:, j])).any()
    np.testing.assert_array_equal(x[0::2], -x[1::2])  # fold-over pairs


@pytest.mark.parametrize("sources", [1, 3, 7, 8, 11, 15])
def test_screening_is_resolution_iii(sources):
    x = _coded(designs.screening(sources, seed=0))
    assert len(x) == designs.design_order(sources + 1)
    np.testing.assert_array_equal(x.T @ x, len(x) * np.eye(sources, dtype=np.int64))
    assert not x.sum(0).any()  # each source kept in half the masks


def test_masks_in_budget_order():
    screening = designs.screening(8, seed=5)
    got = designs.masks(8, 30, seed=5)
    np.testing.assert_array_equal(got[:12], screening)
    np.testing.assert_array_equal(got[12:24], ~screening)  # then its complements: a fold-over
    np.testing.assert_array_equal(got[24:], designs.screening(8, seed=6)[:6])
    folds = designs.masks(8, 20, seed=5, kind="fold_over")
    np.testing.assert_array_equal(folds[:16], designs.fold_over(8, seed=5))
    np.testing.assert_array_equal(designs.masks(8, 7, seed=5), got[:7])  # a shorter budget: the same first masks
    assert not np.array_equal(designs.fold_over(8, 1), designs.fold_over(8, 2))  # seeds give other designs
    with pytest.raises(InvalidInputError, match="kind"):
        designs.masks(8, 4, 0, kind="random")


def test_a_design_recovers_main_effects_exactly():
    """An outcome that is linear in the sources plus pairwise interactions: the fold-over's least-squares weights
    are the main effects, untouched by the interactions (what ContextCite's random masks cannot promise)."""
    rng = np.random.default_rng(0)
    sources = 7
    main, pairs = rng.normal(size=sources), rng.normal(size=(sources, sources))
    masks = designs.fold_over(sources, seed=0)
    x = _coded(masks).astype(float)
    y = x @ main + np.einsum("mi,ij,mj->m", x, np.triu(pairs, 1), x)
    fitted = np.linalg.lstsq(np.c_[np.ones(len(x)), x], y, rcond=None)[0][1:]
    np.testing.assert_allclose(fitted, main, atol=1e-10)
