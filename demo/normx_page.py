"""The demo page's layout: its two views' Gradio components (Tokens: a text's token scores per label and layer,
contrasts, methods side by side; Context: which documents a causal LM's answer came from), the page around them and
which handler each event calls. The handlers are ``demo/app.py``'s :class:`Demo` (``demo`` here: its cache, methods,
default model and ``explain``, ``render``, ``on_*`` and ``cite``); what they compute and show is ``normx.serving``'s.
A module of the demo next to app.py: ``normx space`` ships it with the app (every module the app imports from its
folder).
"""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr

import normx
from normx.serving import context_view as cv
from normx.serving import server as serving
from normx.serving import session, views

CONCURRENCY = 32  # requests served at once; expensive ones (normx.serving.lanes.WorkGate) one at a time among them


def theme() -> gr.themes.Base:
    """The default theme with system fonts: no Google Fonts request, so the page renders offline."""
    return gr.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"],
                             font_mono=["ui-monospace", "SFMono-Regular", "monospace"])


def build(demo, guard: Callable[[Callable], Callable]) -> gr.Blocks:
    """The page (``gr.Blocks``, queued) of ``demo``'s handlers, each wrapped in ``guard`` (errors as messages)."""
    offered = list(demo.cache.allowed if demo.cache.locked else normx.list_presets())
    with gr.Blocks(title="normx: NormXLogit explanations", analytics_enabled=False) as blocks:
        gr.Markdown(
            "# normx · NormXLogit token attributions\n"
            "Which words push a transformer's prediction toward each label? NormXLogit runs the model's own "
            "head on every token (one forward pass, no gradients) and weighs it by the token's input norm "
            "(Abbasi et al., EMNLP 2025). **Context**: which part of your documents a causal LM's answer came "
            "from.")
        with gr.Tabs():
            with gr.Tab("Tokens", elem_id="normx-tokens-tab"):
                tokens_view(demo, guard, offered)
            with gr.Tab("Context", elem_id="normx-context-tab"):
                context_view(demo, guard, offered)
    blocks.queue(default_concurrency_limit=CONCURRENCY, max_size=64)  # explain is thread-safe; see the gate
    return blocks


def tokens_view(demo, guard: Callable[[Callable], Callable], offered: list[str]) -> None:
    """Every label's and layer's token scores for one text, contrasts and methods side by side."""
    locked = demo.cache.locked
    choices = offered if demo.default_model in offered else [demo.default_model, *offered]
    examples, info = serving.examples(offered), serving.preset_info(demo.default_model)
    state = gr.State(None)
    with gr.Row(equal_height=False):
        with gr.Column(scale=5, min_width=380):
            with gr.Row():
                model = gr.Dropdown(choices=choices, value=demo.default_model, label="Model", scale=3,
                                    allow_custom_value=not locked, elem_id="normx-model",
                                    info="an offline preset" + ("" if locked else
                                                               ", a local folder, an adapter or a hub id"))
                method = gr.Dropdown(choices=demo.methods, value="normxlogit" if "normxlogit" in demo.methods
                                     else demo.methods[0], label="Method", scale=2, elem_id="normx-method")
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
                        compare_methods = gr.CheckboxGroup(demo.methods, label="Methods (same input, the "
                                                           "predicted label)",
                                                           value=views.default_compare_methods(demo.methods))
                        compare_button = gr.Button("Compare", scale=0, min_width=120, elem_id="normx-compare")
                    compared = gr.HTML(views.compare_html({}), label="Compared", elem_id="normx-compared")
    shown = [prediction, probs, *label_boxes, contrast, compared]
    view_inputs = [state, layer, unit, show_special, step]
    compare_inputs = [*view_inputs, contrast_a, contrast_b, compare_methods]

    model.change(guard(demo.on_model_change), model, [pair, steps, model_note, method, compare_methods],
                 queue=False, api_visibility="private", show_progress_on=[model_note])
    method.change(guard(demo.on_method_change), method, method_note, queue=False, api_visibility="private")
    explain_inputs = [model, text, pair, method, steps, unit, show_special, compare_methods]
    explain_outputs = [state, layer, step, contrast_a, contrast_b, *shown, method, compare_methods]
    # raw JSON in, checked by the handlers; progress / error marks on the views only: controls stay usable
    raw = {"preprocess": False, "show_progress_on": [prediction, *label_boxes]}
    button.click(guard(demo.explain), explain_inputs, explain_outputs, api_name="explain", **raw)
    text.submit(guard(demo.explain), explain_inputs, explain_outputs, api_visibility="private", **raw)
    # the slider, the toggles and the compare picks re-render from the state (no forward pass)
    rerender = guard(demo.render)
    layer.release(rerender, compare_inputs, shown, api_name="render", concurrency_limit=None, **raw)
    for control in (layer, unit, show_special, compare_methods):
        control.input(rerender, compare_inputs, shown, api_visibility="private", concurrency_limit=None, **raw)
    step.input(guard(demo.on_step), [*view_inputs, compare_methods], [state, contrast_a, contrast_b, *shown],
               api_visibility="private", **raw)
    gr.on([contrast_a.input, contrast_b.input], guard(demo.on_contrast), compare_inputs, [state, *shown],
          api_visibility="private", **raw)
    compare_button.click(guard(demo.on_compare), compare_inputs, [state, *shown], api_name="compare", **raw)


def context_view(demo, guard: Callable[[Callable], Callable], offered: list[str]) -> None:
    """Documents and a question in; the answer, its sources highlighted and the top sources out."""
    models = cv.context_models(offered)
    with gr.Row(equal_height=False):
        with gr.Column(scale=5, min_width=380):
            with gr.Row():
                model = gr.Dropdown(choices=models, value=cv.default_model(models), label="Causal LM", scale=1,
                                    allow_custom_value=not demo.cache.locked, elem_id="normx-ctx-model")
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
                ablations = gr.Number(cv.DEFAULT_ABLATIONS, precision=0, minimum=cv.MIN_ABLATIONS,
                                      elem_id="normx-ctx-ablations", label="n_ablations (contextcite)")
                answer_tokens = gr.Slider(1, cv.MAX_ANSWER_TOKENS, value=cv.DEFAULT_ANSWER_TOKENS, step=1,
                                          label="Answer tokens (greedy)", elem_id="normx-ctx-answer-tokens")
                budget = gr.Radio(list(cv.BUDGETS), value=cv.DEFAULT_BUDGET, label="Budget (budgeted)",
                                  elem_id="normx-ctx-budget")
            button = gr.Button("Answer and attribute", variant="primary", elem_id="normx-ctx-explain")
            gr.Examples(examples=cv.EXAMPLES, inputs=[context, query], label="Example (documents, question)")
        with gr.Column(scale=6, min_width=420):
            answer = gr.Markdown(label="Answer", elem_id="normx-ctx-answer")
            highlighted = gr.HTML("", label="Sources", elem_id="normx-ctx-view")
            top = gr.Markdown(label="Top sources", elem_id="normx-ctx-top")
    inputs = [model, context, query, sources, method, ablations, answer_tokens, budget]
    shown = [answer, highlighted, top]
    raw = {"preprocess": False, "show_progress_on": [answer, highlighted]}
    button.click(guard(demo.cite), inputs, shown, api_name="cite", **raw)
    query.submit(guard(demo.cite), inputs, shown, api_visibility="private", **raw)
    gr.on([method.change, context.change, sources.change, ablations.change, budget.change],  # (an example too)
          guard(cv.cost_note), [method, context, sources, ablations, budget], cost, queue=False,
          api_visibility="private", preprocess=False)
