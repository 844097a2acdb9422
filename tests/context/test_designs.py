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


def _informative(rows: np.ndarray) -> np.ndarray:
    """The rows in order without the one keeping every source and without repeats."""
    seen, out = set(), []
    for row in rows:
        if not row.all() and row.tobytes() not in seen:
            seen.add(row.tobytes())
            out.append(row)
    return np.array(out)


def test_masks_in_budget_order():
    screening = designs.screening(8, seed=5)
    got = designs.masks(8, 30, seed=5)
    want = _informative(np.vstack([screening, ~screening, designs.screening(8, seed=6)]))  # then its complements
    np.testing.assert_array_equal(got, want[:30])
    assert len(want) >= 30 and len(want) < 36  # (this seed's designs: some mask given twice, or keeping all)
    folds = designs.masks(8, 20, seed=5, kind="fold_over")
    np.testing.assert_array_equal(folds, _informative(np.vstack([designs.fold_over(8, seed=5),
                                                                   designs.fold_over(8, seed=6)]))[:20])
    np.testing.assert_array_equal(designs.masks(8, 7, seed=5), got[:7])  # a shorter budget: the same first masks
    assert not np.array_equal(designs.fold_over(8, 1), designs.fold_over(8, 2))  # seeds give other designs
    with pytest.raises(InvalidInputError, match="kind"):
        designs.masks(8, 4, 0, kind="random")


@pytest.mark.parametrize("sources", [1, 2, 3, 4, 5, 11, 12, 13])
@pytest.mark.parametrize("kind", designs.KINDS)
def test_every_mask_once_and_never_the_whole(sources, kind):
    """The model's outcomes are deterministic: a mask run twice tells nothing new, and the mask keeping every
    source is the whole pass. A budget past the masks there are (2 ** sources - 1) gets each of them once, the
    designs' first, and a shorter one a prefix of them."""
    asked = 5000
    got = designs.masks(sources, asked, seed=3, kind=kind)
    there = min(2 ** sources - 1, designs.LARGEST)
    assert got.shape == (min(asked, there), sources) == (designs.distinct(sources), sources)
    assert len({row.tobytes() for row in got}) == len(got) and not got.all(1).any()
    np.testing.assert_array_equal(designs.masks(sources, 9, seed=3, kind=kind), got[:9])
    first = designs.fold_over(sources, 3) if kind == "fold_over" else designs.screening(sources, 3)
    head = _informative(first)
    np.testing.assert_array_equal(got[:len(head)], head)


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
