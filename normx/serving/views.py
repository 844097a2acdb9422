"""What a page shows of explanations: highlighted views (each unit's text and score, the view's
:class:`~normx.explanations.display.Scale`), titles, contrast and comparison views, the prediction as Markdown, and
the HTML the page draws them as. Plain functions of :class:`~normx.Explanation` objects and a
:class:`~normx.serving.session.PageState`, returning plain data (no web framework): the demo wraps them in components,
and the tests call them directly. Colours, scales and legends are the shared colour language of
:mod:`normx.explanations.display` (the notebook views, reports and terminal use the same).
"""

from __future__ import annotations

import html
import math
import numbers
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from normx.errors import InvalidInputError
from normx.explanations import display
from normx.explanations.display import Scale, contrast_sides, contrast_title, label_dependent, scale_for
from normx.explanations.html import span, swatch
from normx.explanations.result import Explanation
from normx.methods import get_method
from normx.models import HeadKind
from normx.serving.messages import excerpt
from normx.serving.session import PageState

PAGE_CSS = (  # the demo page's styles of its views: titles and keys in the body's colour (readable in both themes)
    "#normx-prediction {font-size: 1.1em}\n.normx-view {font-size: 1.05em; line-height: 1.9}\n"
    ".normx-compare {margin: 6px 0 16px} .normx-compare .normx-view {line-height: 2.1}\n"
    ".normx-title {font-size: 0.95em; font-weight: 600; color: var(--body-text-color); margin-top: 4px}\n"
    ".normx-key {font-size: 0.85em; color: var(--body-text-color); margin-bottom: 2px}\n"
    ".normx-unit {border-radius: 3px; padding: 1px 1px}\n"
    ".normx-context, .normx-context div {color: var(--body-text-color) !important}\n"  # the Context view's HTML
    "#normx-ctx-top th:nth-child(-n+3), #normx-ctx-top td:nth-child(-n+3) {white-space: nowrap}\n")  # rank, score
MAX_LABEL_VIEWS = 4  # highlighted views per request; models with more labels show the most probable ones
LEGEND = (
    "Colours follow each method's scores: **signed** scores (Gradient×Input summed, DecompX, every contrast) red "
    "where a unit pushes **toward** the label, purple where it pushes **away**; **relative** scores (NormXLogit, "
    "LogAt: a logit times a norm, whose zero means nothing) and **unsigned** ones (norms, l1 gradients, mixing "
    "shares) in one colour, darker = higher. Each view's title says which and gives its scale (special tokens "
    "excluded); hover a unit for its score. For toward / away with NormXLogit, open **Contrast**."
)
Highlighted = list[tuple[str, float | None]]  # (text, score or None: not scored) pieces in reading order


@dataclass
class View:
    """One highlighted view: its title, the pieces of text with their scores, and the scale they are drawn on."""

    title: str
    pieces: Highlighted
    scale: Scale
    sides: tuple[str, str] | None = None  # a contrast's (red, purple) meanings (display.contrast_sides)

UNITS = ("word", "subword")
PROMPT_CHARS = 240  # a causal LM's prompt in the heading: start and end around an ellipsis when longer
COMPARE_HINT = "Tick methods and press Compare: each one runs once on this input and is kept for every layer."


def default_compare_methods(methods: Sequence[str]) -> list[str]:
    """The compare tab's default picks: the label-dependent methods that cost at most two forward passes (what
    each method says of itself: NormXLogit, LogAt and the plain gradients)."""
    return [m for m in methods if get_method(m).label_dependent and get_method(m).passes(64) <= 2] or list(methods[:2])


def unit_view(explanation: Explanation, unit: str = "word", show_special: bool = False) -> Explanation:
    """The explanation at word or subword-token level, with or without special tokens (no recomputation)."""
    view = explanation.words("sum") if unit == "word" and explanation.unit == "token" else explanation
    return view if show_special else view.without_special()


def nearest_layer(explanation: Explanation, layer: int | None) -> int:
    """``layer`` if the explanation has it, else its closest computed layer (gradient methods have only 0)."""
    if layer is None or not explanation.layers:
        return explanation.layers[-1]
    return min(explanation.layers, key=lambda computed: (abs(computed - int(layer)), computed))


def highlights(view: Explanation, values: np.ndarray) -> Highlighted:
    """One ``(text, score)`` per unit (``None``: not scored), with the text between units as unscored pieces.

    Unit texts come from the input through the character offsets, so the page shows the text as typed (subwords
    adjacent, original spacing and line breaks between units); special tokens show as their token string; the
    second text of a pair follows a `` ‖ `` separator.
    """
    values = np.asarray(values, dtype=np.float64)
    texts = {0: view.text, 1: view.text_pair}
    out: list[tuple[str, float | None]] = []
    previous: tuple[int, int] | None = None  # (segment, end offset) of the last unit shown from a text
    for i, token in enumerate(view.tokens):
        value = values[i]
        score = float(value) if math.isfinite(value) else None
        start, end = view.offsets[i]
        segment = view.segments[i]
        source = texts.get(segment)
        if view.special[i] or source is None or end <= start:
            piece = token if not out else " " + token
            out.append((piece, score))
            previous = None
            continue
        if previous is not None and previous[0] == segment:
            gap = source[previous[1]:start]
            if gap:
                out.append((gap, None))
        elif out:
            out.append((" ‖ " if previous is not None else " ", None))
        out.append((source[start:end], score))
        previous = (segment, end)
    return out


def display_token(tokenizer, token: str) -> str:
    """A vocabulary token as text (``"ĠParis"`` -> ``"' Paris'"``)."""
    try:
        text = tokenizer.convert_tokens_to_string([token])
    except Exception:  # some tokenizers cannot convert a lone token
        text = token
    return repr(text)


def probabilities(explanation: Explanation, tokenizer=None) -> dict[str, float]:
    """``gr.Label`` value: label -> probability (vocabulary heads: the top tokens, shown as text); {} for regression."""
    if explanation.vocabulary and tokenizer is not None:
        return {display_token(tokenizer, k): float(v) for k, v in explanation.probabilities.items()}
    return {str(k): float(v) for k, v in explanation.probabilities.items()}


def markdown_text(text: str) -> str:
    """``text`` shown literally inside Markdown: special characters escaped, line breaks as ⏎."""
    text = re.sub(r"([\\`*_{}\[\]<>()#+\-.!|~])", r"\\\1", text)
    return text.replace("\r\n", "⏎").replace("\n", "⏎").replace("\r", "⏎")


def bold(text: str) -> str:
    """Markdown bold around ``text`` that stays bold when it starts or ends with white space (``** x**`` is not
    bold: the space moves outside the markers)."""
    core = text.strip()
    if not core:
        return text
    start = text.index(core[0])
    return f"{text[:start]}**{core}**{text[start + len(core):]}"


def shortened(text: str, limit: int = PROMPT_CHARS) -> str:
    """``text`` whole when at most ``limit`` characters, else its start and its end around an ellipsis."""
    if len(text) <= limit:
        return text
    tail = limit // 3
    return f"{text[:limit - tail]} … {text[-tail:]}"


def prediction_text(explanation: Explanation, tokenizer=None) -> str:
    """A one-paragraph Markdown summary of the prediction."""
    pred = explanation.prediction
    if explanation.regression or isinstance(pred, float):
        return f"**Predicted score:** {float(pred):.3f} (regression)"
    prob = explanation.probabilities.get(pred)
    p = "" if prob is None else f" (p = {prob:.3f})"
    if explanation.vocabulary:
        shown = display_token(tokenizer, pred) if tokenizer is not None else repr(pred)
        what = "masked token" if explanation.kind == HeadKind.MASKED_LM else "next token"
        return f"**Predicted {what}:** `{shown}`{p}"
    return f"**Prediction:** {markdown_text(str(pred))}{p}"


def label_order(explanation: Explanation, limit: int = MAX_LABEL_VIEWS) -> list[str]:
    """The labels to show: the model's own order, or the most probable ``limit`` when there are more."""
    labels = list(explanation.labels)
    if len(labels) <= limit:
        return labels
    ranked = sorted(labels, key=lambda label: -explanation.probabilities.get(label, -1.0))
    return [label for label in labels if label in ranked[:limit]]


def label_title(explanation: Explanation, label: str, tokenizer=None) -> str:
    if explanation.regression:
        return f"score (regression: predicted {float(explanation.prediction):.3f})"
    name = display_token(tokenizer, label) if explanation.vocabulary and tokenizer \
        else label
    prob = explanation.probabilities.get(label)
    tags = ["predicted"] if label == explanation.prediction else []
    if prob is not None:
        tags.append(f"p = {prob:.3f}")
    return f"{name}" + (f" ({', '.join(tags)})" if tags else "")


def label_views(explanation: Explanation, layer: int | None, unit: str = "word", show_special: bool = False,
                tokenizer=None) -> list[View]:
    """One view per label to show, all on a common scale so that labels compare."""
    view = unit_view(explanation, unit, show_special)
    at = nearest_layer(view, layer)
    labels = label_order(view)
    rows = [view.token_scores(label, at) for label in labels]
    scale = scale_for(view, rows)
    layer_note = f"layer {at}" if view.settings.get("layer") is not None or len(view.layers) > 1 else "input"
    return [View(f"{label_title(view, label, tokenizer)} · {view.method} · {layer_note}", highlights(view, row), scale)
            for label, row in zip(labels, rows)]


def contrast_view(explanation: Explanation, a: str, b: str, layer: int | None, unit: str = "word",
                  show_special: bool = False, tokenizer=None) -> View:
    """``score(a) − score(b)`` at ``layer``: what pushes toward ``a`` rather than ``b`` (red) and the reverse
    (purple), on a signed scale; titled and keyed as every contrast view is (``A − B``:
    :func:`normx.explanations.display.contrast_title`).

    For the linear methods (normxlogit, logat, gradients) this equals ``normx.explain(..., target=a, foil=b)``.
    """
    view = unit_view(explanation, unit, show_special)
    at = nearest_layer(view, layer)
    row = view.token_scores(a, at) - view.token_scores(b, at)
    scale = scale_for(view, [row], "signed")
    vocab = view.vocabulary and tokenizer is not None
    name_a = display_token(tokenizer, a) if vocab else a
    name_b = display_token(tokenizer, b) if vocab else b
    return View(f"{contrast_title(name_a, name_b)} · {view.method} · layer {at}", highlights(view, row), scale,
                contrast_sides(name_a, name_b))


def step_choices(state: PageState, tokenizer=None) -> list[tuple[str, int]]:
    """Radio choices for a causal LM's steps: ``"1: ' Paris'"``, one per generated token."""
    out = []
    for i, explanation in enumerate(state.steps):
        generated = explanation.labels[0]
        token = display_token(tokenizer, generated) if tokenizer is not None else generated
        out.append((f"{i + 1}: {token}", i))
    return out


def contrast_choices(explanation: Explanation, tokenizer=None) -> list[tuple[str, str]]:
    """Labels the contrast view can pick: a classifier's labels, or a vocabulary head's top tokens."""
    if explanation.regression:
        return []
    if explanation.vocabulary:
        names = list(dict.fromkeys([explanation.prediction, *explanation.probabilities]))
        return [(display_token(tokenizer, n) if tokenizer is not None else n, n) for n in names]
    return [(label, label) for label in explanation.labels]


def default_contrast(explanation: Explanation) -> tuple[str | None, str | None]:
    """The predicted label (A) against the most probable other one (B) among the labels and top tokens with a
    probability, as every contrast view orders them (:func:`normx.explanations.display.default_contrast`)."""
    return display.default_contrast(explanation)


def compare_views(state: PageState | None, methods: Sequence[str], layer: int | None, unit: str = "word",
                  show_special: bool = False, step: int = 0, tokenizer=None) -> dict[str, View]:
    """``{method: view}`` for the compared methods computed for ``step``, each on its own scale and reading."""
    out = {}
    if not state or not state.steps:
        return out
    done = state.compare.get(step, {})
    for method in methods:
        if method not in done:
            continue
        explanation = done[method]
        view = unit_view(explanation, unit, show_special)
        at = nearest_layer(view, layer)
        label = view.prediction if view.prediction in view.labels else view.labels[0]
        row = view.token_scores(label, at)
        where = f"layer {at}" if len(view.layers) > 1 else "input embeddings (no per-layer scores)"
        title = label_title(view, label, tokenizer)
        out[method] = View(f"{method} · {title} · {where}", highlights(view, row), scale_for(view, [row]))
    return out


def view_html(view: View | None, kind: str = "normx-view") -> str:
    """A view as HTML: its title, the meaning of its colours and its scale, and the text with each unit coloured on
    the view's scale, its score as its tooltip."""
    if view is None:
        return ""
    if not view.pieces:
        return f'<div class="normx-title">{html.escape(view.title)}</div>'
    spans = "".join(html.escape(text) if score is None else span(text, score, view.scale, tip=f"{score:+.4g}")
                    for text, score in view.pieces)
    return (f'<div class="normx-title">{html.escape(view.title)}</div><div class="normx-key">'
            f"{swatch(view.scale.reading, view.sides)} · {html.escape(view.scale.legend())}</div>"
            f'<div class="{kind}">{spans}</div>')


def compare_html(compared: dict[str, View]) -> str:
    """The compare tab: one titled highlighted view per compared method (``#normx-compare-<method>``), as one HTML
    block (one page component however many methods are compared); each unit's score is its tooltip."""
    if not compared:
        return f'<p class="normx-compare-hint">{html.escape(COMPARE_HINT)}</p>'
    return "".join(f'<div class="normx-compare" id="normx-compare-{html.escape(method)}">{view_html(view)}</div>'
                   for method, view in compared.items())


def check_view_settings(layer, unit, show_special, step, compare_methods, methods: Sequence[str]) -> None:
    """The page's view settings as a browser or an API client sent them (the demo's events take them unprocessed):
    raises :class:`normx.InvalidInputError` saying what was given and what is allowed."""
    for name, value in (("layer", layer), ("step", step)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0
                                  or not math.isfinite(value)):
            raise InvalidInputError(f"{name} must be a number >= 0, got {excerpt(value)}")
    if unit not in UNITS:
        raise InvalidInputError(f"unit must be one of {', '.join(UNITS)}, got {excerpt(unit)}")
    if not isinstance(show_special, bool):
        raise InvalidInputError(f"show_special must be true or false, got {excerpt(show_special)}")
    if compare_methods is not None and (not isinstance(compare_methods, (list, tuple))
                                        or any(m not in methods for m in compare_methods)):
        raise InvalidInputError(f"compare_methods must be a list of methods from {', '.join(methods)}, "
                                f"got {excerpt(compare_methods)}")


def check_contrast(state: PageState, step: int, a, b, tokenizer=None) -> None:
    """Raises :class:`normx.InvalidInputError` unless ``a`` and ``b`` are empty or among the step's contrast
    choices (:func:`contrast_choices`)."""
    allowed = [value for _, value in contrast_choices(state.steps[min(step, len(state.steps) - 1)], tokenizer)]
    for name, value in (("label A", a), ("label B", b)):
        if value not in (None, "") and value not in allowed:
            raise InvalidInputError(f"{name} must be one of {', '.join(map(str, allowed))}, got {excerpt(value)}")


@dataclass
class PageView:
    """Everything the page shows for one state and one choice of layer, units, step, contrast and comparison."""

    heading: str = ""  # Markdown: the prediction (and a causal LM's continuation)
    probabilities: dict[str, float] = field(default_factory=dict)
    labels: list[View] = field(default_factory=list)  # a view per label
    contrast: View | None = None  # (its title says why a head has none: regression, label-independent scores)
    compared: dict[str, View] = field(default_factory=dict)  # method -> view


def heading_text(state: PageState, step: int, tokenizer=None) -> str:
    """The Markdown over the views: the prediction; a causal LM's prompt (once, :func:`shortened` when long) with its
    continuation and the step's place in it; how the answer came (computed, in how long, or from the cache); the
    notices of what was cut."""
    explanation = state.steps[step]
    heading = prediction_text(explanation, tokenizer)
    if state.kind is HeadKind.CAUSAL_LM:
        prompt = state.generation.prompt if state.generation is not None else state.prefixes[0]
        generated = explanation.labels[0]
        generated = display_token(tokenizer, generated) if tokenizer is not None else generated
        prefix = state.prefixes[step]
        before = prefix[len(prompt):] if prefix.startswith(prompt) else None
        after = ("the prompt" if before == "" else f"the prompt and “{markdown_text(shortened(before, 80))}”"
                 if before is not None else f"“{markdown_text(shortened(prefix, 80))}”")
        heading = (f"**Greedy continuation:** {markdown_text(shortened(prompt))}"
                   f"{bold(markdown_text(state.continuation or ''))}  \n"
                   f"Step {step + 1} of {len(state.steps)}: why {markdown_text(generated)} after {after} — {heading}")
    if state.cached:
        took = "" if state.seconds is None else f", first computed in {state.seconds:.2f} s"
        heading += f"  \n*answered from this server's cache (the same request was explained before{took})*"
    elif state.seconds is not None:
        heading += f"  \n*answered in {state.seconds:.2f} s*"
    return heading + "".join(f"  \n⚠ {markdown_text(notice)}" for notice in state.notices)


def page_view(state: PageState | None, tokenizer, layer: int | None, unit: str = "word", show_special: bool = False,
              step: int = 0, a: str | None = None, b: str | None = None,
              compare_methods: Sequence[str] = ()) -> PageView:
    """Every view from the state, without computing anything new (the layer slider and the unit toggle land
    here only)."""
    if state is None or not state.steps:
        return PageView()
    step = min(int(step or 0), len(state.steps) - 1)
    layer = None if layer is None else int(layer)
    explanation = state.steps[step]
    heading = heading_text(state, step, tokenizer)
    if explanation.regression:
        contrast = View("No contrast: a regression head has one output", [], Scale())
    elif not label_dependent(explanation):
        contrast = View(f"No contrast: {explanation.method}'s scores do not depend on the label", [], Scale())
    else:
        contrast = View("contrast: pick two different labels", [], Scale())
        source = None
        if a and b and a != b:
            source = explanation if a in explanation.labels and b in explanation.labels \
                else state.contrast.get((step, a, b))
        if source is not None:
            contrast = contrast_view(source, a, b, layer, unit, show_special, tokenizer)
    return PageView(heading, probabilities(explanation, tokenizer),
                    label_views(explanation, layer, unit, show_special, tokenizer), contrast,
                    compare_views(state, list(compare_methods or []), layer, unit, show_special, step, tokenizer))
