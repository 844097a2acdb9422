"""The ablation methods: a response's sources (the prompt's sentences, by default) scored by forward passes with
sources removed (:mod:`~normx.methods.ablation.forwards`). Registered as response-only methods
(``Method.response_only``): :func:`normx.explain_generation` and :func:`normx.explain_context` run them on a whole
response; they explain no single prediction (``normx.explain`` refuses them).

- ``leave_one_out``: one forward pass per source with that source removed (and one with none); a source's score at
  step t is the drop in log p(y_t | y_<t) when it is removed, so its score for the response (the sum over the steps)
  is the drop in the response's log-probability.
- ``contextcite``: ContextCite's estimator (Cohen-Wang et al., 2024; ``context-cite`` 0.0.4): ``n_ablations`` random
  masks, each keeping every source with probability ``keep_probability`` (0.5), drawn as ContextCite draws them
  (mask i from ``numpy.random.RandomState(seed + i)``: seed 0 gives its masks), one forward pass each, and its
  LASSO surrogate (:func:`~normx.methods.ablation.lasso.surrogate`, alpha 0.01) of the response's
  logit-probability ``log p - log(1 - p)`` (p: the probability of the whole response). ``fit="response"`` (its
  estimator): one fit for the whole response, the rows that score split evenly over the steps; ``fit="steps"``: one
  fit per step on that token's logit-probability (ContextCite's ``get_attributions`` of a one-token range), the
  response's score their sum.

Each step's row gives each source's score spread evenly over its tokens, so that a source's score is the sum of its
tokens' entries; tokens in no source (special tokens, a chat template's scaffolding, the earlier response tokens)
score 0. Sources: ``"auto"`` (default: the prompt before its closing question and after a leading ``Context:``
label, in paragraphs where it has passages, else in sentences), ``"sentences"``, ``"paragraphs"``, ``"lines"``,
``"words"`` or ``"tokens"`` of the prompt's text (:mod:`~normx.methods.ablation.sources`), or
``[(start, end), ...]`` token spans of the prompt (what :func:`normx.explain_context` passes); the settings record
the token spans used (``source_spans``).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from normx.errors import InputWarning, InvalidInputError
from normx.methods.ablation.forwards import outcomes
from normx.methods.ablation.lasso import surrogate
from normx.methods.ablation.sources import SPLITS, auto_split, check_spans, split_text, token_sources
from normx.methods.registry import Context, Method, Option, register_method
from normx.methods.response import ResponseContext, ResponseRows
from normx.models import HeadKind

SOURCES = ("auto", *SPLITS, "tokens")
MIN_ABLATIONS = 2  # a surrogate fitted on one mask scores every source 0
# tokens per source for a cost estimate when the sources are not given as spans (English prose, SmolLM2's tokenizer)
_TOKENS_PER_SOURCE = {"auto": 20, "sentences": 20, "paragraphs": 80, "lines": 20, "words": 1.3, "tokens": 1}


def prompt_sources(ctx: ResponseContext) -> list[list[int]]:
    """The token indices of each source of the prompt (sources with no token left out)."""
    how, length, item = ctx.options["sources"], ctx.prompt_length, ctx.item
    if not isinstance(how, str):
        if max(end for _, end in how) > length:
            raise InvalidInputError(f"a source span ends after the prompt's {length} tokens: {how!r:.120}")
        return [list(range(a, b)) for a, b in how]
    start, end = _prompt_region(ctx)
    if how == "tokens":
        found = [[i] for i in range(length) if not item.special[i] and item.offsets[i][1] > item.offsets[i][0]
                 and item.offsets[i][0] < end and item.offsets[i][1] > start]
    else:
        text = item.text[start:end]
        split = auto_split(text)[1] if how == "auto" else split_text(text, how)
        spans = [(a + start, b + start) for a, b in split]
        found = [members for members in token_sources(spans, item.offsets, item.special, length) if members]
    if not found:
        raise InvalidInputError(f"the prompt has no {how} to score as sources")
    return found


def last_paragraph(ctx: ResponseContext, sources: list[list[int]]) -> list[int]:
    """The indices of the ``sources`` that begin in the prompt's last paragraph (its question, where documents come
    first: ``"Context: ...\\n\\nQuery: ..."``) when the method split the prompt itself (``sources`` a way to split
    it), the prompt has more than one paragraph and the last holds fewer of the sources' tokens than those before it
    (a question is shorter than its documents); none otherwise (sources given as spans are the user's own: the
    question is not among them)."""
    if not isinstance(ctx.options["sources"], str):
        return []
    start, end = _prompt_region(ctx)
    paragraphs = split_text(ctx.item.text[start:end], "paragraphs")
    if len(paragraphs) < 2:
        return []
    begins = start + paragraphs[-1][0]
    inside = [j for j, members in enumerate(sources) if ctx.item.offsets[members[0]][1] > begins]
    last = sum(len(sources[j]) for j in inside)
    return inside if last < sum(len(m) for m in sources) - last else []


def _prompt_region(ctx: ResponseContext) -> tuple[int, int]:
    """The characters of the decoded sequence that are the user's prompt (not a chat template around it)."""
    end = ctx.item.offsets[ctx.prompt_length - 1][1] if ctx.prompt_length else 0
    body = ctx.item.text[:end]
    for wanted in (ctx.prompt, ctx.prompt.strip()):
        at = body.find(wanted) if wanted else -1
        if at >= 0:
            return at, at + len(wanted)
    return 0, end


def spread(sources, scores: np.ndarray, total: int) -> np.ndarray:
    """Per-step rows [n, total] float64 from per-step source scores [sources, n]: each spread evenly over its
    tokens (0 for a token in no source), so that a source's tokens' entries sum to its score."""
    scores = np.asarray(scores, np.float64)
    rows = np.zeros((scores.shape[1], total))
    sizes = np.array([len(members) for members in sources])
    if len(sizes):  # every source's tokens at once (sources do not overlap)
        which = np.repeat(np.arange(len(sizes)), sizes)
        rows[:, np.concatenate([np.asarray(m, np.int64) for m in sources])] = (scores / sizes[:, None])[which].T
    return rows


def _rows(ctx: ResponseContext, sources: list[list[int]], scores: np.ndarray) -> np.ndarray:
    """:func:`spread` over the sequence's tokens, float32."""
    return spread(sources, scores, len(ctx.item.ids)).astype(np.float32)


def _spans(sources: list[list[int]]) -> list[list[int]]:
    return [[members[0], members[-1] + 1] for members in sources]


def leave_one_out(ctx: ResponseContext) -> ResponseRows:
    sources = prompt_sources(ctx)
    keeps = np.ones((len(sources) + 1, len(sources)), bool)
    keeps[np.arange(1, len(sources) + 1), np.arange(len(sources))] = False
    log_p, _, logits = outcomes(ctx, sources, keeps, "leave-one-out")
    drops = log_p[0][None] - log_p[1:]  # [sources, n]
    return ResponseRows(
        _rows(ctx, sources, drops), logits, {"log_probability": log_p[0].tolist()},
        {"scope": "response", "source_spans": _spans(sources),
         "rows": "step t: each source's drop in log p(y_t | y_<t) when it is removed, spread evenly over its tokens"})


def ablation_masks(sources: int, count: int, keep: float, seed: int) -> np.ndarray:
    """ContextCite's masks: row i from ``numpy.random.RandomState(seed + i)``, each source kept with ``keep``."""
    return np.stack([np.random.RandomState(seed + i).choice([False, True], size=sources, p=[1 - keep, keep])
                     for i in range(count)])


def response_logit_probability(log_p: np.ndarray) -> np.ndarray:
    """ContextCite's outcome of a response: ``log p - log(1 - p)`` from the tokens' log-probabilities [..., n]."""
    total = np.minimum(log_p.sum(-1), -1e-12)
    return total - np.log(-np.expm1(total))


def contextcite(ctx: ResponseContext) -> ResponseRows:
    options = ctx.options
    sources = prompt_sources(ctx)
    masks = ablation_masks(len(sources), options["n_ablations"], options["keep_probability"], options["seed"])
    fixed = [j for j in range(len(sources)) if masks[:, j].all() or not masks[:, j].any()]
    if fixed:
        warnings.warn(f"{len(fixed)} of the {len(sources)} sources (source {', '.join(map(str, fixed[:8]))}"
                      f"{' ...' if len(fixed) > 8 else ''}) are kept, or removed, in every one of the "
                      f"{len(masks)} masks: their scores say nothing (0); give more n_ablations", InputWarning,
                      stacklevel=2)
    log_p, logit_p, logits = outcomes(ctx, sources, np.vstack([np.ones((1, len(sources)), bool), masks]),
                                      "contextcite")
    n, alpha = ctx.steps, options["lasso_alpha"]
    if options["fit"] == "response":
        weights, bias = surrogate(masks, response_logit_probability(log_p[1:]), n, alpha)
        per_step = np.repeat(weights[:, None] / n, n, axis=1)
        how = "the whole response's surrogate weights, each split evenly over the steps and over its tokens"
    else:
        fits = [surrogate(masks, logit_p[1:, t], 1, alpha) for t in range(n)]
        per_step = np.stack([w for w, _ in fits], axis=1) if fits else np.zeros((len(sources), 0))
        bias = float(sum(b for _, b in fits))
        how = "step t: the surrogate of token t's logit-probability, each source's weight spread over its tokens"
    return ResponseRows(_rows(ctx, sources, per_step), logits, {"log_probability": log_p[0].tolist()},
                        {"scope": "response", "source_spans": _spans(sources), "surrogate_bias": bias, "rows": how})


# ---- registration ----------------------------------------------------------------------------------------------

def _check(options: dict[str, Any]) -> dict[str, Any]:
    sources = options["sources"]
    if not (isinstance(sources, str) and sources in SOURCES):
        if isinstance(sources, str):
            raise InvalidInputError(f"sources={sources!r} is not allowed; use one of {SOURCES} or a list of "
                                    "(start, end) token spans")
        options["sources"] = check_spans(sources)
    if "n_ablations" in options and options["n_ablations"] < MIN_ABLATIONS:
        raise InvalidInputError(f"n_ablations must be at least {MIN_ABLATIONS} (a surrogate fitted on one mask scores "
                                f"every source 0), got {options['n_ablations']}")
    if "keep_probability" in options and not 0 < options["keep_probability"] < 1:
        raise InvalidInputError(f"keep_probability must be between 0 and 1, got {options['keep_probability']}")
    if "lasso_alpha" in options and options["lasso_alpha"] < 0:
        raise InvalidInputError(f"lasso_alpha must be >= 0, got {options['lasso_alpha']}")
    if options["internal_batch_size"] is not None and options["internal_batch_size"] < 1:
        raise InvalidInputError(f"internal_batch_size must be a positive integer or None, got "
                                f"{options['internal_batch_size']}")
    return options


def source_count(tokens: int, options) -> int:
    """The number of sources: exact for given spans, else an estimate from the prompt's length."""
    sources = options["sources"]
    if not isinstance(sources, str):
        return len(sources)
    return max(1, math.ceil(tokens / _TOKENS_PER_SOURCE[sources]))


def _distinct_masks(sources, drawn: int) -> int:
    """The forward passes of ``drawn`` random masks and the full prompt: with the sources given as spans, at most
    their 2^sources distinct masks (a mask drawn twice runs once); else ``1 + drawn``."""
    if isinstance(sources, str) or len(sources) >= 30:
        return 1 + drawn
    return min(1 + drawn, 2 ** len(sources))


def _refuse(ctx: Context):
    raise InvalidInputError("this method scores the sources of a causal LM's whole response, not one prediction: "
                            "use normx.explain_generation(..., method=NAME) or normx.explain_context")


def _supports(adapter) -> str | None:
    if adapter.kind is not HeadKind.CAUSAL_LM:
        return f"it scores what a causal LM writes, and this model has a {adapter.kind.value.replace('_', ' ')} head"
    return None


SOURCES_OPTION = Option("sources", "auto", "the prompt's parts to score: auto (the prompt before its closing question, "
                        "in paragraphs where it has passages, else in sentences), sentences, paragraphs, lines, words, "
                        "tokens, or a list of (start, end) token spans")
BATCH_OPTION = Option("internal_batch_size", None, "ablated sequences per forward pass (None: explain_generation's "
                      "batch_size)", int, none=True)
COMMON = {"label_dependent": True, "layered": False, "predicts": True, "reading": "signed", "supports": _supports,
          "response_only": True, "check_options": _check, "diagnostics": ("log_probability",)}

register_method(Method(
    "leave_one_out", _refuse,
    "Leave-one-out over sources: a source's score is the drop in the response's log-probability when its tokens "
    "are removed from the prompt (one forward pass per source, and one with all)",
    display="Leave-one-out", response=leave_one_out, options=[SOURCES_OPTION, BATCH_OPTION],
    cost=lambda tokens, targets, options: 1 + source_count(tokens, options), **COMMON))
register_method(Method(
    "contextcite", _refuse,
    "ContextCite's estimator: n_ablations random masks of the sources (each kept with p = 0.5, seeded), one "
    "forward pass each, and a LASSO surrogate of the response's logit-probability; a source's score is its weight",
    display="ContextCite", response=contextcite,
    options=[SOURCES_OPTION, Option("n_ablations", 64, "random source masks (one forward pass each)", int),
             Option("keep_probability", 0.5, "the probability that a mask keeps a source", float),
             Option("seed", 0, "mask i is drawn from numpy.random.RandomState(seed + i)", int),
             Option("lasso_alpha", 0.01, "the LASSO's L1 weight (on standardised masks, as ContextCite)", float),
             Option("fit", "response", "response: one surrogate of the whole response (ContextCite's); steps: one "
                    "per response token", str, ("response", "steps")), BATCH_OPTION],
    cost=lambda tokens, targets, options: _distinct_masks(options["sources"], options["n_ablations"]), **COMMON))
