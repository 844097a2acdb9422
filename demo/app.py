"""normx Gradio demo: per-label, per-layer NormXLogit explanations as highlighted text (``python demo/app.py``,
``normx demo``; the Spaces ``app_file``). Layout and a thin shell over :mod:`normx.serving` (tested without a browser).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no telemetry, no version check: the demo runs offline

try:
    import normx
except ImportError:  # a source checkout run as `python demo/app.py` without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import normx

import gradio as gr

from normx.serving import context_view, messages, session, space, views
from normx.serving import server as serving
from normx.serving.lanes import WorkGate

DEFAULT_MODEL = "minilm-sst2"
CONCURRENCY = 32  # requests served at once; expensive ones (normx.serving.lanes.WorkGate) one at a time among them
ERROR_SECONDS = 12  # an error message closes by itself: it never stays over the next good result
HIDDEN = {"value": None, "visible": False}


def _guard(fn, locked: bool | None = None):
    """Every handler: user errors become a message in the page (gr.Error), never a dead app, worded by
    :func:`normx.serving.messages.error_message` (an excerpt of the input; locked: no detail that is not the user's)."""
    if locked is None:
        locked = bool(getattr(getattr(getattr(fn, "__self__", None), "cache", None), "locked", False))

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except Exception as exc:
            if not isinstance(exc, normx.NormxError):  # a user's error is a message in the page's words
                serving.log.exception("demo handler failed")  # anything else is logged too
            raise gr.Error(messages.error_message(exc, locked), duration=ERROR_SECONDS, print_exception=False) \
                from None

    return wrapper


class Demo:
    """The handlers, bound to one model cache and work gate. ``build()`` makes the ``gr.Blocks``."""

    def __init__(self, cache: serving.ModelCache, methods: Sequence[str] | None = None,
                 default_model: str = DEFAULT_MODEL, gate: WorkGate | None = None,
                 batcher: session.Batcher | None = None, results: session.ResultCache | None = None):
        self.cache, self.batcher, self.results = cache, batcher, results  # None: no batching, no answers kept
        self.gate = gate if gate is not None else WorkGate(serving.budget_gflop())
        self.methods, self.default_model = list(methods if methods is not None else normx.list_methods()), default_model

    def on_model_change(self, name: str):
        """Show the second text box and the continuation slider when the (preset) model takes them."""
        pair_visible, steps_visible, note = serving.input_fields(name, self.cache.locked)
        pair = gr.update(visible=True) if pair_visible else gr.update(visible=False, value="")
        return pair, gr.update(visible=steps_visible), gr.update(value=note), *self._method_pickers(name)

    def _method_pickers(self, name: str) -> tuple:
        """The method picker and the compare choices: only the methods the model supports, once it is loaded."""
        loaded = self.cache.peek(name)
        if loaded is None:
            return gr.update(), gr.update()
        usable = [m for m in self.methods if m in normx.methods.methods_for(loaded[0])]
        return gr.update(choices=usable), gr.update(choices=usable)

    def on_method_change(self, method: str):
        return f"*{normx.describe_methods().get(method, '')}*"

    def explain(self, model_name, text, pair, method, steps, unit, show_special, compare_methods,
                progress=gr.Progress()):  # noqa: B008 (Gradio's way of asking for a progress bar)
        views.check_view_settings(None, unit, show_special, 0, compare_methods, self.methods)
        state = session.explain_request(self.cache, model_name, text, pair, method, steps, self.gate, self.batcher,
                                        self.results, loading=progress)
        for warning in [*state.notices, *(first := state.steps[0]).warnings]:
            gr.Warning(warning)
        top, layered = max(first.layers), len(first.layers) > 1
        slider = gr.update(maximum=max(top, 1), value=top, interactive=layered, visible=True,
                           info=f"0 = embedding output … {top} = last block" if layered
                           else f"{method} has no per-layer scores (input embeddings only)")
        step_radio = gr.update(choices=views.step_choices(state, self._tokenizer(state)), value=0,
                               visible=state.kind == "causal_lm")
        pickers = self._contrast(state, 0)
        return [state, slider, step_radio, *pickers[1:],
                *self.render(state, top, unit, show_special, 0, *pickers[0], compare_methods),
                *self._method_pickers(model_name)]

    def on_step(self, state, layer, unit, show_special, step, compare_methods):
        """A causal LM's step picked: its contrast pickers (its top tokens) and a re-render."""
        views.check_view_settings(layer, unit, show_special, step, compare_methods, self.methods)
        if not state:
            return [state, gr.update(), gr.update(), *self.render(state, layer, unit, show_special, 0, None, None,
                                                                  compare_methods)]
        (a, b), picker_a, picker_b = self._contrast(state, int(step or 0))
        return [state, picker_a, picker_b, *self.render(state, layer, unit, show_special, step, a, b,
                                                        compare_methods)]

    def on_contrast(self, state, layer, unit, show_special, step, label_a, label_b, compare_methods):
        views.check_view_settings(layer, unit, show_special, step, compare_methods, self.methods)
        if state:
            views.check_contrast(state, int(step or 0), label_a, label_b, self._tokenizer(state))
            session.ensure_contrast(state, self.cache, int(step or 0), label_a, label_b, self.gate)
        return [state, *self.render(state, layer, unit, show_special, step, label_a, label_b, compare_methods)]

    def on_compare(self, state, layer, unit, show_special, step, label_a, label_b, compare_methods):
        if not state:
            raise gr.Error("explain a text first, then compare methods on it")
        views.check_view_settings(layer, unit, show_special, step, compare_methods, self.methods)
        for error in session.compare_request(state, self.cache, list(compare_methods or []), int(step or 0),
                                             self.gate):
            gr.Warning(error)
        return [state, *self.render(state, layer, unit, show_special, step, label_a, label_b, compare_methods)]

    def render(self, state, layer, unit, show_special, step, label_a, label_b, compare_methods) -> list:
        """Every view from the state (:func:`normx.serving.views.page_view`); never computes an explanation."""
        views.check_view_settings(layer, unit, show_special, step, compare_methods, self.methods)
        view = views.page_view(state, self._tokenizer(state), layer, unit, show_special, step, label_a, label_b,
                               compare_methods or [])
        labels = [gr.update(value=views.view_html(label), visible=True) for label in view.labels]
        labels += [gr.update(**HIDDEN)] * (views.MAX_LABEL_VIEWS - len(labels))
        contrast = gr.update(value=views.view_html(view.contrast))
        probs = gr.update(value=view.probabilities or None, visible=bool(view.probabilities))  # updates, not values:
        compared = gr.update(value=views.compare_html(view.compared))  # a value is postprocessed in a worker thread
        return [gr.update(value=view.heading), probs, *labels, contrast, compared]

    def _tokenizer(self, state):
        return self.cache.get(state.model)[1] if state else None

    def _contrast(self, state, step: int):
        """The step's default contrast (computed once for vocabulary heads) and the two pickers' updates."""
        explanation, tokenizer = state.steps[step], self._tokenizer(state)
        a, b = views.default_contrast(explanation)
        session.ensure_contrast(state, self.cache, step, a, b, self.gate)
        choices = views.contrast_choices(explanation, tokenizer)
        return ((a, b), gr.update(choices=choices, value=a, visible=bool(choices)),
                gr.update(choices=choices, value=b, visible=bool(choices)))

    def cite(self, model_name, context, query, sources, method, n_ablations, answer_tokens,
             progress=gr.Progress()):  # noqa: B008
        """The Context view: the model answers, the method scores the sources (:mod:`normx.serving.context_view`)."""
        state = context_view.context_request(self.cache, model_name, context, query, sources, method, n_ablations,
                                             answer_tokens, self.gate, loading=progress)
        return [gr.update(value=context_view.heading(state)), gr.update(value=context_view.view_html(state)),
                gr.update(value=context_view.top_sources(state))]

    def build(self) -> gr.Blocks:
        offered = list(self.cache.allowed if self.cache.locked else normx.list_presets())
        with gr.Blocks(title="normx: NormXLogit explanations", analytics_enabled=False) as blocks:
            gr.Markdown(
                "# normx · NormXLogit token attributions\n"
                "Which words push a transformer's prediction toward each label? NormXLogit runs the model's own "
                "head on every token (one forward pass, no gradients) and weighs it by the token's input norm "
                "(Abbasi et al., EMNLP 2025). **Context**: which part of your documents a causal LM's answer came "
                "from.")
            with gr.Tabs():
                with gr.Tab("Tokens", elem_id="normx-tokens-tab"):
                    self._tokens_view(offered)
                with gr.Tab("Context", elem_id="normx-context-tab"):
                    self._context_view(offered)
        blocks.queue(default_concurrency_limit=CONCURRENCY, max_size=64)  # explain is thread-safe; see the gate
        return blocks

    def _tokens_view(self, offered: list[str]) -> None:
        """Every label's and layer's token scores for one text, contrasts and methods side by side."""
        locked = self.cache.locked
        choices = offered if self.default_model in offered else [self.default_model, *offered]
        examples, info = serving.examples(offered), serving.preset_info(self.default_model)
        state = gr.State(None)
        with gr.Row(equal_height=False):
            with gr.Column(scale=5, min_width=380):
                with gr.Row():
                    model = gr.Dropdown(choices=choices, value=self.default_model, label="Model", scale=3,
                                        allow_custom_value=not locked, elem_id="normx-model",
                                        info="an offline preset" + ("" if locked else
                                                                   ", a local folder, an adapter or a hub id"))
                    method = gr.Dropdown(choices=self.methods, value="normxlogit" if "normxlogit" in self.methods
                                         else self.methods[0], label="Method", scale=2, elem_id="normx-method")
                model_note = gr.Markdown(f"*{info['description']}*" if info["description"] else "")
                method_note = gr.Markdown(f"*{normx.describe_methods().get('normxlogit', '')}*")
                text = gr.Textbox(label="Text", lines=2, elem_id="normx-text",
                                  info=f"up to {session.MAX_CHARS:,} characters and {session.MAX_TOKENS} tokens "
                                       "are explained; a longer text is cut (the page says where)",
                                  placeholder="A sentence (the premise for sentence-pair models, a prompt for LMs)")
                pair = gr.Textbox(label="Second text", info="sentence-pair models (NLI, STS-B): the hypothesis "
                                  "or second sentence", value="", lines=1, elem_id="normx-pair",
                                  visible=info["inputs"] != "single" and info["task"] != "causal-lm")
                steps = gr.Slider(1, session.MAX_CONTINUATION, value=session.DEFAULT_CONTINUATION, step=1,
                                  label="Tokens to generate and explain (causal LMs)",
                                  visible=info["task"] in ("causal-lm", "unknown"))
                button = gr.Button("Explain", variant="primary", elem_id="normx-explain")
                if examples:
                    gr.Examples(examples=examples, inputs=[model, text, pair], cache_examples=False,
                                label="Examples (model, text, second text)", examples_per_page=8)
            with gr.Column(scale=6, min_width=420):
                prediction = gr.Markdown(label="Prediction", elem_id="normx-prediction")
                probs = gr.Label(label="Probabilities", num_top_classes=6, visible=False, show_heading=False,
                                 elem_id="normx-probabilities")
                with gr.Row():
                    layer = gr.Slider(0, 1, value=1, step=1, label="Layer", elem_id="normx-layer", scale=3,
                                      visible=False,  # shown with the first answer, at its model's layers
                                      info="every layer comes from the same forward pass: moving this does not "
                                           "recompute")
                    unit = gr.Radio(["word", "subword"], value="word", label="Units", elem_id="normx-unit", scale=2)
                    show_special = gr.Checkbox(value=False, label="Special tokens", scale=1, min_width=100)
                step = gr.Radio(choices=[0], value=0, label="Generated token: pick one to see what it drew on",
                                visible=False, elem_id="normx-step")
                gr.Markdown(views.LEGEND)
                with gr.Tabs():
                    with gr.Tab("Per label"):
                        label_boxes = [gr.HTML(label=f"label {i + 1}", visible=False, elem_id=f"normx-label-{i}")
                                       for i in range(views.MAX_LABEL_VIEWS)]
                    with gr.Tab("Contrast"):
                        with gr.Row():
                            contrast_a = gr.Dropdown(choices=[""], value="", label="Label A (red)",
                                                     elem_id="normx-contrast-a")
                            contrast_b = gr.Dropdown(choices=[""], value="", label="Label B (purple)",
                                                     elem_id="normx-contrast-b")
                        contrast = gr.HTML("", label="contrast", elem_id="normx-contrast")
                    with gr.Tab("Compare methods"):
                        with gr.Row():
                            compare_methods = gr.CheckboxGroup(self.methods, label="Methods (same input, the "
                                                               "predicted label)",
                                                               value=views.default_compare_methods(self.methods))
                            compare_button = gr.Button("Compare", scale=0, min_width=120, elem_id="normx-compare")
                        compared = gr.HTML(views.compare_html({}), label="Compared", elem_id="normx-compared")
        shown = [prediction, probs, *label_boxes, contrast, compared]
        view_inputs = [state, layer, unit, show_special, step]
        compare_inputs = [*view_inputs, contrast_a, contrast_b, compare_methods]

        model.change(_guard(self.on_model_change), model, [pair, steps, model_note, method, compare_methods],
                     queue=False, api_visibility="private", show_progress_on=[model_note])
        method.change(_guard(self.on_method_change), method, method_note, queue=False, api_visibility="private")
        explain_inputs = [model, text, pair, method, steps, unit, show_special, compare_methods]
        explain_outputs = [state, layer, step, contrast_a, contrast_b, *shown, method, compare_methods]
        # raw JSON in, checked by the handlers; progress / error marks on the views only: controls stay usable
        raw = {"preprocess": False, "show_progress_on": [prediction, *label_boxes]}
        button.click(_guard(self.explain), explain_inputs, explain_outputs, api_name="explain", **raw)
        text.submit(_guard(self.explain), explain_inputs, explain_outputs, api_visibility="private", **raw)
        # the slider, the toggles and the compare picks re-render from the state (no forward pass)
        rerender = _guard(self.render)
        layer.release(rerender, compare_inputs, shown, api_name="render", concurrency_limit=None, **raw)
        for control in (layer, unit, show_special, compare_methods):
            control.input(rerender, compare_inputs, shown, api_visibility="private", concurrency_limit=None, **raw)
        step.input(_guard(self.on_step), [*view_inputs, compare_methods], [state, contrast_a, contrast_b, *shown],
                   api_visibility="private", **raw)
        gr.on([contrast_a.input, contrast_b.input], _guard(self.on_contrast), compare_inputs, [state, *shown],
              api_visibility="private", **raw)
        compare_button.click(_guard(self.on_compare), compare_inputs, [state, *shown], api_name="compare", **raw)

    def _context_view(self, offered: list[str]) -> None:
        """Documents and a question in; the answer, its sources highlighted and the top sources out."""
        cv, models = context_view, context_view.context_models(offered)
        with gr.Row(equal_height=False):
            with gr.Column(scale=5, min_width=380):
                with gr.Row():
                    model = gr.Dropdown(choices=models, value=cv.default_model(models), label="Causal LM", scale=1,
                                        allow_custom_value=not self.cache.locked, elem_id="normx-ctx-model")
                    method = gr.Dropdown(choices=cv.method_choices(), value=cv.DEFAULT_METHOD, scale=3,
                                         label="Method (and its cost)", elem_id="normx-ctx-method")
                cost = gr.Markdown(cv.cost_note(cv.DEFAULT_METHOD, "", "sentences", cv.DEFAULT_ABLATIONS))
                context = gr.Textbox(label="Documents", lines=8, elem_id="normx-ctx-documents",
                                     info=f"the context: up to {cv.MAX_CONTEXT_CHARS:,} characters, split into "
                                          "sources", placeholder="Paste documents, passages or notes here")
                query = gr.Textbox(label="Question", lines=1, elem_id="normx-ctx-question")
                with gr.Row():
                    sources = gr.Radio(list(cv.SOURCES), value="sentences", label="Sources",
                                       elem_id="normx-ctx-sources")
                    ablations = gr.Number(cv.DEFAULT_ABLATIONS, precision=0, minimum=1, elem_id="normx-ctx-ablations",
                                          label="n_ablations (contextcite)")
                    answer_tokens = gr.Slider(1, cv.MAX_ANSWER_TOKENS, value=cv.DEFAULT_ANSWER_TOKENS, step=1,
                                              label="Answer tokens (greedy)", elem_id="normx-ctx-answer-tokens")
                button = gr.Button("Answer and attribute", variant="primary", elem_id="normx-ctx-explain")
                gr.Examples(examples=cv.EXAMPLES, inputs=[context, query], label="Example (documents, question)")
            with gr.Column(scale=6, min_width=420):
                answer = gr.Markdown(label="Answer", elem_id="normx-ctx-answer")
                highlighted = gr.HTML("", label="Sources", elem_id="normx-ctx-view")
                top = gr.Markdown(label="Top sources", elem_id="normx-ctx-top")
        inputs, shown = [model, context, query, sources, method, ablations, answer_tokens], [answer, highlighted, top]
        raw = {"preprocess": False, "show_progress_on": [answer, highlighted]}
        button.click(_guard(self.cite), inputs, shown, api_name="cite", **raw)
        query.submit(_guard(self.cite), inputs, shown, api_visibility="private", **raw)
        gr.on([method.input, context.input, sources.input, ablations.input], _guard(cv.cost_note),
              [method, context, sources, ablations], cost, queue=False, api_visibility="private", preprocess=False)


def build_demo(locked: bool | None = None, models: Sequence[str] | None = None, default_model: str | None = None,
               cache: serving.ModelCache | None = None, methods: Sequence[str] | None = None,
               budget: float | None = None) -> gr.Blocks:
    """The demo page, queued, one-pass requests batched, answers kept. ``locked``: only ``models`` load; ``cache``:
    a ``serving.ModelCache`` to share; ``methods``: the choices (all); ``budget``: GFLOP per request."""
    locked = serving.is_locked(locked)
    allowed = serving.allowed_models(models)
    if cache is None:
        cache = serving.ModelCache(locked=locked, allowed=allowed)
    default = serving.default_model_name(default_model, locked, allowed, DEFAULT_MODEL)
    return Demo(cache, methods, default, serving.work_gate(budget), serving.batcher(),
                session.ResultCache()).build()


def theme() -> gr.themes.Base:
    """The default theme with system fonts: no Google Fonts request, so the page renders offline."""
    return gr.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"],
                             font_mono=["ui-monospace", "SFMono-Regular", "monospace"])


def launch_kwargs(**overrides) -> dict:
    """``Blocks.launch`` settings for an offline, never-shared server (tests use them too)."""
    return {"share": False, "show_error": True, "ssr_mode": False, "theme": theme(), "css": views.PAGE_CSS,
            "mcp_server": False, "footer_links": ["api", "settings"], **overrides}


def launch(host: str | None = None, port: int | None = None, locked: bool | None = None,
           models: Sequence[str] | None = None, default_model: str | None = None, budget: float | None = None,
           task: str | None = None, **overrides):
    """Build and serve the demo (blocks until stopped). Host / port: :func:`normx.serving.space.listen_address`;
    ``locked`` to :func:`normx.serving.server.resolve_locked` (unlocked on loopback only); ``task``: the head to load
    models with when their config names none (``--task``)."""
    serving.server_process()
    host, port = space.listen_address(host, port)  # a Space ($SPACE_ID): 0.0.0.0:7860, where its proxy connects
    locked = serving.resolve_locked(locked, host)
    allowed = serving.allowed_models(models)
    cache = serving.ModelCache(locked=locked, allowed=allowed, task=task)
    if (notice := serving.busy_port_notice(host, port)) is not None:
        print(notice, file=sys.stderr)
    demo = build_demo(locked=locked, models=allowed, default_model=default_model, cache=cache, budget=budget)
    cache.preload(serving.default_model_name(default_model, locked, allowed, DEFAULT_MODEL))
    return demo.launch(**launch_kwargs(server_name=host, server_port=port, **overrides))


def main(argv: list[str] | None = None) -> int:
    """``python demo/app.py [options]`` / ``normx demo [options]`` (:func:`normx.serving.server.demo_arguments`)."""
    args = serving.demo_arguments(argv, DEFAULT_MODEL)
    launch(args.host, args.port, locked=args.locked, models=args.models, default_model=args.model,
           budget=args.budget_gflop, task=args.task)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
