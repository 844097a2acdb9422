"""HTML views (notebooks and files) and round trips: Explanation.from_dict(e.to_dict()) == e for every head and
method kind; the views carry every unit with the demo's colour rule; a generation's view holds its matrix."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import tiny

import normx
from normx import Explanation
from normx.explanations.display import AMOUNT, Scale
from normx.explanations.html import NEGATIVE, POSITIVE

CASES = ["BertForSequenceClassification", "BertForMaskedLM", "LlamaForCausalLM", "GPT2ForSequenceClassification"]


def explained(case: str, **kwargs):
    model, tok = tiny.build(case)
    text = tiny.texts_for(tiny.CASE_BY_ID[case], tok)[0]
    return normx.explain(model, tok, text, **kwargs)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kwargs", [{}, {"layer": "all"}, {"method": "gradient_x_input"},
                                    {"method": "integrated_gradients", "n_steps": 4}])
def test_from_dict_round_trip_is_exact(case, kwargs):
    for e in (explained(case, **kwargs), explained(case, **kwargs).words("mean")):
        data = json.loads(json.dumps(e.to_dict()))
        back = Explanation.from_dict(data)
        assert back == e and back.to_dict() == data
        assert back.to_html() == e.to_html()


def test_equality_sees_a_changed_score():
    e = explained("BertForSequenceClassification")
    scores = e.scores.copy()
    scores[0, 0, 1] = np.nextafter(scores[0, 0, 1], np.inf, dtype=np.float32)
    assert Explanation.from_dict(e.to_dict()) != e.__class__(**{**e.__dict__, "scores": scores})


def test_the_html_view_shows_every_unit_coloured_by_the_shared_rule():
    """NormXLogit's label views are relative (one colour, the labels on one scale from the lowest score to the
    highest), its contrast signed (red / purple); the legend says so."""
    model, tok = tiny.build("BertForSequenceClassification")
    e = normx.explain(model, tok, "a gripping film", target="all", layer="all")
    assert e.settings["reading"] == "relative"
    page = e._repr_html_()
    assert "<script" not in page and "http" not in page  # self-contained, no script
    spans = re.findall(r'<span class="normx-unit" style="background:([^;]+);[^"]*" title="([^"]+)">', page)
    first_view = spans[:len(e.tokens)]  # the first label's view at the last layer
    words = [i for i, special in enumerate(e.special) if not special]
    every = np.concatenate([e.scores[k, -1, words] for k in range(len(e.labels))])  # the labels on one scale
    scale = Scale("relative", float(every.min()), float(every.max()))
    for (background, title), token, value in zip(first_view, e.tokens, e.scores[0, -1]):
        assert title == f"{token}: {float(value):+.4g}" and background == scale.css(float(value))
    assert f"rgba({AMOUNT[0]},{AMOUNT[1]},{AMOUNT[2]},1.000)" in page  # the highest is full colour
    assert "compare tokens, not signs" in page
    contrast = page[page.index("contrast:"):]
    assert f"rgba({POSITIVE[0]},{POSITIVE[1]},{POSITIVE[2]}" in contrast or \
        f"rgba({NEGATIVE[0]},{NEGATIVE[1]},{NEGATIVE[2]}" in contrast  # the contrast is signed
    assert "words (sum of their tokens)" in page and "every layer" in page
    assert page.count('class="normx-view"') == len(e.labels) + 1 + 1 + len(e.layers)
    several = normx.explain(model, tok, ["a gripping film", "a dull plot"])
    assert isinstance(several, list) and several._repr_html_().count('class="normx-explanation"') == 2


@pytest.mark.parametrize(("method", "options", "reading"), [
    ("l2norm", {}, "magnitude"), ("gradient_x_input", {}, "magnitude"), ("random", {}, "magnitude"),
    ("gradient_x_input", {"aggregation": "sum"}, "signed"), ("normxlogit", {}, "relative"),
    ("integrated_gradients", {"n_steps": 4, "aggregation": "sum"}, "signed"),
])
def test_unsigned_methods_are_drawn_as_magnitudes_and_signed_ones_diverging(method, options, reading):
    model, tok = tiny.build("BertForSequenceClassification")
    e = normx.explain(model, tok, "a gripping film", method=method, **options)
    assert e.settings["reading"] == reading
    page = e.to_html()
    colours = set(re.findall(r"background:rgba\((\d+,\d+,\d+),", page))
    if reading == "signed":
        assert colours <= {",".join(map(str, POSITIVE)), ",".join(map(str, NEGATIVE))}
        assert "toward the label" in page
    else:
        assert colours <= {",".join(map(str, AMOUNT))}
        assert ("magnitude" in page) == (reading == "magnitude") and "toward the label" not in page
    assert normx.explain(model, tok, "a gripping film", method=method, target="positive", foil="negative",
                         **options).settings["reading"] == ("magnitude" if reading == "magnitude" else "signed")


def test_the_generation_view_is_its_matrix():
    model, tok = tiny.build("LlamaForCausalLM")
    g = normx.explain_generation(model, tok, "the film was", max_new_tokens=3)
    page = g._repr_html_()
    assert page.count("<tr>") == 1 + g.steps and "<script" not in page
    cells = re.findall(r'<td style="[^"]*background:([^"]+)" title="([^"]+)"></td>', page)
    assert len(cells) == sum(g.generated)  # the row of the token at index p has p cells
    several = normx.explain_generation(model, tok, ["the film was", "a dull"], max_new_tokens=2)
    assert several._repr_html_().count('class="normx-generation"') == 2


@pytest.mark.parametrize("seed", range(25))
def test_random_explanations_round_trip_exactly(seed):
    """Property: any explanation (any tokens and text, any float32 scores incl. NaN, -0.0 and extremes, any labels
    and layers, regression or not) survives to_dict -> JSON -> from_dict unchanged."""
    rng = np.random.default_rng(seed)
    n, k, layers = int(rng.integers(1, 12)), int(rng.integers(1, 4)), int(rng.integers(1, 4))
    alphabet = [*"abcXYZ éü漢字🙂\t'\"<>&", "##", "Ġ", "[CLS]"]
    tokens = ["".join(rng.choice(alphabet, int(rng.integers(1, 4)))) for _ in range(n)]
    text = " ".join(tokens)
    scores = rng.standard_normal((k, layers, n)).astype(np.float32) * np.float32(10.0 ** rng.integers(-30, 30))
    scores.flat[rng.integers(0, scores.size)] = np.nan
    scores.flat[rng.integers(0, scores.size)] = -0.0
    regression = bool(rng.integers(0, 2))
    labels = ["score"] if regression else [f"label {i}" for i in range(k)]
    e = Explanation(text=text, text_pair=None if rng.integers(0, 2) else "a pair", tokens=tokens,
                    offsets=[(i, i + 1) for i in range(n)], segments=[0] * n,
                    special=[bool(b) for b in rng.integers(0, 2, n)], scores=scores[:len(labels)], labels=labels,
                    layers=sorted(rng.choice(30, layers, replace=False).tolist()),
                    prediction=float(rng.standard_normal()) if regression else labels[0],
                    probabilities={} if regression else {lab: float(rng.random()) for lab in labels},
                    method="normxlogit", settings={"target": None, "layer": "all", "n_steps": 3},
                    warnings=["truncated"] if rng.integers(0, 2) else [], regression=regression,
                    kind="sequence_classification", family="bert", pooled=int(rng.integers(0, n)))
    back = Explanation.from_dict(json.loads(json.dumps(e.to_dict())))
    assert back == e and back.to_dict() == e.to_dict()
