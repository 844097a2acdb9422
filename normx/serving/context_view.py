"""The demo's Context view: which part of pasted documents a causal LM's answer to a question came from
(:func:`normx.explain_context`), as a server runs it: check the input, estimate the work against the budget (an
ablation costs a forward pass per mask or per source), let the model answer (greedy, short, with its chat template
when it has one) and keep the :class:`~normx.context.ContextAttribution` for the page: the context with its sources
highlighted in normx's colour language (scores on hover), the top sources, and what the answer cost.

Plain functions of a model cache (``cache.get(name) -> (model, tokenizer)``) and a
:class:`~normx.serving.lanes.WorkGate`; no web framework.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from normx import errors
from normx.context import DEFAULT_TEMPLATE, ContextAttribution, explain_context
from normx.core.concurrency import tokenizer_lock
from normx.core.handle import model_handle
from normx.core.inputs import check_text, max_input_length
from normx.methods import get_method, list_methods
from normx.methods.ablation import MIN_ABLATIONS
from normx.methods.ablation.sources import split_text
from normx.models import HeadKind, get_adapter
from normx.serving.budget import estimate_gflop
from normx.serving.lanes import WorkGate
from normx.serving.messages import excerpt
from normx.serving.session import expensive
from normx.serving.views import markdown_text, shortened

SOURCES = ("sentences", "paragraphs", "lines")
# one forward pass each (the attention readings; AttnLRP with one backward pass of the response's log-probability;
# the calibrated method where it is registered), then the ablation reference: a forward pass per mask or source
ONE_PASS = ("calibrated_attention", "alti_logit", "attention", "norm_attention", "attnlrp")
BUDGETED = ("budgeted",)  # ContextCite's estimator within a budget of forward passes (docs/context.md)
REFERENCE = ("contextcite", "leave_one_out")
BUDGETS = ("fast", "balanced", "faithful")
DEFAULT_BUDGET = "balanced"
# "auto", the page's default, is the most faithful reading within an interactive request's budget for the model:
# calibrated_attention where the model has calibrated weights (LDS 0.69 held out at ~1.4x a forward on SmolLM2,
# above every other one-pass method in docs/context.md and level with ContextCite's 16 ablations the page allows by
# default, 0.70-0.71 on the same folds, at a tenth of their work), else ContextCite's estimator
AUTO = "auto"
FAITHFUL = "calibrated_attention"
DEFAULT_METHOD = AUTO
DEFAULT_MODEL = "smollm2"
MAX_CONTEXT_CHARS = 8000
MAX_QUERY_CHARS = 500
MAX_PROMPT_TOKENS = 1024  # the prompt (context, question and template) a request may have
MAX_ANSWER_TOKENS = 64
DEFAULT_ANSWER_TOKENS = 24
# contextcite's masks by default: with SmolLM2 (0.27 GFLOP a token) 17 passes over ~300 tokens fit the default
# budget of 1,500 GFLOP (normx.serving.server.BUDGET_GFLOP); ContextCite's own default is 64
DEFAULT_ABLATIONS = 16
# a bound on the number itself: the masks are drawn and fitted on the host (a few sources' masks repeat and run once,
# so the work budget of their forward passes would not stop a million of them)
MAX_ABLATIONS = 10_000
TOP_SOURCES = 5
ADVICE = ("shorten the context, ask for fewer ablations (contextcite) or larger sources (leave_one_out), or choose "
          "a one-pass method (alti_logit, attention, norm_attention)")
EXAMPLES = [[
    "The Eiffel Tower is a wrought-iron lattice tower in Paris. It was designed by Gustave Eiffel's company. "
    "Construction began in January 1887. The tower was completed in March 1889. It is 330 metres tall. "
    "About seven million people visit it every year.",
    "When was the Eiffel Tower completed?"]]


@dataclass
class ContextState:
    """One answered request: the attribution, the model's name, what it cost (forward passes' worth and the work
    estimate the budget read) and how long it took."""

    model: str
    attribution: ContextAttribution
    passes: float
    gflop: float
    chat: bool
    seconds: float


def auto_method(model) -> str:
    """What ``"auto"`` reads with on ``model``: :data:`FAITHFUL` where weights are stored or shipped for it, else
    contextcite (a short context's masks fit the budget; a long one is refused with the advice)."""
    from normx.methods.calibrated import weights as stored

    try:
        stored.find(model, FAITHFUL)
    except errors.NormxError:
        return "contextcite"
    return FAITHFUL


def context_methods() -> list[str]:
    """The view's methods that are registered, one-pass first, the ablation reference last."""
    registered = set(list_methods(response_only=True))
    return [m for m in (*ONE_PASS, *BUDGETED, *REFERENCE) if m in registered]


def method_choices() -> list[tuple[str, str]]:
    """The method picker's (label, value) pairs, each label stating the method's cost in forward passes."""
    costs = {"contextcite": "reference: n_ablations + 1 passes", "leave_one_out": "reference: 1 pass per source + 1",
             "budgeted": "ablations within a budget: 2 / 6 / 24 passes"}
    return [(f"{AUTO} · {FAITHFUL} where the model has weights, else contextcite", AUTO),
            *((f"{m} · {costs.get(m, 'one pass')}", m) for m in context_methods())]


def context_models(offered: Sequence[str]) -> list[str]:
    """The causal-LM presets among the models a server offers (the view's model picker)."""
    from normx.zoo.presets import PRESETS

    return [name for name in offered if name in PRESETS and PRESETS[name].task == "causal-lm"]


def default_model(models: Sequence[str]) -> str | None:
    return DEFAULT_MODEL if DEFAULT_MODEL in models else (models[0] if models else None)


def _options(method: str, n_ablations: int, budget: str = DEFAULT_BUDGET) -> dict:
    spec = get_method(method).options
    return {**({"n_ablations": n_ablations} if "n_ablations" in spec else {}),
            **({"budget": budget} if "budget" in spec else {})}


def _cost_options(method: str, sources: int, n_ablations: int, budget: str = DEFAULT_BUDGET) -> dict:
    """The options :meth:`~normx.methods.registry.Method.passes` reads, with ``sources`` sources (placeholder token
    spans: only their number counts)."""
    options = _options(method, n_ablations, budget)
    if "sources" in get_method(method).options:
        options["sources"] = [(i, i + 1) for i in range(max(1, sources))]
    return options


def check_request(context, query, sources, method, n_ablations, answer_tokens) -> tuple[str, str, int, int]:
    """The request as a browser or an API client sent it: (context, query, n_ablations, answer tokens), or
    :class:`normx.InvalidInputError` saying what was given and what is allowed."""
    for name, value, limit in (("the context", context, MAX_CONTEXT_CHARS), ("the question", query, MAX_QUERY_CHARS)):
        if not isinstance(value, str):
            raise errors.InvalidInputError(f"{name} must be a string, got {type(value).__name__} {excerpt(value)}")
        if len(value) > limit:
            raise errors.InvalidInputError(f"{name} has {len(value):,} characters; this demo takes at most {limit:,} "
                                           "(`normx cite` takes the model's whole limit)")
        check_text(value, name)
    if sources not in SOURCES:
        raise errors.InvalidInputError(f"sources must be one of {', '.join(SOURCES)}, got {excerpt(sources)}")
    if method != AUTO and method not in context_methods():
        raise errors.UnknownMethodError(f"the Context view has no method {excerpt(method)}; choose one of "
                                        f"{', '.join(context_methods())}")
    whole = {}
    for name, value, low, top in (("n_ablations", n_ablations, MIN_ABLATIONS, MAX_ABLATIONS),
                                  ("answer tokens", answer_tokens, 1, MAX_ANSWER_TOKENS)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not low <= value <= top \
                or value != int(value):  # the range first: NaN and infinity are refused before int()
            raise errors.InvalidInputError(f"{name} must be a whole number from {low} to {top:,}, got "
                                           f"{excerpt(value)}")
        whole[name] = int(value)
    return context, query.strip(), whole["n_ablations"], whole["answer tokens"]


def prompt_tokens(tokenizer, context: str, query: str, chat: bool) -> int:
    """The prompt's length in tokens as :func:`normx.explain_context` builds it (its template; the chat template
    around it as a user message when ``chat``)."""
    prompt = DEFAULT_TEMPLATE.replace("{context}", context).replace("{query}", query)
    with tokenizer_lock(tokenizer):
        if chat:
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                 add_generation_prompt=True)
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])
        return len(tokenizer(prompt)["input_ids"])


def context_request(cache, model_name: str, context: str, query: str, sources: str = "sentences",
                    method: str = DEFAULT_METHOD, n_ablations: int = DEFAULT_ABLATIONS,
                    answer_tokens: int = DEFAULT_ANSWER_TOKENS, gate: WorkGate | None = None, *,
                    loading: Callable | None = None, budget: str = DEFAULT_BUDGET) -> ContextState:
    """The model answers ``query`` about ``context`` (greedy, at most ``answer_tokens`` tokens; the chat template
    when the tokenizer has one) and ``method`` scores the context's ``sources`` for the answer.

    ``gate``: the server's work budget and lanes (the estimate counts the prompt and the longest answer, times the
    method's forward passes: ``n_ablations`` + 1 for contextcite, one per source + 1 for leave_one_out);
    ``loading(0, desc=...)`` (a progress bar) is told when the model loads and what the request costs. ``budget``:
    budgeted's, one of :data:`BUDGETS`.
    """
    started = time.perf_counter()
    if budget not in BUDGETS:
        raise errors.InvalidInputError(f"budget must be one of {', '.join(BUDGETS)}, got {excerpt(budget)}")
    context, query, n_ablations, answer_tokens = check_request(context, query, sources, method, n_ablations,
                                                               answer_tokens)
    if loading is not None and isinstance(model_name, str) and cache.peek(model_name) is None:
        loading(0, desc=f"loading {model_name} (first use: this can take a minute)")
    model, tokenizer = cache.get(model_name)
    if method == AUTO:
        method = auto_method(model)
    adapter = get_adapter(model)
    if adapter.kind is not HeadKind.CAUSAL_LM:
        raise errors.UnsupportedModelError(
            f"the Context view needs a causal LM, a model that writes an answer; {excerpt(model_name)} has a "
            f"{adapter.kind.value.replace('_', ' ')} head (pick {DEFAULT_MODEL})")
    if (why := get_method(method).unsupported(model)) is not None:
        raise errors.UnsupportedModelError(f"{method} cannot explain {excerpt(model_name)}: {why}")
    if method == "calibrated_attention":
        _check_calibrated(model, model_name)
    count = len(split_text(context, sources))
    chat = bool(getattr(tokenizer, "chat_template", None))
    tokens = prompt_tokens(tokenizer, context, query, chat)
    limit = min(MAX_PROMPT_TOKENS, max_input_length(tokenizer, model_handle(model)) - answer_tokens)
    if tokens > limit:
        raise errors.InputTooLongError(f"the context and the question make a prompt of {tokens:,} tokens; this demo "
                                       f"takes at most {limit:,}: shorten the context (`normx cite` takes the "
                                       "model's whole limit)")
    total = tokens + answer_tokens
    cost = _cost_options(method, count, n_ablations, budget)
    passes, gflop = get_method(method).passes(total, 1, cost), estimate_gflop(model, method, total, options=cost)
    options = _options(method, n_ablations, budget)
    said = (f", {n_ablations:,} ablations" if "n_ablations" in options else f", budget {budget}" if options else "")
    what = f"{method} on {count} {sources} ({total} tokens{said})"

    def run() -> ContextAttribution:
        return explain_context(model, tokenizer, context, query, sources=sources, method=method, chat=chat,
                               max_new_tokens=answer_tokens, **options)

    if loading is not None:
        loading(0, desc=f"{method}: about {passes:,.0f} forward passes' work")
    result = run() if gate is None else gate.run(gflop, run, what, heavy=expensive(method), advice=ADVICE)
    return ContextState(model_name, result, passes, gflop, chat, time.perf_counter() - started)


def _check_calibrated(model, model_name: str) -> None:
    """The calibrated method's weights for ``model`` exist, else a refusal that names no folder of the server."""
    from normx.methods.calibrated import weights

    try:
        weights.find(model, "calibrated_attention")
    except errors.InvalidInputError:
        raise errors.InvalidInputError(f"calibrated_attention has no weights fitted to {excerpt(model_name)} on this "
                                       "server (`normx calibrate` fits them); choose another method") from None


def cost_note(method, context, sources, n_ablations, budget=DEFAULT_BUDGET) -> str:
    """Markdown beside the method picker: what ``method`` costs on this context, in forward passes of the model
    (:meth:`normx.methods.registry.Method.passes`); never raises (it follows every edit)."""
    if method == AUTO:
        return (f"*{AUTO}: {FAITHFUL} (about one and a half forward passes) where the model has calibrated weights "
                "(the smollm2 preset ships them), else contextcite (a forward pass per mask): the most faithful "
                "reading this page can afford.*")
    if method not in context_methods():
        return ""
    if method in BUDGETED:
        from normx.methods.ablation.budgeted import BUDGETS as PASSES

        passes = PASSES.get(budget) if isinstance(budget, str) else None
        if passes is None:
            return f"*budget must be one of {', '.join(BUDGETS)}.*"
        return (f"*{method}, budget {budget}: at most {passes:g} forward passes' work: one pass with its cache kept, "
                "then designed source masks, each run from its first removed source on.*")
    if method not in REFERENCE:
        return (f"*{method}: one forward pass over the context and the answer (and its reading); "
                f"{', '.join(REFERENCE)} are the ablation reference.*")
    count = len(split_text(context, sources)) if isinstance(context, str) and sources in SOURCES else 0
    if not count:
        return f"*{method}: one forward pass per {'mask' if method == 'contextcite' else 'source'}; paste a context " \
               "to see its cost.*"
    if method == "contextcite" and (isinstance(n_ablations, bool) or not isinstance(n_ablations, numbers.Real)
                                    or not MIN_ABLATIONS <= n_ablations <= MAX_ABLATIONS
                                    or n_ablations != int(n_ablations)):
        return f"*n_ablations must be a whole number from {MIN_ABLATIONS} to {MAX_ABLATIONS:,}.*"
    n = int(n_ablations) if method == "contextcite" else 0
    passes = get_method(method).passes(1, 1, _cost_options(method, count, n))
    what = f"{n:,} random masks of the {count} {sources}" if n else f"one without each of the {count} {sources}"
    repeats = f": {count} {sources} have {2 ** count} masks, each run once" if n and passes < n + 1 else ""
    return (f"*{method} on this context: about {passes:,.0f} forward passes of the model ({what}, and one with all "
            f"of them{repeats}), within the server's work budget.*")


def heading(state: ContextState | None) -> str:
    """Markdown over the view: the answer, the model and method, the cost, how long it took."""
    if state is None:
        return ""
    r = state.attribution
    how = "greedy, with its chat template" if state.chat else "greedy"
    return (f"**Answer** ({markdown_text(state.model)}, {how}): {markdown_text(r.response.strip()) or '(empty)'}  \n"
            f"*{markdown_text(r.method)} on {len(r.sources)} sources: about {state.passes:,.1f} forward passes' work "
            f"(~{state.gflop:,.{0 if state.gflop >= 10 else 2}f} GFLOP estimated), answered in {state.seconds:.2f} s*")


def view_html(state: ContextState | None) -> str:
    """The context with every source highlighted by its score for the whole answer (hover one for its score)."""
    return "" if state is None else state.attribution.to_html()


def top_sources(state: ContextState | None, k: int = TOP_SOURCES) -> str:
    """The ``k`` sources that mattered most, as a Markdown table: rank, source, score, text (shortened)."""
    if state is None:
        return ""
    rows = [f"| {rank} | {index} | {score:+.4g} | {markdown_text(shortened(' '.join(text.split()), 160))} |"
            for rank, (index, text, score) in enumerate(state.attribution.top(k), 1)]
    return "\n".join([f"**Top sources** ({state.attribution.reading} scores)", "", "| rank | source | score | text |",
                      "|---:|---:|---:|---|", *rows])
