"""What the demo's views and messages say (normx.serving.views, messages, lanes; demo/app.py's handlers), checked
on tiny seeded models without a browser: the contrast only where the scores do not depend on the label and one
contrast direction in the demo and the notebook; white-space tokens visible; the prompt once in the Generate
heading; keys that say each thing once; a cached answer that says so; a budget refusal with the cost and the
budget; errors that quote a short excerpt and, locked, nothing of the server."""

from __future__ import annotations

import html
import re
from dataclasses import replace

import pytest

gr = pytest.importorskip("gradio", reason="the demo needs gradio: pip install -e '.[demo]'")
pytestmark = pytest.mark.filterwarnings("ignore:.*(no_silent_downcasting|copy keyword).*:Warning")  # gradio x pandas

import tiny  # noqa: E402
from demo_support import load_app  # noqa: E402

import normx  # noqa: E402
from normx.errors import WorkBudgetError  # noqa: E402
from normx.explanations.display import READING_NOTES, default_contrast  # noqa: E402
from normx.serving import messages, session, views  # noqa: E402
from normx.serving import server as serving  # noqa: E402
from normx.serving.lanes import WorkGate  # noqa: E402

app = load_app()
TEXT = "a gripping film"


@pytest.fixture(scope="module")
def cache():
    cache = serving.ModelCache()
    cache.put("tiny-nli", *tiny.build("BertForSequenceClassification"))
    cache.put("tiny-lm", *tiny.build("LlamaForCausalLM"))
    return cache


def state_of(cache, method: str, text: str = TEXT, **kwargs) -> session.PageState:
    return session.explain_request(cache, "tiny-nli" if "steps" not in kwargs else "tiny-lm", text, None, method,
                                   **kwargs)


def visible_text(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


# ---- the contrast: where it exists, and its one direction -----------------------------------------------------------

@pytest.mark.parametrize("method", ["gradient_x_input", "gradient_norm", "normxlogit"])
def test_label_dependent_methods_have_a_contrast_whatever_their_reading(cache, method):
    state = state_of(cache, method)
    e = state.steps[0]
    assert e.settings["label_dependent"] is True
    a, b = views.default_contrast(e)
    assert a == e.prediction and b != a  # the predicted label first
    shown = views.page_view(state, None, None, "word", False, 0, a, b)
    assert not shown.contrast.title.startswith("No contrast") and shown.contrast.pieces
    assert shown.contrast.title.startswith(f"contrast: {a} − {b}") and shown.contrast.scale.reading == "signed"
    rows = {label: dict(view.pieces) for label, view in zip(views.label_order(e), shown.labels)}
    scored = [(text, s) for text, s in shown.contrast.pieces if s is not None]
    assert [s for _, s in scored] == pytest.approx([rows[a][t] - rows[b][t] for t, _ in scored], abs=1e-5)
    key = visible_text(views.view_html(shown.contrast))
    assert f"toward {a} rather than {b}" in key and f"toward {b} rather than {a}" in key


@pytest.mark.parametrize("method", ["l2norm", "random"])
def test_only_label_independent_methods_say_they_have_no_contrast(cache, method):
    state = state_of(cache, method)
    assert state.steps[0].settings["label_dependent"] is False
    assert views.default_contrast(state.steps[0]) == (None, None)
    shown = views.page_view(state, None, None, "word", False, 0, "positive", "negative")
    assert shown.contrast.title == f"No contrast: {method}'s scores do not depend on the label"


def test_the_notebook_and_the_demo_draw_the_same_contrast(cache):
    model, tokenizer = cache.get("tiny-nli")
    e = normx.explain(model, tokenizer, TEXT, target="all", layer="all")
    a, b = default_contrast(e, e.labels)
    assert a == e.prediction
    notebook = visible_text(e.to_html())
    assert f"contrast: {a} − {b} · layer {e.layers[-1]}" in notebook
    assert f"toward {a} rather than {b}" in notebook
    state = session.PageState("tiny-nli", "normxlogit", e.kind, None, [TEXT], [e])
    demo = views.page_view(state, None, None, "subword", False, 0, *views.default_contrast(e))
    assert demo.contrast.title.startswith(f"contrast: {a} − {b} · ")


# ---- white space, headings, keys ------------------------------------------------------------------------------------

def test_white_space_tokens_are_visible_in_every_html_view(cache):
    model, tokenizer = cache.get("tiny-lm")
    text = "the film\nwas\tgood"
    e = normx.explain(model, tokenizer, text)
    assert "\n" in e.tokens or "Ċ" in e.tokens
    demo = views.view_html(views.label_views(e, None, "subword")[0])
    units = re.findall(r'<span class="normx-unit"[^>]*>([^<]*)</span>', demo)
    assert "⏎" in units and "⇥" in units and not any(u.isspace() for u in units)
    notebook = e.to_html()
    spans = re.findall(r'<span class="normx-unit"[^>]*>([^<]*)</span>', notebook)
    assert "⏎" in spans and not any(s.isspace() for s in spans)
    g = normx.explain_generation(model, tokenizer, "the film\nwas", max_new_tokens=2)
    page = g._repr_html_()
    cells = re.findall(r"<th[^>]*>([^<]*)", page)
    assert "⏎" in cells and not any("\n" in c for c in cells)  # a label, not a line break
    assert "\n" not in re.sub(r"<[^>]+>", "", page)


def test_the_generate_heading_shows_the_prompt_once_and_short(cache):
    state = state_of(cache, "normxlogit", "the film was", steps=3)
    prompt = "the film was " + " ".join(f"word{i}" for i in range(400))
    cont = state.continuation
    pieces = [state.steps[t].labels[0] for t in range(3)]
    long = replace(state, generation=None, prefixes=[prompt, prompt + pieces[0], prompt + "".join(pieces[:2])])
    for step in range(3):
        heading = views.heading_text(long, step)
        assert heading.count("word1 ") <= 1 and "word200" not in heading  # once, its middle left out
        assert "…" in heading and views.markdown_text(prompt[-20:]) in heading
        assert f"Step {step + 1} of 3" in heading and cont.strip()[:3] in heading
    assert "after the prompt —" in views.heading_text(long, 0)
    short = views.heading_text(state, 1)
    assert short.count("the film was") == 1 and "after the prompt and" in short


def test_keys_say_each_thing_once_in_readable_colours(cache):
    state = state_of(cache, "normxlogit")
    label = views.view_html(views.page_view(state, None, None).labels[0])
    key = visible_text(re.search(r'<div class="normx-key">(.*?)</div>', label).group(1))
    assert key.count("compare tokens, not signs") == 1 and READING_NOTES["relative"] in key
    title = visible_text(re.search(r'<div class="normx-title">(.*?)</div>', label).group(1))
    assert "compare tokens" not in title
    assert "subdued" not in views.PAGE_CSS and "var(--body-text-color)" in views.PAGE_CSS
    magnitude = visible_text(views.view_html(views.page_view(state_of(cache, "l2norm"), None, None).labels[0]))
    assert magnitude.count("magnitude (unsigned)") == 1


# ---- how the answer came, and refusals ------------------------------------------------------------------------------

def test_a_cached_answer_says_it_was_cached(cache):
    results = session.ResultCache()
    first = session.explain_request(cache, "tiny-nli", "a cached film", method="normxlogit", results=results)
    again = session.explain_request(cache, "tiny-nli", "a cached film", method="normxlogit", results=results)
    assert not first.cached and again.cached and again.seconds == first.seconds
    assert "answered in" in views.heading_text(first, 0) and "cache" not in views.heading_text(first, 0)
    heading = views.heading_text(again, 0)
    assert "answered from this server's cache" in heading and f"first computed in {first.seconds:.2f} s" in heading
    assert "answered in" not in heading


@pytest.mark.parametrize(("gflop", "budget", "need", "allowed"), [
    (2340.4, 1500, "2,340", "1,500"), (1500.3, 1500, "1,500.3", "1,500.0"), (0.0123, 0.01, "0.012", "0.010")])
def test_the_budget_refusal_states_the_cost_and_the_budget(gflop, budget, need, allowed):
    with pytest.raises(WorkBudgetError) as info:
        WorkGate(budget).check(gflop, "this request")
    message = str(info.value)
    assert f"needs about {need} GFLOP; this server allows {allowed} GFLOP per request" in message
    assert "x the" not in message


def test_the_layer_slider_is_hidden_until_the_first_answer(cache):
    blocks = app.build_demo(cache=cache, default_model="tiny-nli", locked=False)
    slider = [b for b in blocks.blocks.values() if isinstance(b, gr.Slider) and b.label == "Layer"][0]
    assert slider.visible is False
    out = app.Demo(cache).explain("tiny-nli", TEXT, "", "normxlogit", 4, "word", False, [])
    assert out[1]["visible"] is True and out[1]["maximum"] == max(out[0].steps[0].layers)


# ---- error messages -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["unit", "model", "compare"])
def test_errors_quote_a_short_excerpt_of_a_huge_input(cache, bad):
    huge = "x" * 5_000_000
    args = {"unit": ("tiny-nli", TEXT, "", "normxlogit", 4, huge, False, []),
            "model": ("./" + huge, TEXT, "", "normxlogit", 4, "word", False, []),
            "compare": ("tiny-nli", TEXT, "", "normxlogit", 4, "word", False, [huge] * 1000)}[bad]
    with pytest.raises(gr.Error) as info:
        app._guard(app.Demo(cache).explain)(*args)
    message = info.value.message
    assert len(message) <= messages.MAX_MESSAGE and "x" * (messages.EXCERPT + 1) not in message
    assert re.search(r"[\d,]+ (characters|items)", message), message


def test_locked_errors_say_nothing_of_the_server(tmp_path, monkeypatch):
    def broken(name):
        raise OSError(f"[Errno 2] No such file or directory: '{tmp_path}/secret/config.json'")

    cache = serving.ModelCache(broken, locked=True, allowed=["minilm-sst2"])
    with pytest.raises(normx.ModelLoadError) as info:
        cache.get("minilm-sst2")  # an allowed model whose load fails: no path, no errno
    assert str(tmp_path) not in str(info.value) and "could not be loaded on this server" in str(info.value)
    refusals = set()
    for name in (str(tmp_path), str(tmp_path / "missing"), "/etc/passwd", "x" * 10_000):
        with pytest.raises(normx.ModelLoadError) as info:
            cache.get(name)
        refusals.add(str(info.value))
    assert len(refusals) == 1  # one refusal, whatever the name is on the server's disk
    unexpected = RuntimeError(f"failed reading {tmp_path}/weights")
    assert messages.error_message(unexpected, locked=True) == messages.SERVER_FAILURE
    assert str(tmp_path) in messages.error_message(unexpected, locked=False)  # the person serving sees it
    demo = app.Demo(cache)
    monkeypatch.setattr(session, "explain_request", lambda *a, **k: (_ for _ in ()).throw(unexpected))
    with pytest.raises(gr.Error) as raised:
        app._guard(demo.explain)("minilm-sst2", TEXT, "", "normxlogit", 4, "word", False, [])
    assert raised.value.message == messages.SERVER_FAILURE  # the guard reads the demo's locked mode
