"""The pieces under context attribution that need no model: the offline splitter (sentences, abbreviations,
paragraphs, lines, words, offsets), token spans by character overlap, and the LASSO against known solutions."""

from __future__ import annotations

import numpy as np
import pytest

from normx.errors import InvalidInputError
from normx.methods.ablation import ablation_masks, response_logit_probability
from normx.methods.ablation.lasso import lasso, surrogate
from normx.methods.ablation.sources import check_spans, split_text, token_sources


def pieces(text, how):
    return [text[a:b] for a, b in split_text(text, how)]


def test_sentences_keep_abbreviations_and_offsets():
    text = "Dr. Smith met Mr. Jones at 5 p.m. on Monday.  They spoke, e.g. about the U.S. budget. Then?\nNew line"
    assert pieces(text, "sentences") == ["Dr. Smith met Mr. Jones at 5 p.m. on Monday.",
                                         "They spoke, e.g. about the U.S. budget.", "Then?", "New line"]
    for a, b in split_text(text, "sentences"):
        assert text[a:b] == text[a:b].strip() and b > a


def test_sentences_without_their_marks_are_cut_where_the_next_begins():
    """Where Punkt sees no end (transcribed speech without full stops, a title, a full stop it took for an
    abbreviation's, a full stop before a lower-case word), a sentence opener after a lower-case word, or a full stop
    after a number or a long word, ends it; a name or title that begins with an opener does not."""
    speech = "and uh my memories of summer have always been that stifling humidity The draft treaty was his bait."
    assert pieces(speech, "sentences") == ["and uh my memories of summer have always been that stifling humidity",
                                           "The draft treaty was his bait."]
    assert pieces("It will be made by Tiffany & Co. There are 278 patents.", "sentences") == [
        "It will be made by Tiffany & Co.", "There are 278 patents."]
    assert pieces("It met in March 1998. and uh my daughter gets irate", "sentences") == [
        "It met in March 1998.", "and uh my daughter gets irate"]
    for whole in ("He watched Doctor Who and the show called The Master of Time.", "It runs on Xbox One and PC.",
                  "A profile crowns Chris Rock The Funniest Man in America.", "They spoke, e.g. about it at 5 p.m. on "
                  "Monday, approx. three hours."):
        assert pieces(whole, "sentences") == [whole]


def test_paragraphs_lines_and_words():
    text = "First para, line one.\nline two.\n \n\nSecond para.\n\n\n"
    assert pieces(text, "paragraphs") == ["First para, line one.\nline two.", "Second para."]
    assert pieces(text, "lines") == ["First para, line one.", "line two.", "Second para."]
    assert pieces("a  b,c\td", "words") == ["a", "b,c", "d"]
    assert split_text("   \n\n ", "sentences") == []
    with pytest.raises(InvalidInputError, match="sources='bad'"):
        split_text("x", "bad")


def test_a_line_break_ends_a_sentence_as_in_contextcite():
    assert pieces("no period here\nnext one.", "sentences") == ["no period here", "next one."]


def test_tokens_go_to_the_source_they_overlap_most():
    text = "One two. Three."
    spans = split_text(text, "sentences")  # [(0, 8), (9, 15)]
    offsets = [(0, 0), (0, 3), (3, 7), (7, 8), (8, 14), (14, 15), (15, 15)]
    special = [True, False, False, False, False, False, True]
    assert token_sources(spans, offsets, special) == [[1, 2, 3], [4, 5]]  # " Three" (8..14) is mostly sentence 2
    assert token_sources(spans, offsets, special, count=3) == [[1, 2], []]


def test_given_spans_are_checked():
    assert check_spans([(0, 2), (3, 5)]) == [[0, 2], [3, 5]]
    for bad in ([(2, 2)], [(0, 3), (2, 4)], [], "x", [(0, 1.5)], [(True, 2)]):
        with pytest.raises(InvalidInputError):
            check_spans(bad)


def test_lasso_on_an_orthogonal_design_is_soft_thresholding():
    """With centred, orthogonal columns of mean square 1, the LASSO's weights are the least-squares weights
    soft-thresholded by alpha (the closed form)."""
    rng = np.random.default_rng(0)
    # orthogonal to the constant column, hence centred
    x = np.linalg.qr(np.column_stack([np.ones(40), rng.standard_normal((40, 5))]))[0][:, 1:] * np.sqrt(40)
    assert np.allclose(x.mean(0), 0, atol=1e-10) and np.allclose(x.T @ x / 40, np.eye(5), atol=1e-10)
    y = x @ np.array([2.0, -1.0, 0.05, 0.0, 0.5]) + 3.0 + 0.1 * rng.standard_normal(40)
    alpha = 0.3
    ols = x.T @ (y - y.mean()) / 40
    want = np.sign(ols) * np.maximum(np.abs(ols) - alpha, 0)
    w, b = lasso(x, y, alpha)
    np.testing.assert_allclose(w, want, atol=1e-9)
    assert b == pytest.approx(y.mean(), abs=1e-9)
    assert w[2] == 0 and w[3] == 0


def test_lasso_meets_its_optimality_conditions_on_a_correlated_design():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 2, (64, 12)).astype(float)
    x[:, 1] = np.where(rng.random(64) < 0.8, x[:, 0], x[:, 1])  # correlated columns
    y = x @ rng.standard_normal(12) + rng.standard_normal(64) * 0.1
    alpha = 0.05
    w, b = lasso(x, y, alpha)
    gradient = x.T @ (y - x @ w - b) / len(y)  # KKT: = alpha sign(w) where w != 0, |.| <= alpha elsewhere
    active = w != 0
    np.testing.assert_allclose(gradient[active], alpha * np.sign(w[active]), atol=1e-7)
    assert np.all(np.abs(gradient[~active]) <= alpha + 1e-7)
    assert np.allclose(lasso(x, y, 0.0)[0], np.linalg.lstsq(np.column_stack([x, np.ones(64)]), y, rcond=None)[0][:12],
                       atol=1e-6)  # alpha 0: least squares


def test_surrogate_recovers_a_planted_linear_outcome():
    masks = ablation_masks(10, 128, 0.5, seed=0)
    weights = np.zeros(10)
    weights[[2, 7]] = [3.0, -1.5]
    y = masks @ weights + 0.7
    w, b = surrogate(masks, y, response_tokens=4, alpha=0.01)
    np.testing.assert_allclose(w, weights, atol=0.1)
    assert abs(b - 0.7) < 0.1
    assert np.all(np.abs(np.delete(w, [2, 7])) < 0.05)


def test_masks_are_contextcites_and_reproducible():
    masks = ablation_masks(6, 5, 0.5, seed=3)
    assert masks.shape == (5, 6) and masks.dtype == bool
    for i, row in enumerate(masks):  # context_cite.utils._create_mask(num_sources, alpha, seed + base_seed)
        assert (row == np.random.RandomState(3 + i).choice([False, True], size=6, p=[0.5, 0.5])).all()
    assert (ablation_masks(6, 5, 0.5, seed=3) == masks).all() and not (ablation_masks(6, 5, 0.5, 4) == masks).all()


def test_response_logit_probability_is_contextcites_aggregate():
    log_p = np.log(np.array([[0.5, 0.5], [0.9, 0.1]]))
    p = np.exp(log_p.sum(1))
    np.testing.assert_allclose(response_logit_probability(log_p), np.log(p / (1 - p)))


def _every_span(spans, offsets, special, count=None):
    """token_sources as it was written first: every token against every span (quadratic)."""
    count = len(offsets) if count is None else count
    out = [[] for _ in spans]
    for i in range(count):
        start, end = offsets[i]
        if special[i] or end <= start:
            continue
        best, overlap = None, 0
        for k, (a, b) in enumerate(spans):
            shared = min(b, end) - max(a, start)
            if shared > overlap:
                best, overlap = k, shared
        if best is not None:
            out[best].append(i)
    return out


def test_token_sources_equal_every_span_compared_and_are_linear():
    import random
    import time

    rng = random.Random(0)
    for _ in range(500):  # tokens of any length, overlapping ones, empty and special ones; spans with gaps
        cuts = sorted(rng.sample(range(400), 2 * rng.randint(0, 12)))
        spans = [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts), 2)]
        at, offsets = 0, []
        for _ in range(rng.randint(0, 120)):
            width = rng.choice([0, 1, 2, 5, 9, 40])
            offsets.append((at, at + width))
            at += rng.choice([0, width, width + 1])
        special = [rng.random() < 0.1 for _ in offsets]
        count = rng.choice([None, len(offsets) // 2])
        assert token_sources(spans, offsets, special, count) == _every_span(spans, offsets, special, count)
    spans = [(100 * i, 100 * i + 90) for i in range(20_000)]
    offsets = [(4 * i, 4 * i + 4) for i in range(500_000)]
    start = time.perf_counter()
    found = token_sources(spans, offsets, [False] * len(offsets))
    assert time.perf_counter() - start < 5  # every token against every span: 10^10 comparisons
    assert found[1] == list(range(25, 48))
