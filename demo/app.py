"""normx Gradio demo: per-label, per-layer NormXLogit explanations as highlighted text (``python demo/app.py``,
``normx demo``; the Spaces ``app_file``). The handlers, a thin shell over :mod:`normx.serving` (tested without a
browser); the page's layout is ``normx_page.py`` next to this file.
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
sys.path.append(str(Path(__file__).resolve().parent))  # the demo's modules next to it, however it runs (by path too)

import gradio as gr
import normx_page  # the page's layout (demo/normx_page.py; normx space ships it with this file)

from normx.serving import context_view, messages, session, space, views
from normx.serving import server as serving
from normx.serving.lanes import WorkGate

DEFAULT_MODEL = "minilm-sst2"
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
             budget=context_view.DEFAULT_BUDGET, progress=gr.Progress()):  # noqa: B008
        """The Context view: the model answers, the method scores the sources (:mod:`normx.serving.context_view`)."""
        state = context_view.context_request(self.cache, model_name, context, query, sources, method, n_ablations,
                                             answer_tokens, self.gate, loading=progress, budget=budget)
        return [gr.update(value=context_view.heading(state)), gr.update(value=context_view.view_html(state)),
                gr.update(value=context_view.top_sources(state))]

    def build(self) -> gr.Blocks:
        """The page (:func:`normx_page.build`: the views' layout and which handler each event calls)."""
        return normx_page.build(self, _guard)


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


def launch_kwargs(**overrides) -> dict:
    """``Blocks.launch`` settings for an offline, never-shared server (tests use them too)."""
    return {"share": False, "show_error": True, "ssr_mode": False, "theme": normx_page.theme(), "css": views.PAGE_CSS,
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
