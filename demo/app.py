"""normx Gradio demo: per-label, per-layer NormXLogit explanations as highlighted text.

Run it with ``python demo/app.py`` (or ``normx demo``); on Hugging Face Spaces this file is the ``app_file``.

The app is a thin shell over normx's public API (``normx.load_model``, ``normx.explain`` and the
:class:`normx.Explanation` methods). Everything that turns explanations into what the page shows is a plain
function in this module, so the tests can call it without a browser:

- :class:`ModelCache`: one load per model name, thread-safe; an allow-list in locked (Spaces) mode.
- :func:`explain_request`: one request -> a state dict holding the :class:`~normx.Explanation` objects, computed
  with ``layer="all"`` once, so that the layer slider, the word / subword toggle and the contrast pickers
  re-render from that state without another forward pass (:func:`render`).
- :func:`highlights`: an explanation row -> ``gr.HighlightedText`` values scaled to [-1, 1].
- :func:`greedy_continuation`: for causal LMs, a short greedy continuation, each step's prediction explained
  from its own prefix.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no telemetry, no version check: the demo runs offline

try:
    import normx
except ImportError:  # a source checkout run as `python demo/app.py` without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import normx

import gradio as gr
import numpy as np

from normx.adapters import unwrap_model
from normx.budget import WorkGate, estimate_gflop
from normx.inputs import check_text, count_tokens

log = logging.getLogger("normx.demo")

MAX_CHARS = 2000  # per text box
MAX_TOKENS = 512  # per request (text + pair, special tokens included)
MAX_LABEL_VIEWS = 4  # highlighted views per request; models with more labels show the most probable ones
MAX_CONTINUATION = 8  # greedy continuation tokens for causal LMs
DEFAULT_CONTINUATION = 3
DEFAULT_MODEL = "minilm-sst2"
LOCKED_ENV = "NORMX_DEMO_LOCKED"  # "1": locked mode (only the allow-list loads); also on when $SPACE_ID is set
BUDGET_ENV = "NORMX_DEMO_BUDGET_GFLOP"  # the work one request may take (normx.budget); default BUDGET_GFLOP
BUDGET_GFLOP = 1500.0  # ~10 s of work on a 2-core CPU (MiniLM: Value Zeroing on ~220 tokens, IG x50 on ~450)
CONCURRENCY = 32  # requests served at once; expensive ones (normx.budget.WorkGate) one at a time among them
LOOPBACK = ("127.0.0.1", "localhost", "::1")
MODELS_ENV = "NORMX_DEMO_MODELS"  # comma-separated allow-list for locked mode (default: the presets that load)
VOCABULARY_KINDS = ("causal_lm", "masked_lm")

EXAMPLES = [
    ("minilm-sst2", "a gripping, beautifully acted film", ""),
    ("minilm-sst2", "the plot was predictable and the jokes fell flat", ""),
    ("minilm-sst2", "not bad at all, though the ending drags on", ""),
    ("minilm-mnli", "A man is playing a guitar on stage.", "A person is performing music."),
    ("minilm-mnli", "The cat is sleeping on the sofa.", "The cat is chasing a mouse."),
    ("minilm-qnli", "What instrument is the man playing?", "A man is playing a guitar on stage."),
    ("minilm-stsb", "A woman is slicing an onion.", "Someone is cutting a vegetable."),
    ("smollm2-sst2", "an utterly charming and funny story", ""),
    ("smollm2", "The capital of France is", ""),
]

# gr.HighlightedText colours scores by sign: positive red rgba(239, 68, 60, s), negative purple rgba(128, 90, 213, -s)
POSITIVE_RGB = "239, 68, 60"
NEGATIVE_RGB = "128, 90, 213"
LEGEND = (
    f'<span style="background: rgba({POSITIVE_RGB}, 0.75); padding: 1px 6px; border-radius: 4px">red (+)</span> '
    "pushes **toward** the label, "
    f'<span style="background: rgba({NEGATIVE_RGB}, 0.75); padding: 1px 6px; border-radius: 4px">purple (−)</span> '
    "pushes **away** from it; stronger colour = larger |score|. Each view is scaled to [−1, 1] by the largest "
    "|score| it shows (special tokens excluded); the scale is in the view's title."
)
CSS = """
#normx-prediction {font-size: 1.1em}
.normx-view .textfield {font-size: 1.05em; line-height: 1.9}
"""


# ---- models --------------------------------------------------------------------------------------------------------

def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def is_locked(locked: bool | None = None) -> bool:
    """Locked mode: the argument if given, else $NORMX_DEMO_LOCKED, else on when running on Spaces ($SPACE_ID)."""
    if locked is not None:
        return bool(locked)
    if os.environ.get(LOCKED_ENV) is not None:
        return _truthy(os.environ.get(LOCKED_ENV))
    return bool(os.environ.get("SPACE_ID"))


def resolve_locked(locked: bool | None, host: str | None) -> bool:
    """Whether the demo serves locked: as asked (``--locked`` / ``--unlocked``, $NORMX_DEMO_LOCKED, Spaces); if
    nothing was asked, unlocked (any folder or hub id loads) only when the server listens on loopback, since an
    unlocked page lets anyone who reaches it load files of the server's disk."""
    if locked is None and (os.environ.get(LOCKED_ENV) is not None or os.environ.get("SPACE_ID")):
        locked = is_locked()
    address = (host or "127.0.0.1").strip("[]")
    loopback = address in LOOPBACK or address.startswith("127.")
    if locked is None:
        if not loopback:
            log.warning("serving on %s, not loopback: locked mode (only the allow-list loads); pass --unlocked to "
                        "let visitors load any local folder or hub id", address)
        return not loopback
    if not locked and not loopback:
        log.warning("UNLOCKED on %s: anyone who reaches this server can make it load any model folder on its disk "
                    "or any hub id", address)
    return locked


def budget_gflop(value: float | None = None) -> float:
    """The per-request work budget: ``value``, else $NORMX_DEMO_BUDGET_GFLOP, else :data:`BUDGET_GFLOP`."""
    if value is None:
        env = os.environ.get(BUDGET_ENV)
        try:
            value = float(env) if env else BUDGET_GFLOP
        except ValueError:
            raise normx.InvalidInputError(f"${BUDGET_ENV}={env!r} is not a number of GFLOP") from None
    if not value > 0:
        raise normx.InvalidInputError(f"the work budget must be a positive number of GFLOP, got {value!r}")
    return float(value)


def available_presets() -> list[str]:
    """The offline presets that can load here: base package installed, trained adapter present (if it has one)."""
    import importlib.util

    from normx.presets import PRESETS

    out = []
    for name, preset in PRESETS.items():
        if importlib.util.find_spec(preset.package.replace("-", "_")) is None:
            continue
        if preset.recipe is not None and preset.metrics() is None:  # training writes metrics.json last
            continue
        out.append(name)
    return out


def allowed_models(models: Sequence[str] | None = None) -> list[str]:
    """The locked-mode allow-list: ``models``, else $NORMX_DEMO_MODELS, else the presets that can load here."""
    if models is None:
        env = os.environ.get(MODELS_ENV, "")
        models = [m.strip() for m in env.split(",") if m.strip()] or available_presets()
    return list(dict.fromkeys(models))


class ModelCache:
    """``(model, tokenizer)`` per model name, loaded once with ``loader`` (``normx.load_model``) and kept.

    In locked mode only names in ``allowed`` load. At most ``max_models`` stay loaded (least recently used goes
    first). Failures are not cached: a fixed folder loads on retry. Loads of different models run in parallel;
    two requests for the same model wait for one load.
    """

    def __init__(self, loader: Callable | None = None, *, locked: bool = False, allowed: Sequence[str] = (),
                 max_models: int = 6):
        self.loader = loader
        self.locked = locked
        self.allowed = list(allowed)
        self.max_models = max_models
        self.loads: dict[str, int] = {}  # name -> number of loads (tests check that it stays 1)
        self._models: OrderedDict[str, tuple] = OrderedDict()
        self._lock = threading.Lock()  # guards the dicts
        self._loading: dict[str, threading.Lock] = {}  # one lock per name, held while that model loads

    def peek(self, name: str):
        """``(model, tokenizer)`` if ``name`` is loaded, else None (never loads)."""
        with self._lock:
            return self._models.get((name or "").strip())

    def put(self, name: str, model, tokenizer) -> None:
        """Register an already loaded model under ``name`` (tests, or a host app that loads its own)."""
        with self._lock:
            self._models[name] = (model, tokenizer)

    def check(self, name: str) -> str:
        name = (name or "").strip()
        if not name:
            raise normx.ModelLoadError("no model chosen: pick a preset or give a model folder")
        if self.locked and name not in self.allowed and name not in self._models:
            raise normx.ModelLoadError(f"model {name!r} is not available in this demo; choose one of: "
                                       f"{', '.join(self.allowed)}")
        return name

    def get(self, name: str):
        name = self.check(name)
        with self._lock:
            if name in self._models:
                self._models.move_to_end(name)
                return self._models[name]
            loading = self._loading.setdefault(name, threading.Lock())
        with loading:
            with self._lock:
                if name in self._models:  # loaded by the request we waited for
                    return self._models[name]
            log.info("loading model %s", name)
            loaded = (self.loader or normx.load_model)(name)
            with self._lock:
                self._models[name] = loaded
                self.loads[name] = self.loads.get(name, 0) + 1
                while len(self._models) > self.max_models:
                    self._models.popitem(last=False)
            return loaded


def preset_info(name: str) -> dict:
    """What the page needs to know about a model name before loading it: inputs (single / pair / unknown), task."""
    from normx.presets import PRESETS

    preset = PRESETS.get((name or "").strip())
    if preset is None:
        return {"inputs": "unknown", "task": "unknown", "description": ""}
    return {"inputs": preset.inputs, "task": preset.task, "description": preset.description}


# ---- pure view functions -------------------------------------------------------------------------------------------

def layer_spec(method: str):
    """``"all"`` for methods with per-layer scores, ``None`` for those without (gradients: layer 0 only)."""
    from normx.methods import get_method

    return "all" if get_method(method).layered else None


def default_compare_methods(methods: Sequence[str]) -> list[str]:
    """The compare tab's default picks: the label-dependent methods that cost at most two forward passes (what
    each method says of itself: NormXLogit, LogAt and the plain gradients)."""
    from normx.methods import get_method

    return [m for m in methods if get_method(m).label_dependent and get_method(m).passes(64) <= 2] or list(methods[:2])


def unit_view(explanation: normx.Explanation, unit: str = "word", show_special: bool = False) -> normx.Explanation:
    """The explanation at word or subword-token level, with or without special tokens (no recomputation)."""
    view = explanation.words("sum") if unit == "word" and explanation.unit == "token" else explanation
    return view if show_special else view.without_special()


def nearest_layer(explanation: normx.Explanation, layer: int | None) -> int:
    """``layer`` if the explanation has it, else its closest computed layer (gradient methods have only 0)."""
    if layer is None or not explanation.layers:
        return explanation.layers[-1]
    return min(explanation.layers, key=lambda computed: (abs(computed - int(layer)), computed))


def scale_of(view: normx.Explanation, rows: Sequence[np.ndarray]) -> float:
    """The largest finite |score| among the view's non-special units over ``rows`` (0 if none)."""
    keep = [i for i, special in enumerate(view.special) if not special] or list(range(len(view.tokens)))
    values = [np.abs(np.asarray(row, dtype=np.float64)[keep]) for row in rows if len(keep)]
    values = [v[np.isfinite(v)] for v in values]
    return float(max((v.max() for v in values if v.size), default=0.0))


def highlights(view: normx.Explanation, values: np.ndarray,
               scale: float | None = None) -> list[tuple[str, float | None]]:
    """``gr.HighlightedText`` value: one ``(text, score)`` per unit, score in [-1, 1] (``None``: not scored).

    Unit texts come from the input through the character offsets, so the page shows the text as typed (subwords
    adjacent, original spacing and line breaks between units); special tokens show as their token string; the
    second text of a pair follows a `` ‖ `` separator. ``scale`` defaults to :func:`scale_of` the row.
    """
    values = np.asarray(values, dtype=np.float64)
    if scale is None:
        scale = scale_of(view, [values])
    texts = {0: view.text, 1: view.text_pair}
    out: list[tuple[str, float | None]] = []
    previous: tuple[int, int] | None = None  # (segment, end offset) of the last unit shown from a text
    for i, token in enumerate(view.tokens):
        value = values[i]
        score = None if not math.isfinite(value) else (0.0 if scale <= 0 else max(-1.0, min(1.0, float(value / scale))))
        start, end = view.offsets[i]
        segment = view.segments[i]
        source = texts.get(segment)
        if view.special[i] or source is None or end <= start:
            piece = token if not out else " " + token
            out.append((piece, None if score is None else round(float(score), 4)))
            previous = None
            continue
        if previous is not None and previous[0] == segment:
            gap = source[previous[1]:start]
            if gap:
                out.append((gap, None))
        elif out:
            out.append((" ‖ " if previous is not None else " ", None))
        out.append((source[start:end], None if score is None else round(float(score), 4)))
        previous = (segment, end)
    return out


def display_token(tokenizer, token: str) -> str:
    """A vocabulary token as text (``"ĠParis"`` -> ``"' Paris'"``)."""
    try:
        text = tokenizer.convert_tokens_to_string([token])
    except Exception:  # some tokenizers cannot convert a lone token
        text = token
    return repr(text)


def probabilities(explanation: normx.Explanation, tokenizer=None) -> dict[str, float]:
    """``gr.Label`` value: label -> probability (vocabulary heads: the top tokens, shown as text); {} for regression."""
    if explanation.vocabulary and tokenizer is not None:
        return {display_token(tokenizer, k): float(v) for k, v in explanation.probabilities.items()}
    return {str(k): float(v) for k, v in explanation.probabilities.items()}


def markdown_text(text: str) -> str:
    """``text`` shown literally inside Markdown: special characters escaped, line breaks as ⏎."""
    text = re.sub(r"([\\`*_{}\[\]<>()#+\-.!|~])", r"\\\1", text)
    return text.replace("\r\n", "⏎").replace("\n", "⏎").replace("\r", "⏎")


def prediction_text(explanation: normx.Explanation, tokenizer=None) -> str:
    """A one-paragraph Markdown summary of the prediction."""
    pred = explanation.prediction
    if explanation.regression or isinstance(pred, float):
        return f"**Predicted score:** {float(pred):.3f} (regression)"
    prob = explanation.probabilities.get(pred)
    p = "" if prob is None else f" (p = {prob:.3f})"
    if explanation.vocabulary:
        shown = display_token(tokenizer, pred) if tokenizer is not None else repr(pred)
        what = "masked token" if explanation.kind == "masked_lm" else "next token"
        return f"**Predicted {what}:** `{shown}`{p}"
    return f"**Prediction:** {markdown_text(str(pred))}{p}"


def label_order(explanation: normx.Explanation, limit: int = MAX_LABEL_VIEWS) -> list[str]:
    """The labels to show: the model's own order, or the most probable ``limit`` when there are more."""
    labels = list(explanation.labels)
    if len(labels) <= limit:
        return labels
    ranked = sorted(labels, key=lambda label: -explanation.probabilities.get(label, -1.0))
    return [label for label in labels if label in ranked[:limit]]


def label_title(explanation: normx.Explanation, label: str, tokenizer=None) -> str:
    if explanation.regression:
        return f"score (regression: predicted {float(explanation.prediction):.3f})"
    name = display_token(tokenizer, label) if explanation.vocabulary and tokenizer \
        else label
    prob = explanation.probabilities.get(label)
    tags = ["predicted"] if label == explanation.prediction else []
    if prob is not None:
        tags.append(f"p = {prob:.3f}")
    return f"{name}" + (f" ({', '.join(tags)})" if tags else "")


def label_views(explanation: normx.Explanation, layer: int | None, unit: str = "word", show_special: bool = False,
                tokenizer=None) -> list[tuple[str, list]]:
    """One ``(title, highlighted)`` per label to show, all on a common scale so that labels compare."""
    view = unit_view(explanation, unit, show_special)
    at = nearest_layer(view, layer)
    labels = label_order(view)
    rows = [view.token_scores(label, at) for label in labels]
    scale = scale_of(view, rows)
    layer_note = f"layer {at}" if view.settings.get("layer") is not None or len(view.layers) > 1 else "input"
    return [(f"{label_title(view, label, tokenizer)} · {layer_note} · scale {scale:.3g}", highlights(view, row, scale))
            for label, row in zip(labels, rows)]


def contrast_view(explanation: normx.Explanation, a: str, b: str, layer: int | None, unit: str = "word",
                  show_special: bool = False, tokenizer=None) -> tuple[str, list]:
    """``score(a) − score(b)`` at ``layer``: what pushes toward ``a`` rather than ``b`` (red) and the reverse.

    For the linear methods (normxlogit, logat, gradients) this equals ``normx.explain(..., target=a, foil=b)``.
    """
    view = unit_view(explanation, unit, show_special)
    at = nearest_layer(view, layer)
    row = view.token_scores(a, at) - view.token_scores(b, at)
    scale = scale_of(view, [row])
    vocab = view.vocabulary and tokenizer is not None
    name_a = display_token(tokenizer, a) if vocab else a
    name_b = display_token(tokenizer, b) if vocab else b
    return f"{name_a} vs {name_b} (red: toward {name_a}, purple: toward {name_b}) · layer {at} · scale {scale:.3g}", \
        highlights(view, row, scale)


# ---- computing explanations ----------------------------------------------------------------------------------------

def check_inputs(text: str, pair: str | None, tokenizer) -> tuple[str, str | None]:
    """The text and pair (``None`` if empty) after the demo's caps; raises :class:`normx.InvalidInputError`."""
    text = text or ""
    pair = (pair or "").strip() or None
    for name, value in (("text", text), ("second text", pair)):
        if value is not None and len(value) > MAX_CHARS:
            raise normx.InputTooLongError(f"the {name} has {len(value)} characters; this demo takes at most "
                                          f"{MAX_CHARS} per box")
        if value is not None or name == "text":
            check_text(value, f"the {name}")
    count = count_tokens(tokenizer, text, pair)
    if count > MAX_TOKENS:
        raise normx.InputTooLongError(f"the input has {count} tokens; this demo takes at most {MAX_TOKENS}")
    return text, pair


def gated(gate: WorkGate | None, model, method: str, tokens: int, fn, *, targets: int = 1, steps: int = 1):
    """``fn()`` through the work gate: refused with a clear message when over the budget, queued behind other
    expensive requests when expensive, at once when cheap. ``steps`` explanations of ``tokens`` (+ the steps'
    tokens) each."""
    if gate is None:
        return fn()
    gflop = estimate_gflop(model, method, tokens + steps - 1, targets=targets, texts=steps)
    what = f"{method} on {tokens} tokens" + (f" x {steps} steps" if steps > 1 else "") + \
        (f" for {targets} labels" if targets > 1 else "")
    return gate.run(gflop, fn, what)


def greedy_continuation(model, tokenizer, text: str, method: str = "normxlogit", steps: int = DEFAULT_CONTINUATION,
                        layer="all") -> tuple[list[tuple[str, normx.Explanation]], str]:
    """Greedy-continue ``text`` by ``steps`` tokens, explaining each token's prediction from its own prefix.

    Returns ``([(prefix, explanation), ...], continuation)``: step k explains the k+1-th greedy token, predicted
    after ``text`` plus the k tokens before it; ``continuation`` is the decoded text of all predicted tokens.
    Each prediction is the model's own argmax (``explanation.prediction``), so the loop is greedy decoding with
    one ``normx.explain`` call per token (one forward pass; gradient methods: their backward passes too). It
    stops early after the end-of-sequence token.
    """
    runs, ids = [], []
    prefix = text
    for _ in range(max(1, int(steps))):
        explanation = normx.explain(model, tokenizer, prefix, method=method, layer=layer, truncation="error")
        runs.append((prefix, explanation))
        ids.append(tokenizer.convert_tokens_to_ids(explanation.prediction))
        if ids[-1] == tokenizer.eos_token_id:
            break
        prefix = text + tokenizer.decode(ids)  # the whole continuation at once: multi-byte characters decode whole
    return runs, tokenizer.decode(ids)


def explain_request(cache: ModelCache, model_name: str, text: str, pair: str | None = None,
                    method: str = "normxlogit", steps: int = DEFAULT_CONTINUATION, gate: WorkGate | None = None
                    ) -> dict:
    """Everything one request computes, as the state the page keeps: explanations of all layers and labels.

    Classifiers: one explanation with ``target="all"`` (every label) and ``layer="all"``. Vocabulary heads
    (causal / masked LM): one explanation per greedy step of the predicted token (masked LM: the mask token).
    ``gate``: the server's :class:`normx.budget.WorkGate` (None: no budget).
    """
    if method not in normx.list_methods():
        raise normx.UnknownMethodError(f"unknown method {method!r}; available: {', '.join(normx.list_methods())}")
    model, tokenizer = cache.get(model_name)
    text, pair = check_inputs(text, pair, tokenizer)
    tokens = count_tokens(tokenizer, text, pair)
    kind = normx.get_adapter(model).kind
    layer = layer_spec(method)
    if kind == "causal_lm":
        if pair is not None:
            raise normx.PairNotSupportedError("a causal LM continues one text: clear the second text box")
        steps = min(max(1, int(steps or 1)), MAX_CONTINUATION)
        runs, continuation = gated(gate, model, method, tokens, lambda: greedy_continuation(
            model, tokenizer, text, method, steps, layer), steps=steps)
    else:
        target = None if kind in VOCABULARY_KINDS else "all"
        labels = 1 if target is None else max(1, int(getattr(unwrap_model(model).config, "num_labels", 1)))
        explanation = gated(gate, model, method, tokens, lambda: normx.explain(
            model, tokenizer, text, method=method, target=target, layer=layer, text_pair=pair, truncation="error"),
            targets=labels)
        runs, continuation = [(text, explanation)], None
    return {"model": model_name, "method": method, "kind": kind, "pair": pair,
            "prefixes": [p for p, _ in runs], "steps": [e for _, e in runs],
            "continuation": continuation, "compare": {i: {method: e} for i, (_, e) in enumerate(runs)},
            "contrast": {}}


def step_choices(state: dict, tokenizer=None) -> list[tuple[str, int]]:
    """Radio choices for a causal LM's steps: ``"1: ' Paris'"``, one per explained prediction."""
    out = []
    for i, explanation in enumerate(state["steps"]):
        token = display_token(tokenizer, explanation.prediction) if tokenizer is not None else explanation.prediction
        out.append((f"{i + 1}: {token}", i))
    return out


def contrast_choices(explanation: normx.Explanation, tokenizer=None) -> list[tuple[str, str]]:
    """Labels the contrast view can pick: a classifier's labels, or a vocabulary head's top tokens."""
    if explanation.regression:
        return []
    if explanation.vocabulary:
        names = list(dict.fromkeys([explanation.prediction, *explanation.probabilities]))
        return [(display_token(tokenizer, n) if tokenizer is not None else n, n) for n in names]
    return [(label, label) for label in explanation.labels]


def default_contrast(explanation: normx.Explanation) -> tuple[str | None, str | None]:
    """The predicted label against the most probable other one."""
    if explanation.regression or len(explanation.probabilities) < 2:
        return None, None
    others = sorted((k for k in explanation.probabilities if k != explanation.prediction),
                    key=lambda k: -explanation.probabilities[k])
    return explanation.prediction, others[0]


def ensure_contrast(state: dict, cache: ModelCache, step: int, a: str | None, b: str | None,
                    gate: WorkGate | None = None) -> normx.Explanation | None:
    """An explanation holding labels ``a`` and ``b`` at every layer for ``step``: the step's own for classifiers;
    for vocabulary heads one ``normx.explain(target=[a, b])`` call, kept in the state."""
    if not a or not b or a == b or not state.get("steps"):
        return None
    explanation = state["steps"][step]
    if a in explanation.labels and b in explanation.labels:
        return explanation
    if not explanation.vocabulary:
        return None
    key = (step, a, b)
    if key not in state["contrast"]:
        model, tokenizer = cache.get(state["model"])
        prefix = state["prefixes"][step]
        state["contrast"][key] = gated(
            gate, model, state["method"], count_tokens(tokenizer, prefix), lambda: normx.explain(
                model, tokenizer, prefix, method=state["method"], target=[a, b], layer=layer_spec(state["method"]),
                truncation="error"), targets=2)
    return state["contrast"][key]


def compare_request(state: dict, cache: ModelCache, methods: Sequence[str], step: int = 0,
                    gate: WorkGate | None = None) -> list[str]:
    """Explain the same input and label (the prediction) with each of ``methods`` (all layers), kept in the state.

    Returns the error messages of methods that failed for this model (they are left out; the others show).
    """
    errors = []
    explanation = state["steps"][step]
    model, tokenizer = cache.get(state["model"])
    done = state["compare"].setdefault(step, {})
    target = None if explanation.regression else explanation.prediction
    prefix, pair = state["prefixes"][step], state["pair"]
    tokens = count_tokens(tokenizer, prefix, pair)
    for method in methods:
        if method in done:
            continue
        if method == state["method"]:
            done[method] = explanation  # already computed: the main request's method
            continue
        try:
            done[method] = gated(gate, model, method, tokens, lambda method=method: normx.explain(
                model, tokenizer, prefix, method=method, target=target, layer=layer_spec(method), text_pair=pair,
                truncation="error"))
        except normx.NormxError as exc:
            errors.append(f"{method}: {exc}")
    return errors


def compare_views(state: dict | None, methods: Sequence[str], layer: int | None, unit: str = "word",
                  show_special: bool = False, step: int = 0, tokenizer=None) -> dict[str, tuple[str, list]]:
    """``{method: (title, highlighted)}`` for the compared methods computed for ``step``, each on its own scale."""
    out = {}
    if not state or not state.get("steps"):
        return out
    done = state["compare"].get(step, {})
    for method in methods:
        if method not in done:
            continue
        explanation = done[method]
        view = unit_view(explanation, unit, show_special)
        at = nearest_layer(view, layer)
        label = view.prediction if view.prediction in view.labels else view.labels[0]
        row = view.token_scores(label, at)
        scale = scale_of(view, [row])
        where = f"layer {at}" if len(view.layers) > 1 else "input embeddings (no per-layer scores)"
        title = label_title(view, label, tokenizer)
        out[method] = (f"{method} · {title} · {where} · scale {scale:.3g}", highlights(view, row, scale))
    return out


# ---- the page ------------------------------------------------------------------------------------------------------

def _message(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


def _guard(fn):
    """Every handler: user errors become a message in the page (gr.Error), never a dead app."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except normx.NormxError as exc:
            raise gr.Error(_message(exc), print_exception=False) from None
        except Exception as exc:  # anything else: show it, log it, keep serving
            log.exception("demo handler failed")
            raise gr.Error(f"{type(exc).__name__}: {_message(exc)}") from None

    return wrapper


class Demo:
    """The handlers, bound to one model cache. ``build()`` makes the ``gr.Blocks``."""

    def __init__(self, cache: ModelCache, methods: Sequence[str] | None = None, default_model: str = DEFAULT_MODEL,
                 gate: WorkGate | None = None):
        self.cache = cache
        self.gate = gate if gate is not None else WorkGate(budget_gflop())
        self.methods = list(methods if methods is not None else normx.list_methods())
        self.default_model = default_model

    # handlers: plain functions of component values -> component updates -----------------------------------------
    def on_model_change(self, name: str):
        """Show the second text box and the continuation slider when the (preset) model takes them."""
        info = preset_info(name)
        pair_visible = info["inputs"] != "single" and info["task"] != "causal-lm"
        pair = gr.update(visible=pair_visible) if pair_visible else gr.update(visible=False, value="")
        steps = gr.update(visible=info["task"] in ("causal-lm", "unknown"))
        note = info["description"] or ("a local folder, PEFT adapter folder or hub id" if not self.cache.locked
                                        else "")
        return pair, steps, gr.update(value=f"*{note}*" if note else ""), *self._method_pickers(name)

    def _method_pickers(self, name: str) -> tuple:
        """The method picker and the compare choices: only the methods the model supports, once it is loaded."""
        loaded = self.cache.peek(name)
        if loaded is None:
            return gr.update(), gr.update()
        usable = [m for m in self.methods if m in normx.methods.methods_for(loaded[0])]
        return gr.update(choices=usable), gr.update(choices=usable)

    def on_method_change(self, method: str):
        return gr.update(value=f"*{normx.describe_methods().get(method, '')}*")

    def explain(self, model_name, text, pair, method, steps, unit, show_special, compare_methods):
        state = explain_request(self.cache, model_name, text, pair, method, steps, self.gate)
        first = state["steps"][0]
        _, tokenizer = self.cache.get(model_name)
        for warning in first.warnings:
            gr.Warning(warning)
        num_layers = max(first.layers)
        layered = len(first.layers) > 1
        slider = gr.update(maximum=max(num_layers, 1), value=num_layers, interactive=layered,
                           info=f"0 = embedding output … {num_layers} = last block" if layered
                           else f"{method} has no per-layer scores (input embeddings only)")
        vocab = state["kind"] in VOCABULARY_KINDS
        step_radio = gr.update(choices=step_choices(state, tokenizer), value=0, visible=state["kind"] == "causal_lm")
        a, b = default_contrast(first)
        contrast_a, contrast_b = self._contrast_pickers(first, tokenizer, a, b)
        if vocab and a and b:
            ensure_contrast(state, self.cache, 0, a, b, self.gate)
        rendered = self.render(state, num_layers, unit, show_special, 0, a, b, compare_methods)
        return [state, slider, step_radio, contrast_a, contrast_b, *rendered, *self._method_pickers(model_name)]

    def on_step(self, state, layer, unit, show_special, step, compare_methods):
        """A causal LM's step picked: new contrast pickers (its top tokens) and a re-render; no new explanation
        except the step's default contrast (vocabulary heads) the first time."""
        if not state:
            return [state, gr.update(), gr.update(), *self.render(state, layer, unit, show_special, 0, None, None,
                                                                  compare_methods)]
        step = int(step or 0)
        explanation = state["steps"][step]
        _, tokenizer = self.cache.get(state["model"])
        a, b = default_contrast(explanation)
        ensure_contrast(state, self.cache, step, a, b, self.gate)
        contrast_a, contrast_b = self._contrast_pickers(explanation, tokenizer, a, b)
        return [state, contrast_a, contrast_b, *self.render(state, layer, unit, show_special, step, a, b,
                                                            compare_methods)]

    def on_contrast(self, state, layer, unit, show_special, step, a, b, compare_methods):
        if state:
            ensure_contrast(state, self.cache, int(step or 0), a, b, self.gate)
        return [state, *self.render(state, layer, unit, show_special, step, a, b, compare_methods)]

    def on_compare(self, state, layer, unit, show_special, step, a, b, compare_methods):
        if not state:
            raise gr.Error("explain a text first, then compare methods on it")
        errors = compare_request(state, self.cache, list(compare_methods or []), int(step or 0), self.gate)
        for error in errors:
            gr.Warning(error)
        return [state, *self.render(state, layer, unit, show_special, step, a, b, compare_methods)]

    def render(self, state, layer, unit, show_special, step, a, b, compare_methods) -> list:
        """Every view from the state: prediction, probabilities, per-label views, contrast, compared methods.

        Never calls ``normx.explain``: the layer slider and the word / subword toggle land here only.
        """
        hidden = gr.update(value=None, visible=False)
        if not state or not state.get("steps"):
            return [gr.update(value=""), gr.update(value=None), *[hidden] * MAX_LABEL_VIEWS, hidden,
                    *[hidden] * len(self.methods)]
        step = min(int(step or 0), len(state["steps"]) - 1)
        layer = None if layer is None else int(layer)
        explanation = state["steps"][step]
        _, tokenizer = self.cache.get(state["model"])
        head = prediction_text(explanation, tokenizer)
        if state["kind"] == "causal_lm":
            head = (f"**Greedy continuation:** {markdown_text(state['prefixes'][0])}"
                    f"**{markdown_text(state['continuation'])}**  \n"
                    f"Step {step + 1} of {len(state['steps'])}: {head} after "
                    f"“{markdown_text(state['prefixes'][step])}”")
        probs = probabilities(explanation, tokenizer)
        views = label_views(explanation, layer, unit, show_special, tokenizer)
        label_updates = [gr.update(value=value, label=title, visible=True) for title, value in views]
        label_updates += [hidden] * (MAX_LABEL_VIEWS - len(label_updates))
        source = None
        if a and b and a != b:
            source = explanation if a in explanation.labels and b in explanation.labels \
                else state["contrast"].get((step, a, b))
        if source is not None:
            title, value = contrast_view(source, a, b, layer, unit, show_special, tokenizer)
            contrast = gr.update(value=value, label=title, visible=True)
        else:
            contrast = gr.update(value=None, label="contrast: pick two different labels", visible=True) \
                if not explanation.regression else hidden
        compared = compare_views(state, list(compare_methods or []), layer, unit, show_special, step, tokenizer)
        compare_updates = [gr.update(value=compared[m][1], label=compared[m][0], visible=True) if m in compared
                           else hidden for m in self.methods]
        return [gr.update(value=head), gr.update(value=probs or None, visible=bool(probs)), *label_updates,
                contrast, *compare_updates]

    def _contrast_pickers(self, explanation, tokenizer, a, b):
        choices = contrast_choices(explanation, tokenizer)
        visible = bool(choices)
        return (gr.update(choices=choices, value=a, visible=visible),
                gr.update(choices=choices, value=b, visible=visible))

    # the page ----------------------------------------------------------------------------------------------------
    def build(self) -> gr.Blocks:
        locked = self.cache.locked
        presets = normx.list_presets()
        choices = [m for m in (self.cache.allowed if locked else presets)]
        if self.default_model not in choices:
            choices = [self.default_model, *choices]
        examples = [list(e) for e in EXAMPLES if not locked or e[0] in self.cache.allowed]
        info = preset_info(self.default_model)
        default_compare = default_compare_methods(self.methods)

        with gr.Blocks(title="normx: NormXLogit explanations", analytics_enabled=False) as blocks:
            gr.Markdown(
                "# normx · NormXLogit token attributions\n"
                "Which words push a transformer's prediction toward each label? NormXLogit runs the model's own "
                "head on every token (one forward pass, no gradients) and weighs it by the token's input norm "
                "(Abbasi et al., EMNLP 2025).")
            state = gr.State(None)
            with gr.Row(equal_height=False):
                with gr.Column(scale=5, min_width=380):
                    with gr.Row():
                        model = gr.Dropdown(choices=choices, value=self.default_model, label="Model",
                                            allow_custom_value=not locked, scale=3, elem_id="normx-model",
                                            info="an offline preset" + ("" if locked else
                                                                       ", a local folder, an adapter or a hub id"))
                        method = gr.Dropdown(choices=self.methods, value="normxlogit" if "normxlogit" in self.methods
                                             else self.methods[0], label="Method", scale=2, elem_id="normx-method")
                    model_note = gr.Markdown(f"*{info['description']}*" if info["description"] else "")
                    method_note = gr.Markdown(f"*{normx.describe_methods().get('normxlogit', '')}*")
                    text = gr.Textbox(label="Text", lines=2, max_length=MAX_CHARS, elem_id="normx-text",
                                      placeholder="A sentence (the premise for sentence-pair models, a prompt for LMs)")
                    pair = gr.Textbox(label="Second text", info="sentence-pair models (NLI, STS-B): the hypothesis "
                                      "or second sentence", lines=1, max_length=MAX_CHARS, elem_id="normx-pair",
                                      visible=info["inputs"] != "single" and info["task"] != "causal-lm")
                    steps = gr.Slider(1, MAX_CONTINUATION, value=DEFAULT_CONTINUATION, step=1,
                                      label="Tokens to generate and explain (causal LMs)",
                                      visible=info["task"] in ("causal-lm", "unknown"))
                    button = gr.Button("Explain", variant="primary", elem_id="normx-explain")
                    if examples:
                        gr.Examples(examples=examples, inputs=[model, text, pair], cache_examples=False,
                                    label="Examples (model, text, second text)", examples_per_page=8)
                with gr.Column(scale=6, min_width=420):
                    prediction = gr.Markdown(elem_id="normx-prediction")
                    probs = gr.Label(label="Probabilities", num_top_classes=6, visible=False, show_heading=False,
                                     elem_id="normx-probabilities")
                    with gr.Row():
                        layer = gr.Slider(0, 1, value=1, step=1, label="Layer", elem_id="normx-layer", scale=3,
                                          info="every layer comes from the same forward pass: moving this does "
                                               "not recompute")
                        unit = gr.Radio(["word", "subword"], value="word", label="Units", elem_id="normx-unit",
                                        scale=2)
                        show_special = gr.Checkbox(value=False, label="Special tokens", scale=1, min_width=100)
                    step = gr.Radio(choices=[], value=None, label="Explained prediction (greedy step)",
                                    visible=False, elem_id="normx-step")
                    gr.Markdown(LEGEND)
                    with gr.Tabs():
                        with gr.Tab("Per label"):
                            label_boxes = [gr.HighlightedText(label=f"label {i + 1}", show_legend=True,
                                                              visible=False, combine_adjacent=False,
                                                              elem_classes="normx-view", elem_id=f"normx-label-{i}")
                                           for i in range(MAX_LABEL_VIEWS)]
                        with gr.Tab("Contrast"):
                            with gr.Row():
                                contrast_a = gr.Dropdown(choices=[], label="Label A (red)", elem_id="normx-contrast-a")
                                contrast_b = gr.Dropdown(choices=[], label="Label B (purple)",
                                                         elem_id="normx-contrast-b")
                            contrast = gr.HighlightedText(label="contrast", show_legend=True, visible=True,
                                                          elem_classes="normx-view", elem_id="normx-contrast")
                        with gr.Tab("Compare methods"):
                            with gr.Row():
                                compare_methods = gr.CheckboxGroup(self.methods, value=default_compare,
                                                                   label="Methods (same input, the predicted label)")
                                compare_button = gr.Button("Compare", scale=0, min_width=120,
                                                           elem_id="normx-compare")
                            compare_boxes = [gr.HighlightedText(label=m, show_legend=True, visible=False,
                                                                elem_classes="normx-view",
                                                                elem_id=f"normx-compare-{m}")
                                             for m in self.methods]

            views = [prediction, probs, *label_boxes, contrast, *compare_boxes]
            view_inputs = [state, layer, unit, show_special, step]
            compare_inputs = [*view_inputs, contrast_a, contrast_b, compare_methods]

            model.change(_guard(self.on_model_change), model, [pair, steps, model_note, method, compare_methods],
                         queue=False,
                         api_visibility="private")
            method.change(_guard(self.on_method_change), method, method_note, queue=False, api_visibility="private")
            explain_inputs = [model, text, pair, method, steps, unit, show_special, compare_methods]
            explain_outputs = [state, layer, step, contrast_a, contrast_b, *views, method, compare_methods]
            button.click(_guard(self.explain), explain_inputs, explain_outputs, api_name="explain")
            text.submit(_guard(self.explain), explain_inputs, explain_outputs, api_visibility="private")
            # the slider, the toggles and the compare picks re-render from the state (no forward pass)
            rerender = _guard(lambda s, la, u, sp, st, a, b, cm: self.render(s, la, u, sp, st, a, b, cm))
            for control in (layer, unit, show_special, compare_methods):
                control.input(rerender, compare_inputs, views, api_visibility="private", concurrency_limit=None)
            layer.release(rerender, compare_inputs, views, api_name="render", concurrency_limit=None)
            step.input(_guard(self.on_step), [*view_inputs, compare_methods], [state, contrast_a, contrast_b, *views],
                       api_visibility="private")
            for picker in (contrast_a, contrast_b):
                picker.input(_guard(self.on_contrast), compare_inputs, [state, *views], api_visibility="private")
            compare_button.click(_guard(self.on_compare), compare_inputs, [state, *views], api_name="compare")
        # requests run concurrently (normx.explain is thread-safe); the work gate runs expensive ones one at a time
        blocks.queue(default_concurrency_limit=CONCURRENCY, max_size=64)
        return blocks


def build_demo(locked: bool | None = None, models: Sequence[str] | None = None, default_model: str | None = None,
               cache: ModelCache | None = None, methods: Sequence[str] | None = None,
               budget: float | None = None) -> gr.Blocks:
    """The demo page, queued. ``locked`` (default: :func:`is_locked`): only ``models`` load (default:
    :func:`allowed_models`).

    ``cache``: share a :class:`ModelCache` (tests pass one they filled with :meth:`ModelCache.put`).
    ``methods``: the method picker's choices; default ``normx.list_methods()`` at build time.
    ``budget``: the work one request may take, in GFLOP (default: :func:`budget_gflop`).
    """
    locked = is_locked(locked)
    allowed = allowed_models(models)
    if cache is None:
        cache = ModelCache(locked=locked, allowed=allowed)
    default = _default_model(default_model, locked, allowed)
    return Demo(cache, methods, default, WorkGate(budget_gflop(budget))).build()


def _default_model(given: str | None, locked: bool, allowed: Sequence[str]) -> str:
    if given:
        return given
    return allowed[0] if locked and allowed and DEFAULT_MODEL not in allowed else DEFAULT_MODEL


def theme() -> gr.themes.Base:
    """The default theme with system fonts: no Google Fonts request, so the page renders offline."""
    return gr.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"],
                             font_mono=["ui-monospace", "SFMono-Regular", "monospace"])


def launch_kwargs(**overrides) -> dict:
    """``Blocks.launch`` settings for an offline, never-shared server (tests use them too)."""
    kwargs = {"share": False, "show_error": True, "ssr_mode": False, "theme": theme(), "css": CSS,
              "mcp_server": False, "footer_links": ["api", "settings"]}
    kwargs.update(overrides)
    return kwargs


def launch(host: str | None = None, port: int | None = None, locked: bool | None = None,
           models: Sequence[str] | None = None, default_model: str | None = None, budget: float | None = None,
           **overrides):
    """Build and serve the demo (blocks until stopped). Host / port default to $GRADIO_SERVER_NAME / _PORT;
    ``locked`` to :func:`resolve_locked` (unlocked on loopback only)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    host = host or os.environ.get("GRADIO_SERVER_NAME") or "127.0.0.1"
    locked = resolve_locked(locked, host)
    allowed = allowed_models(models)
    cache = ModelCache(locked=locked, allowed=allowed)
    demo = build_demo(locked=locked, models=allowed, default_model=default_model, cache=cache, budget=budget)
    default = _default_model(default_model, locked, allowed)
    threading.Thread(target=_preload, args=(cache, default), daemon=True).start()  # the first request is quicker
    return demo.launch(**launch_kwargs(server_name=host, server_port=port, **overrides))


def _preload(cache: ModelCache, name: str) -> None:
    try:
        cache.get(name)
    except Exception as exc:  # shown again, as a message, when a request asks for it
        log.warning("could not preload %s: %s", name, exc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="normx demo", description="Serve the normx Gradio demo.")
    parser.add_argument("--host", default=None, help="interface to bind (default 127.0.0.1; $GRADIO_SERVER_NAME)")
    parser.add_argument("--port", type=_port, default=None, help="port, 1..65535 (default 7860; $GRADIO_SERVER_PORT)")
    parser.add_argument("--model", default=None, help=f"the model selected at start (default {DEFAULT_MODEL})")
    lock = parser.add_mutually_exclusive_group()
    lock.add_argument("--locked", action="store_true", default=None,
                      help=f"only the allow-list loads (${MODELS_ENV}, default: the presets installed and trained); "
                           f"also ${LOCKED_ENV}=1. The default when the host is not loopback")
    lock.add_argument("--unlocked", dest="locked", action="store_false",
                      help="let visitors load any local folder or hub id, also on a non-loopback host (a warning says "
                           "so); the default on loopback only")
    parser.add_argument("--models", default=None, help="comma-separated allow-list for --locked")
    parser.add_argument("--budget-gflop", type=float, default=None,
                        help=f"work one request may take (default {BUDGET_GFLOP:g}, ~10 s on a 2-core CPU; "
                             f"${BUDGET_ENV})")
    args = parser.parse_args(argv)
    if args.budget_gflop is not None and not args.budget_gflop > 0:
        parser.error(f"--budget-gflop must be positive, got {args.budget_gflop}")
    models = None if args.models is None else [m.strip() for m in args.models.split(",") if m.strip()]
    launch(args.host, args.port, locked=args.locked, models=models, default_model=args.model,
           budget=args.budget_gflop)
    return 0


def _port(value: str) -> int:
    if not value.strip().isdigit() or not 1 <= int(value) <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port: use a number in 1..65535")
    return int(value)


if __name__ == "__main__":
    raise SystemExit(main())
