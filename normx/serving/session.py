"""One page session of explanations, as a server runs it: check the input, estimate its work against the budget,
explain (every label and layer at once; a causal LM's greedy continuation step by step), and keep the results in
a :class:`PageState` so that every later view comes from it without another forward pass.

Plain functions of a model cache (``cache.get(name) -> (model, tokenizer)``) and a
:class:`~normx.serving.budget.WorkGate`; no web framework.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from normx import errors
from normx.core.inputs import check_text, count_tokens
from normx.explanations.explain import explain
from normx.explanations.result import Explanation
from normx.methods import get_method, list_methods
from normx.models import HeadKind, get_adapter, unwrap_model
from normx.serving.budget import WorkGate, estimate_gflop

MAX_CHARS = 2000  # per text box
MAX_TOKENS = 512  # per request (text + pair, special tokens included)
MAX_CONTINUATION = 8  # greedy continuation tokens for causal LMs
DEFAULT_CONTINUATION = 3


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
    compare: dict[int, dict[str, Explanation]] = field(default_factory=dict)  # step -> method -> explanation
    contrast: dict[tuple[int, str, str], Explanation] = field(default_factory=dict)  # (step, a, b) -> explanation


def check_inputs(text: str, pair: str | None, tokenizer) -> tuple[str, str | None, int]:
    """The text, the pair (``None`` if empty) and their token count, after the demo's caps; raises
    :class:`normx.InvalidInputError`."""
    text = text or ""
    pair = (pair or "").strip() or None
    for name, value in (("text", text), ("second text", pair)):
        if value is not None and len(value) > MAX_CHARS:
            raise errors.InputTooLongError(f"the {name} has {len(value)} characters; this demo takes at most "
                                          f"{MAX_CHARS} per box")
        if value is not None or name == "text":
            check_text(value, f"the {name}")
    count = count_tokens(tokenizer, text, pair)
    if count > MAX_TOKENS:
        raise errors.InputTooLongError(f"the input has {count} tokens; this demo takes at most {MAX_TOKENS}")
    return text, pair, count


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
                        layer="all") -> tuple[list[tuple[str, Explanation]], str]:
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
        explanation = explain(model, tokenizer, prefix, method=method, layer=layer, truncation="error")
        runs.append((prefix, explanation))
        ids.append(tokenizer.convert_tokens_to_ids(explanation.prediction))
        if ids[-1] == tokenizer.eos_token_id:
            break
        prefix = text + tokenizer.decode(ids)  # the whole continuation at once: multi-byte characters decode whole
    return runs, tokenizer.decode(ids)


def explain_request(cache, model_name: str, text: str, pair: str | None = None,
                    method: str = "normxlogit", steps: int = DEFAULT_CONTINUATION, gate: WorkGate | None = None
                    ) -> PageState:
    """Everything one request computes, as the state the page keeps: explanations of all layers and labels.

    Classifiers: one explanation with ``target="all"`` (every label) and ``layer="all"``. Vocabulary heads
    (causal / masked LM): one explanation per greedy step of the predicted token (masked LM: the mask token).
    ``gate``: the server's :class:`normx.serving.budget.WorkGate` (None: no budget).
    """
    if method not in list_methods():
        raise errors.UnknownMethodError(f"unknown method {method!r}; available: {', '.join(list_methods())}")
    model, tokenizer = cache.get(model_name)
    text, pair, tokens = check_inputs(text, pair, tokenizer)
    kind = get_adapter(model).kind
    layer = get_method(method).all_layers
    if kind is HeadKind.CAUSAL_LM:
        if pair is not None:
            raise errors.PairNotSupportedError("a causal LM continues one text: clear the second text box")
        steps = min(max(1, int(steps or 1)), MAX_CONTINUATION)
        runs, continuation = gated(gate, model, method, tokens, lambda: greedy_continuation(
            model, tokenizer, text, method, steps, layer), steps=steps)
    else:
        target = None if kind is not HeadKind.SEQUENCE_CLASSIFICATION else "all"
        labels = 1 if target is None else max(1, int(getattr(unwrap_model(model).config, "num_labels", 1)))
        explanation = gated(gate, model, method, tokens, lambda: explain(
            model, tokenizer, text, method=method, target=target, layer=layer, text_pair=pair, truncation="error"),
            targets=labels)
        runs, continuation = [(text, explanation)], None
    return PageState(model_name, method, kind, pair, [p for p, _ in runs], [e for _, e in runs], continuation,
                     compare={i: {method: e} for i, (_, e) in enumerate(runs)})


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
    if key not in state.contrast:
        model, tokenizer = cache.get(state.model)
        prefix = state.prefixes[step]
        state.contrast[key] = gated(
            gate, model, state.method, count_tokens(tokenizer, prefix), lambda: explain(
                model, tokenizer, prefix, method=state.method, target=[a, b], layer=get_method(state.method).all_layers,
                truncation="error"), targets=2)
    return state.contrast[key]


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
            done[method] = gated(gate, model, method, tokens, lambda method=method: explain(
                model, tokenizer, prefix, method=method, target=target, layer=get_method(method).all_layers,
                text_pair=pair, truncation="error"))
        except errors.NormxError as exc:
            failures.append(f"{method}: {exc}")
    return failures
