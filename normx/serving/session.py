"""One page session of explanations, as a server runs it: check the input, estimate its work against the budget,
explain (every label and layer at once; a causal LM's greedy continuation, every step from the ids it produced:
one forward pass for the head-on-top methods), and keep the results in a :class:`PageState` so that every later
view comes from it without another forward pass.

Plain functions of a model cache (``cache.get(name) -> (model, tokenizer)``) and a
:class:`~normx.serving.lanes.WorkGate`; no web framework.
"""

from __future__ import annotations

import numbers
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from normx import errors
from normx.core.handle import model_handle
from normx.core.inputs import check_text, count_tokens, max_input_length
from normx.explanations.explain import explain
from normx.explanations.generation import explain_generation
from normx.explanations.generation_result import Generation
from normx.explanations.result import Explanation
from normx.methods import get_method, list_methods
from normx.models import HeadKind, get_adapter, unwrap_model
from normx.serving.batching import Batcher
from normx.serving.budget import estimate_gflop
from normx.serving.lanes import WorkGate
from normx.serving.messages import excerpt

MAX_CHARS = 2000  # per text box
# rows per forward pass of the methods that run all their rows at once by default (Integrated Gradients' steps):
# short passes, so that a batch of one-pass requests waits for at most one of them (serving.batching)
PASS_ROWS = 10
MAX_TOKENS = 512  # per request (text + pair, special tokens included)
MAX_CONTINUATION = 32  # greedy continuation tokens for causal LMs
DEFAULT_CONTINUATION = 8


@dataclass
class PageState:
    """What one request computed, kept for the views: the explanations of every step (one for classifiers and
    masked LMs, one per greedy token for causal LMs), with their prefixes, and the contrast and comparison
    explanations computed on demand."""

    model: str
    method: str
    kind: str
    pair: str | None
    prefixes: list[str]
    steps: list[Explanation]
    continuation: str | None = None
    generation: Generation | None = None  # a causal LM's prompt, continuation and every step's scores
    compare: dict[int, dict[str, Explanation]] = field(default_factory=dict)  # step -> method -> explanation
    contrast: dict[tuple[int, str, str], Explanation] = field(default_factory=dict)  # (step, a, b) -> explanation
    notices: list[str] = field(default_factory=list)  # what the page must say it did (a text cut to the limit)
    seconds: float | None = None  # how long computing the answer took
    cached: bool = False  # answered from the server's ResultCache (``seconds``: the first computation's)


class ResultCache:
    """The page states of the last ``size`` distinct requests (model, texts, method, steps), so that the same
    request again (a second visitor, a reload) costs nothing; each hit is a copy whose later additions (comparisons,
    contrasts) stay its own. Thread-safe."""

    def __init__(self, size: int = 256):
        self.size = size
        self._states: OrderedDict[tuple, PageState] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple) -> PageState | None:
        with self._lock:
            state = self._states.get(key)
            if state is None:
                return None
            self._states.move_to_end(key)
            return _copy(state)

    def put(self, key: tuple, state: PageState) -> None:
        with self._lock:
            self._states[key] = _copy(state)
            self._states.move_to_end(key)
            while len(self._states) > self.size:
                self._states.popitem(last=False)


def _copy(state: PageState) -> PageState:
    return replace(state, compare={step: dict(done) for step, done in state.compare.items()},
                   contrast=dict(state.contrast))


def check_inputs(text: str, pair: str | None, tokenizer, limit: int = MAX_TOKENS, command: str = "normx explain"
                 ) -> tuple[str, str | None, int, list[str]]:
    """The text, the pair (``None`` if empty), their token count and the notices of what was cut: a text over the
    demo's caps (:data:`MAX_CHARS` per box, ``limit`` tokens in all: :data:`MAX_TOKENS` or the model's own, if
    smaller) is cut at a word boundary to fit, and a notice says so, with the limits and the ``command`` that takes
    the model's whole limit (``normx generate`` for a causal LM). Raises
    :class:`normx.InvalidInputError` for what cannot be explained."""
    for name, value in (("text", text), ("second text", pair)):
        if value is not None and not isinstance(value, str):
            raise errors.InvalidInputError(f"the {name} must be a string, got {type(value).__name__} {excerpt(value)}")
    text = text or ""
    pair = (pair or "").strip() or None
    notices = []
    cut = {}
    for name, value in (("text", text), ("second text", pair)):
        if value is not None and len(value) > MAX_CHARS:
            cut[name] = len(value)
            value = cut_at_word(value, MAX_CHARS)
            text, pair = (value, pair) if name == "text" else (text, value)
        if value is not None or name == "text":
            check_text(value, f"the {name}")
    count = count_tokens(tokenizer, text, pair)
    while count > limit:  # cut the longer text by the share of tokens over the limit, at a word boundary
        name = "second text" if pair is not None and len(pair) > len(text) else "text"
        value = pair if name == "second text" else text
        cut.setdefault(name, len(value))
        keep = cut_at_word(value, max(1, int(len(value) * limit / count * 0.97)))
        if len(keep) >= len(value):
            keep = value[:max(1, len(value) - 1)]
        text, pair = (keep, pair) if name == "text" else (text, keep)
        count = count_tokens(tokenizer, text, pair)
    for name, before in cut.items():
        after = text if name == "text" else pair
        notices.append(f"The {name} has {before:,} characters; this demo explains at most {MAX_CHARS:,} characters "
                       f"per box and {limit} tokens in all, so it explains the first {len(after):,} (up to "
                       f"“…{after[-30:]}”). `{command}` takes the model's whole limit.")
    return text, pair, count, notices


def cut_at_word(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, at the last white space before the limit where there is one
    in its last fifth (else at the limit)."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    space = max(head.rfind(" "), head.rfind("\n"), head.rfind("\t"))
    return head[:space].rstrip() if space > limit * 0.8 else head


def gated(gate: WorkGate | None, model, method: str, tokens: int, fn, *, targets: int = 1, steps: int = 1):
    """``fn()`` through the work gate: refused with a clear message when over the budget; the one-pass methods
    (``Method.per_position``) at once, every other method in the expensive lane, behind the expensive requests
    before it. ``steps`` explanations of ``tokens`` (+ the steps' tokens) each."""
    if gate is None:
        return fn()
    gflop = estimate_gflop(model, method, tokens + steps - 1, targets=targets, texts=steps)
    what = f"{method} on {tokens} tokens" + (f" x {steps} steps" if steps > 1 else "") + \
        (f" for {targets} labels" if targets > 1 else "")
    return gate.run(gflop, fn, what, heavy=expensive(method))


def expensive(method: str) -> bool:
    """Whether ``method`` runs in the work gate's expensive lane: every method but the one-pass ones
    (``Method.per_position``), and those that hold the model exclusively."""
    chosen = get_method(method)
    return chosen.exclusive or not chosen.per_position


def continuation(model, tokenizer, text: str, method: str, steps: int, layer="all",
                 target: list[int] | None = None) -> Generation:
    """Greedy-continue ``text`` by up to ``steps`` tokens (or take the continuation ``target``, token ids) and
    explain every generated token (:func:`normx.explain_generation`: one forward pass for the head-on-top
    methods, every step read from the ids the model produced)."""
    return explain_generation(model, tokenizer, text, method=method, layer=layer, max_new_tokens=steps,
                              target=target)


def short_passes(method: str) -> dict:
    """The options that keep a method's forward passes short on a server: ``internal_batch_size`` where it runs all
    its rows in one pass by default (Integrated Gradients: every step)."""
    option = get_method(method).options.get("internal_batch_size")
    return {"internal_batch_size": PASS_ROWS} if option is not None and option.default is None else {}


def _gated_generation(gate, model, method: str, tokens: int, steps: int, fn):
    """A generation through the work gate: one pass over prompt + continuation for the head-on-top methods, one
    per step otherwise."""
    if get_method(method).per_position:
        return gated(gate, model, method, tokens + steps, fn)
    return gated(gate, model, method, tokens, fn, steps=steps)


def explain_request(cache, model_name: str, text: str, pair: str | None = None,
                    method: str = "normxlogit", steps: int = DEFAULT_CONTINUATION, gate: WorkGate | None = None,
                    batcher: Batcher | None = None, results: ResultCache | None = None, *,
                    loading: Callable | None = None) -> PageState:
    """Everything one request computes, as the state the page keeps: explanations of all layers and labels.

    Classifiers: one explanation with ``target="all"`` (every label) and ``layer="all"``. Vocabulary heads
    (causal / masked LM): one explanation per greedy step of the predicted token (masked LM: the mask token).
    ``gate``: the server's :class:`normx.serving.lanes.WorkGate` (None: no budget); ``batcher``: one-pass
    requests of classifiers and masked LMs are explained in batches with the requests that arrive with them
    (:class:`normx.serving.batching.Batcher`); ``results``: the same request again is answered from there.
    ``loading(0, desc=...)`` (a page's progress bar) is told when the model has to be loaded first. The state says
    how long the request took (``seconds``; an answer from ``results`` is marked ``cached`` and keeps the first
    computation's time) and what was cut (``notices``).
    """
    started = time.perf_counter()
    if method not in list_methods():
        raise errors.UnknownMethodError(f"unknown method {excerpt(method)}; available: {', '.join(list_methods())}")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, numbers.Real)
                              or not 1 <= steps <= MAX_CONTINUATION):
        raise errors.InvalidInputError(f"steps (tokens to generate) must be a number from 1 to {MAX_CONTINUATION}, "
                                       f"got {excerpt(steps)}")
    if loading is not None and isinstance(model_name, str) and cache.peek(model_name) is None:
        loading(0, desc=f"loading {model_name} (first use: this can take a minute)")
    model, tokenizer = cache.get(model_name)
    limit = min(MAX_TOKENS, max_input_length(tokenizer, model_handle(model)))
    causal = get_adapter(model).kind is HeadKind.CAUSAL_LM
    if causal:
        limit = max(1, limit - int(steps or 1))  # room for the continuation
    text, pair, tokens, notices = check_inputs(text, pair, tokenizer, limit,
                                               "normx generate" if causal else "normx explain")
    key = (model_name, text, pair, method, int(steps or 1))
    found = None if results is None else results.get(key)
    if found is not None:
        found.cached = True
        return found
    state = _compute(model, tokenizer, model_name, text, pair, tokens, method, steps, gate, batcher)
    state.notices = notices
    state.seconds = time.perf_counter() - started
    if results is not None:
        results.put(key, state)
    return state


def _compute(model, tokenizer, model_name: str, text: str, pair: str | None, tokens: int, method: str, steps,
             gate: WorkGate | None, batcher: Batcher | None) -> PageState:
    kind = get_adapter(model).kind
    layer = get_method(method).all_layers
    if kind is HeadKind.CAUSAL_LM:
        if pair is not None:
            raise errors.PairNotSupportedError("a causal LM continues one text: clear the second text box")
        steps = int(steps or 1)  # checked by explain_request: 1 .. MAX_CONTINUATION
        generation = _gated_generation(gate, model, method, tokens, steps,
                                       lambda: continuation(model, tokenizer, text, method, steps, layer))
        explained = [generation.step(t) for t in range(generation.steps)]
        return PageState(model_name, method, kind, pair, [e.text for e in explained], explained,
                         generation.continuation, generation, compare={i: {method: e} for i, e in enumerate(explained)})
    target = None if kind is not HeadKind.SEQUENCE_CLASSIFICATION else "all"
    labels = 1 if target is None else max(1, int(getattr(unwrap_model(model).config, "num_labels", 1)))
    settings = {"method": method, "target": target, "layer": layer, "truncation": "error", **short_passes(method)}
    if batcher is not None and get_method(method).per_position:
        def run():
            return batcher.explain(model, tokenizer, text, text_pair=pair, tokens=tokens, **settings)
    else:
        def run():
            return explain(model, tokenizer, text, text_pair=pair, **settings)
    explanation = gated(gate, model, method, tokens, run, targets=labels)
    return PageState(model_name, method, kind, pair, [text], [explanation], compare={0: {method: explanation}})


def ensure_contrast(state: PageState, cache, step: int, a: str | None, b: str | None,
                    gate: WorkGate | None = None) -> Explanation | None:
    """An explanation holding labels ``a`` and ``b`` at every layer for ``step``: the step's own for classifiers;
    for vocabulary heads one ``explain(target=[a, b])`` call, kept in the state."""
    if not a or not b or a == b or not state.steps:
        return None
    explanation = state.steps[step]
    if a in explanation.labels and b in explanation.labels:
        return explanation
    if not explanation.vocabulary:
        return None
    key = (step, a, b)
    if key not in state.contrast and state.generation is not None:
        state.contrast[key] = _generation_contrast(state, cache, step, a, b, gate)
    if key not in state.contrast:
        model, tokenizer = cache.get(state.model)
        prefix = state.prefixes[step]
        state.contrast[key] = gated(
            gate, model, state.method, count_tokens(tokenizer, prefix), lambda: explain(
                model, tokenizer, prefix, method=state.method, target=[a, b], layer=get_method(state.method).all_layers,
                truncation="error"), targets=2)
    return state.contrast[key]


def _generation_contrast(state: PageState, cache, step: int, a: str, b: str, gate: WorkGate | None) -> Explanation:
    """Generation step ``step`` explained for the vocabulary tokens ``a`` and ``b`` in its place, from the ids the
    model produced before it (one generation per token, the step's prefix then that token)."""
    model, tokenizer = cache.get(state.model)
    g = state.generation
    p = g.prompt_length + step
    explained = []
    for token in (a, b):
        token_id = tokenizer.convert_tokens_to_ids(token)
        explained.append(_gated_generation(gate, model, state.method, p, 1, lambda token_id=token_id: continuation(
            model, tokenizer, g.prompt, state.method, 1, get_method(state.method).all_layers,
            target=[*g.token_ids[g.prompt_length:p], token_id])).step(-1))
    first, second = explained
    return replace(first, scores=np.concatenate([first.scores, second.scores]), labels=[a, b],
                   probabilities={**first.probabilities, **second.probabilities})


def compare_request(state: PageState, cache, methods: Sequence[str], step: int = 0,
                    gate: WorkGate | None = None) -> list[str]:
    """Explain the same input and label (the prediction) with each of ``methods`` (all layers), kept in the state.

    Returns the error messages of methods that failed for this model (they are left out; the others show).
    """
    failures = []
    explanation = state.steps[step]
    model, tokenizer = cache.get(state.model)
    done = state.compare.setdefault(step, {})
    target = None if explanation.regression else explanation.prediction
    prefix, pair = state.prefixes[step], state.pair
    tokens = count_tokens(tokenizer, prefix, pair)
    for method in methods:
        if method in done:
            continue
        if method == state.method:
            done[method] = explanation  # already computed: the main request's method
            continue
        try:
            if state.generation is not None:  # every step of the continuation at once, from its ids
                _compare_generation(state, model, tokenizer, method, gate)
                continue
            done[method] = gated(gate, model, method, tokens, lambda method=method: explain(
                model, tokenizer, prefix, method=method, target=target, layer=get_method(method).all_layers,
                text_pair=pair, truncation="error"))
        except errors.NormxError as exc:
            failures.append(f"{method}: {exc}")
    return failures


def _compare_generation(state: PageState, model, tokenizer, method: str, gate: WorkGate | None) -> None:
    """Every step of the state's continuation explained with ``method`` (its ids taken as the target), kept."""
    g = state.generation
    other = _gated_generation(gate, model, method, g.prompt_length, g.steps, lambda: continuation(
        model, tokenizer, g.prompt, method, g.steps, get_method(method).all_layers,
        target=g.token_ids[g.prompt_length:]))
    for t in range(other.steps):
        state.compare.setdefault(t, {})[method] = other.step(t)
