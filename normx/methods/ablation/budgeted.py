"""``budgeted``: ContextCite's estimator within a cost the user sets, in forward passes.

One pass over the whole sequence, its key-value cache kept; then ContextCite's random masks (mask i from
``numpy.random.RandomState(seed + i)``, each source kept with probability 0.5), each run only from its first removed
source on (:mod:`normx.methods.ablation.prefix`: a mask that keeps the first sources costs only the rest), drawn one
after another while their cost stays within the budget; and a linear surrogate of the response's log-probability fitted
on them (:func:`fit`). A source's score is its weight.

The budget counts the model's work in forward passes over the prompt and the response: the whole pass is one, a mask
the tokens it runs (its kept tokens from its first removed source on, and the response) over the sequence's. Named
budgets: ``"fast"`` (:data:`BUDGETS`), ``"balanced"`` (the default), ``"faithful"``. Where the model's cache cannot be
cut (:func:`normx.methods.ablation.prefix.verified`), the masks run whole and cost their kept tokens.

Sources, by default (``sources="auto"``): the prompt before its closing question (the short lines at its end), split
into paragraphs when it has passages, else into sentences (:func:`normx.methods.ablation.sources.auto_split`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from normx.errors import InvalidInputError
from normx.methods.ablation import (
    BATCH_OPTION,
    COMMON,
    MIN_ABLATIONS,
    SOURCES_OPTION,
    _check,
    _refuse,
    _rows,
    _spans,
    designs,
    prompt_sources,
)
from normx.methods.ablation.forwards import outcomes
from normx.methods.registry import Method, Option, register_method
from normx.methods.response import ResponseContext, ResponseRows

BUDGETS = {"fast": 2.0, "balanced": 6.0, "faithful": 24.0}
# the share of the budget the plan spends on the work it counts: on SmolLM2 on this CPU the calls ran 0.9-1.15x the
# counted work (the masked attention, Python around the passes), so a budget of 6 is kept at about 6 measured
SPEND = 0.9
CANDIDATES = 8  # designs drawn per call, the one that buys the most masks within the budget kept
MAX_MASKS = 4096  # a budget past what the masks can use: ContextCite's estimator saturates long before
RIDGE = 0.01  # the surrogate's ridge penalty on the centred masks (chosen on training contexts: docs/context.md)


def budget_option(text: str) -> float | str:
    """A budget as a command line or a label gives it (``"12"``, ``"fast"``): a number of passes, or the name;
    checked (:func:`budget_value`)."""
    try:
        given = float(text) if text.strip()[:1].isdigit() else text
    except ValueError:
        given = text
    budget_value(given)
    return given


def budget_value(budget) -> float:
    """A budget in forward passes from a number (>= 1, or its text) or a name in :data:`BUDGETS`."""
    if isinstance(budget, str) and budget not in BUDGETS:
        try:
            budget = float(budget)
        except ValueError:
            pass
    if isinstance(budget, str):
        if budget not in BUDGETS:
            raise InvalidInputError(f"budget={budget!r} is not a named budget; use one of {tuple(BUDGETS)} or a number "
                                    "of forward passes >= 1")
        return BUDGETS[budget]
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not np.isfinite(budget) or budget < 1:
        raise InvalidInputError(f"budget must be a number of forward passes >= 1 or one of {tuple(BUDGETS)}, "
                                f"got {budget!r}")
    return float(budget)


@dataclass(frozen=True)
class Costs:
    """The model's work per token, in multiply-adds x 2: ``body`` (the blocks' weights), ``head`` (the LM head, which
    a plain forward runs at every position and an ablated pass at the response's only) and ``attention`` (per key a
    query reads, all blocks together)."""

    body: float
    head: float
    attention: float

    @classmethod
    def of(cls, model) -> Costs:
        head_module = model.get_output_embeddings()
        inputs = model.get_input_embeddings()
        head = float(head_module.weight.numel()) if head_module is not None else 0.0
        skip = {id(p) for m in (head_module, inputs) if m is not None for p in m.parameters()}
        body = float(sum(p.numel() for p in model.parameters() if id(p) not in skip))
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        width = getattr(config, "hidden_size", 0) or 0
        blocks = getattr(config, "num_hidden_layers", 0) or 0
        return cls(2 * body, 2 * head, 4.0 * width * blocks)

    def tokens(self, positions: np.ndarray) -> float:
        """The work of running tokens at these positions (no head)."""
        return float(len(positions) * self.body + self.attention * (positions + 1).sum())

    def continued(self, begin: int, count: int) -> float:
        """``count`` tokens run after ``begin`` cached ones through an explicit mask (a masked pass on a cut cache):
        every query reads every key of the pass, ``begin + count``, where a causal pass's kernel reads only those
        before it (on 2,000-token prompts the triangle undercounted these passes by about a fifth)."""
        return float(count * self.body + self.attention * count * (begin + count))

    def plain(self, total: int) -> float:
        """A plain forward pass over ``total`` tokens, logits at every position."""
        return self.tokens(np.arange(total)) + total * self.head


def mask_costs(sources: list[list[int]], masks: np.ndarray, prompt_length: int, steps: int, shared: bool,
               costs: Costs, per_pass: int = 1) -> np.ndarray:
    """Each mask's cost in plain forward passes over the ``prompt_length + steps`` tokens: the tokens it runs
    (``shared``: its kept tokens from its first removed one on; else all its kept tokens) at their positions, the
    response's, the head at the response's positions, and its share of a forward pass's own cost (reading the weights:
    :data:`~normx.methods.ablation.prefix.CALL_ROWS` rows a pass, ``per_pass`` masks a pass)."""
    from normx.methods.ablation.prefix import CALL_ROWS

    owner = np.full(prompt_length, -1)
    for j, members in enumerate(sources):
        owner[members] = j
    plain = costs.plain(prompt_length + steps)
    out = np.zeros(len(masks))
    for m, keep in enumerate(np.asarray(masks, bool)):
        kept = (owner < 0) | keep[np.maximum(owner, 0)]
        if kept.all():
            continue
        begin = int(np.argmin(kept)) if shared else 0
        count = int(kept[begin:].sum()) + steps
        work = costs.continued(begin, count) if shared else costs.tokens(np.arange(count))
        out[m] = (work + steps * costs.head + CALL_ROWS / per_pass * costs.body) / plain
    return out


def plan_masks(sources: list[list[int]], prompt_length: int, steps: int, budget: float, seed: int, shared: bool,
               costs: Costs, per_pass: int = 1) -> np.ndarray:
    """The masks :data:`SPEND` of the budget buys after the whole pass (at least :data:`MIN_ABLATIONS`): resolution IV
    designs where one fits, or all but one of its masks (:func:`normx.methods.ablation.designs.masks`,
    ``"fold_over"``), else a resolution III design and as many of its rows' complements as fit (``"screening"``):
    on the training contexts
    (docs/context.md) a whole fold-over beat the screening design and its complements at 15-16 masks, and lost to it
    below. Of :data:`CANDIDATES` equally good designs (seeds ``seed * CANDIDATES`` on), the one whose masks' costs
    buy the most: which sources a design removes first decides what its masks cost."""
    total = prompt_length + steps
    left = SPEND * budget - (costs.tokens(np.arange(total)) + steps * costs.head) / costs.plain(total)

    def affordable(kind: str, limit: int, drawn: int) -> int:
        spent, count = 0.0, 0
        while count < limit:
            block = designs.masks(len(sources), min(count + 64, limit), drawn, kind)[count:]
            for cost in mask_costs(sources, block, prompt_length, steps, shared, costs, per_pass):
                if count >= MIN_ABLATIONS and spent + cost > left:
                    return count
                spent += cost
                count += 1
        return count

    candidates = range(seed * CANDIDATES, (seed + 1) * CANDIDATES)
    whole = designs.block(len(sources), "fold_over")
    for kind in ("fold_over", "screening"):
        bought = {drawn: affordable(kind, MAX_MASKS, drawn) for drawn in candidates}
        drawn = max(candidates, key=lambda d: (bought[d], -d))  # the design that buys the most masks
        if kind == "screening" or (whole and bought[drawn] >= whole - 1):  # resolution IV, or all but one mask
            return designs.masks(len(sources), bought[drawn], drawn, kind)
    raise AssertionError("unreachable")


def fit(masks: np.ndarray, log_p: np.ndarray) -> np.ndarray:
    """Each source's weight in a least-squares surrogate of the response's log-probability (``log_p`` [masks]) on
    the masks (centred, with a small ridge :data:`RIDGE` for designs cut short; a source kept or removed in every
    mask weighs 0)."""
    x = np.asarray(masks, np.float64)
    x = x - x.mean(0)
    y = np.asarray(log_p, np.float64)
    y = y - y.mean()
    live = np.flatnonzero(x.std(0) > 0)
    weights = np.zeros(x.shape[1])
    if len(live):
        xl = x[:, live]
        weights[live] = np.linalg.solve(xl.T @ xl + RIDGE * np.eye(len(live)), xl.T @ y)
    return weights


def budgeted(ctx: ResponseContext) -> ResponseRows:
    import normx.methods.ablation.prefix as shared

    sources = prompt_sources(ctx)
    budget = budget_value(ctx.options["budget"])
    whole = shared.Prefix(ctx)
    cut = shared.verified(ctx, whole, shared.tolerance(whole))
    costs = Costs.of(ctx.model)
    per_pass = ctx.handle.rows_per_pass(int(ctx.options.get("internal_batch_size") or ctx.batch_size))
    masks = plan_masks(sources, ctx.prompt_length, ctx.steps, budget, ctx.options["seed"], cut, costs, per_pass)
    keeps = np.vstack([np.ones((1, len(sources)), bool), masks])
    log_p, _, logits = outcomes(ctx, sources, keeps, "budgeted", shared_prefix=whole if cut else False)
    weights = fit(keeps, log_p.sum(1))  # the whole pass's outcome too: a mask that keeps every source, for free
    n = ctx.steps
    per_step = np.repeat(weights[:, None] / n, n, axis=1)
    total = ctx.prompt_length + n
    spent = ((costs.tokens(np.arange(total)) + n * costs.head) / costs.plain(total)
             + float(mask_costs(sources, masks, ctx.prompt_length, n, cut, costs, per_pass).sum()))
    return ResponseRows(_rows(ctx, sources, per_step), logits, {"log_probability": log_p[0].tolist()},
                        {"scope": "response", "source_spans": _spans(sources), "budget": budget, "masks": len(masks),
                         "passes": round(spent, 3), "shared_prefix": cut,
                         "rows": "the response's surrogate weights, each split evenly over the steps and over its "
                                 "tokens"})


def _check_budget(options: dict) -> dict:
    options = _check(options)
    budget_value(options["budget"])
    return options


register_method(Method(
    "budgeted", _refuse,
    "ContextCite within a budget: one pass with its cache kept, then as many of ContextCite's random source masks "
    "as the budget (in forward passes) pays for, each run from its first removed source on, and a ridge surrogate "
    "of the response's log-probability; a source's score is its weight",
    display="Budgeted ablations", response=budgeted,
    options=[SOURCES_OPTION,
             Option("budget", "balanced", f"forward passes to spend (>= 1), or {', '.join(map(repr, BUDGETS))} "
                    f"({', '.join(f'{v:g}' for v in BUDGETS.values())})"),
             Option("seed", 0, "mask i is drawn from numpy.random.RandomState(seed + i)", int), BATCH_OPTION],
    cost=lambda tokens, targets, options: budget_value(options["budget"]),
    **{**COMMON, "check_options": _check_budget}))
