"""``budgeted``: ContextCite's estimator within a cost the user sets, in forward passes.

One pass over the whole sequence, its key-value cache kept; then designed source masks (two-level designs,
:mod:`normx.methods.ablation.designs`: :func:`plan_masks`), each run only from its first removed source on
(:mod:`normx.methods.ablation.prefix`: a mask that keeps the first sources costs only the rest), as many as the
budget pays for; and a linear surrogate of the response's log-probability fitted on them (:func:`surrogate`: on the
log of its negative log-likelihood, weights in nats). A source's score is its weight.

The budget counts the model's work in forward passes over the prompt and the response: the whole pass is one, a mask
the tokens it runs (its kept tokens from its first removed source on, and the response) over the sequence's. Named
budgets: ``"fast"`` (:data:`BUDGETS`), ``"balanced"`` (the default), ``"faithful"``. Where the model's cache cannot be
cut (:func:`normx.methods.ablation.prefix.verified`), the masks run whole and cost their kept tokens.

Where the masks cannot tell every source apart (the budget buys no more masks than there are sources): without a
prior, adjacent sources are removed in groups, as many groups as the masks tell apart (``coarse="auto"``,
:func:`coarse`; a group's weight spread over its tokens). A prior (``prior="auto"``: ``calibrated_attention``'s
scores, where the model has calibrated weights, stored or shipped, and the budget buys no mask after them, as
``"fast"``; ``"calibrated_attention"``: always; ``"none"``): its one-pass reading is run first and its cost taken
from the budget; the surrogate then shrinks towards the prior, scaled by the masks (:func:`fit`), so a source no mask
varied still gets the prior's share, and a budget that buys no masks after it returns the prior's scores.

With ``rereads="auto"`` (not the default: on the training contexts it read no better), where re-reading the masks
and more costs at most two real masks (long prompts, whose question and answer are a small share of them:
:mod:`normx.methods.ablation.rereads`), the plan's last real masks pay for re-reads on the whole pass's cache, and
the weights are the re-reads' surrogate corrected by the real masks
(:func:`~normx.methods.ablation.surrogate_fit.with_rereads`): every source scored, even where the masks remove groups.

Sources, by default (``sources="auto"``): the prompt before its closing question (the short lines at its end), split
into paragraphs when it has passages, else into sentences (:func:`normx.methods.ablation.sources.auto_split`). With
``finer="sentences"`` the sources get half of what the budget has after the whole pass, and the sentences of the two
that weigh most the rest (:mod:`normx.methods.ablation.finer`).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import numpy as np

from normx.errors import InvalidInputError
from normx.methods.ablation import (
    BATCH_OPTION,
    COMMON,
    SOURCES_OPTION,
    _check,
    _refuse,
    _rows,
    _spans,
    finer,
    prompt_sources,
    rereads,
)
from normx.methods.ablation.forwards import outcomes
from normx.methods.ablation.planning import (
    SPEND,
    Costs,
    buys_more,
    masks_cost,
    plan_masks,
    shared_prior_cost,
    whole_cost,
)
from normx.methods.ablation.prefix import Prefix, pass_rows, tolerance, verified, whole_rows
from normx.methods.ablation.surrogate_fit import (
    HUBER,
    LOSSES,
    PRIOR_RIDGE,
    RIDGE,
    ROUNDS,
    TINY_NLL,
    fit,
    group_columns,
    spread,
    surrogate,
    with_rereads,
)
from normx.methods.calibrated.readings import presence_first_row
from normx.methods.registry import Method, Option, register_method
from normx.methods.response import ResponseContext, ResponseRows

__all__ = ["BUDGETS", "HUBER", "LOSSES", "PRIOR_RIDGE", "RIDGE", "ROUNDS", "TINY_NLL", "budget_value", "fit",
           "surrogate"]  # (the surrogate's, kept importable from here)

BUDGETS = {"fast": 2.0, "balanced": 6.0, "faithful": 24.0}
PRIORS = ("auto", "calibrated_attention", "none")
# a prior whose weights read only these families runs on the whole pass's cache (its presence pass's last rows)
SHAREABLE = {"tokens", "presence", "response_norm"}


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


def coarse(sources: list[list[int]], count: int) -> list[list[int]]:
    """``count`` groups of adjacent sources (the indices of the sources in each), each about an equal share of the
    sources' tokens (``count`` at most the sources)."""
    ends = np.cumsum([len(members) for members in sources])
    bounds = [0]
    for k in range(1, count):  # each cut nearest its share, leaving a source for every group after it
        low, high = bounds[-1] + 1, len(sources) - (count - k)
        target = ends[-1] * k / count
        bounds.append(min(range(low, high + 1), key=lambda i: (abs(ends[i - 1] - target), i)))
    bounds.append(len(sources))
    return [list(range(a, b)) for a, b in pairwise(bounds)]


def _merged(sources: list[list[int]], groups: list[list[int]]) -> list[list[int]]:
    """Each group's sources' tokens, as one source."""
    return [[i for j in group for i in sources[j]] for group in groups]


def _grouped(ctx: ResponseContext, sources: list[list[int]], costs: Costs, per_pass: int,
             bought: int, spent: float, shared: bool) -> tuple[list[list[int]], np.ndarray] | None:
    """The most groups of adjacent sources (:func:`coarse`) that the masks the budget buys tell apart (more masks
    than groups, counted on a cut cache; found by bisection), where it buys no more masks than there are sources
    (``bought``) and the ``coarse`` option allows it, and the masks planned for them (``shared``: on a cut cache);
    else None."""
    if ctx.options["coarse"] == "none" or bought > len(sources) or len(sources) < 3:
        return None
    budget, seed = budget_value(ctx.options["budget"]), ctx.options["seed"]

    counted: dict[int, dict] = {}  # (each number of groups' candidates counted so far)

    def merged(count: int) -> list[list[int]]:
        return _merged(sources, coarse(sources, count))

    low, high = 2, len(sources) - 1  # (two groups: the least a surrogate can split)
    while low < high:  # (bisection: the most groups whose plan buys more masks than groups)
        middle = (low + high + 1) // 2
        more = buys_more(merged(middle), middle, ctx.prompt_length, ctx.steps, budget, seed, costs, per_pass, spent,
                         counted.setdefault(middle, {}))
        low, high = (middle, high) if more else (low, middle - 1)
    return coarse(sources, low), plan_masks(merged(low), ctx.prompt_length, ctx.steps, budget, seed, shared, costs,
                                            per_pass, spent, counted.get(low) if shared else None)


def _prior(ctx: ResponseContext, sources: list[list[int]], costs: Costs, per_pass: int
           ) -> tuple[str, float, bool, bool]:
    """The prior this call reads (``"calibrated_attention"`` or ``"none"``), its cost in forward passes, whether the
    budget buys masks after the whole pass and it, and whether it can continue from the whole pass's cache (its
    weights read only the presence pass's families, :data:`SHAREABLE`): then it is costed as it runs beside masks
    (:func:`~normx.methods.ablation.planning.shared_prior_cost`); alone (no masks after it) it runs its own passes.
    ``auto``: the calibrated reading where the model has weights for it and the budget buys no mask after it (the
    ``"fast"`` budget): there its scores beat the few masks the budget buys alone; where it buys masks after the
    prior, the masks (over groups of sources where they cannot tell every source apart) did better than the prior
    with fewer masks (docs/context.md)."""
    from normx.methods.calibrated import NAME, load_weights

    if not _wants_prior(ctx):
        return "none", 0.0, True, False
    n, total = ctx.steps, len(ctx.item.ids)
    shareable = set(load_weights(ctx.model, ctx.adapter, None)[0]["families"]) <= SHAREABLE
    cost = (shared_prior_cost(total, presence_first_row(total, ctx.prompt_length, sources), n, costs) if shareable
            else _own_prior_cost(ctx))
    budget = budget_value(ctx.options["budget"])
    least = plan_masks(sources, ctx.prompt_length, n, budget, ctx.options["seed"], True, costs, per_pass,
                       spent=cost)  # (on a cut cache: the least the masks can cost)
    after = SPEND * budget >= cost + whole_cost(ctx.prompt_length, n, costs) + masks_cost(
        sources, least, ctx.prompt_length, n, True, costs, per_pass)
    if ctx.options["prior"] == "auto" and after:
        return "none", 0.0, True, False
    return NAME, cost, after, shareable


def _own_prior_cost(ctx: ResponseContext) -> float:
    """The prior's cost in forward passes run on its own (its prompt pass too)."""
    from normx.methods.calibrated import NAME
    from normx.methods.registry import get_method

    return float(get_method(NAME).cost(len(ctx.item.ids), ctx.steps, {}))


def _wants_prior(ctx: ResponseContext) -> bool:
    """Whether the call may read a prior: asked for, or ``auto`` where the model has calibrated weights."""
    from normx.methods.calibrated import weights as stored

    choice = ctx.options["prior"]
    return choice != "none" and (choice != "auto" or stored.available(ctx.model))


def _prior_scores(ctx: ResponseContext, sources: list[list[int]], prefix: Prefix | None
                  ) -> tuple[np.ndarray, ResponseRows]:
    """``calibrated_attention``'s score of each source (its rows summed over its tokens and the steps), and its
    rows; continued from the whole pass ``prefix`` where given."""
    from normx.methods.calibrated import calibrated

    found = calibrated(replace(ctx, options={**ctx.options, "sources": _spans(sources), "weights": None}), prefix)
    rows = np.asarray(found.rows, np.float64)
    return np.array([rows[:, members].sum() for members in sources]), found


def budgeted(ctx: ResponseContext) -> ResponseRows:
    from normx.methods.calibrated import NAME

    sources = prompt_sources(ctx)
    budget = budget_value(ctx.options["budget"])
    costs = Costs.of(ctx.model)
    n = ctx.steps
    per_pass = pass_rows(ctx)
    prior_name, prior_cost, after, shareable = _prior(ctx, sources, costs, per_pass)
    settings = {"scope": "response", "source_spans": _spans(sources), "budget": budget, "prior": prior_name}
    if prior_name != "none" and not after:  # the prior alone, on its own passes
        prior, found = _prior_scores(ctx, sources, None)
        settings |= {"prior_scores": prior.tolist(), "prior_shared": False, "masks": 0,
                     "passes": round(_own_prior_cost(ctx), 3), "shared_prefix": False,
                     "rows": "the prior's rows: the budget buys no masks after it"}
        return ResponseRows(found.rows, found.logits, {}, settings)
    whole = Prefix(ctx, values=NAME if shareable else None)  # (the prior's value vectors: NormRows)
    cut = verified(ctx, whole, tolerance(whole))
    per_pass = per_pass if cut else whole_rows(ctx)  # (masks run whole: fewer a pass on a long prompt)
    prior, planned = None, None
    if prior_name != "none":
        shared = cut and shareable
        prior_cost = prior_cost if shared else _own_prior_cost(ctx)
        prior, found = _prior_scores(ctx, sources, whole if shared else None)
        settings |= {"prior_scores": prior.tolist(), "prior_shared": shared}
    kept = finer.reserve(ctx, sources, SPEND * budget - prior_cost - whole_cost(ctx.prompt_length, n, costs))
    own, groups = sources, None
    if prior_name == "none":  # sources the masks cannot tell apart: removed in groups of adjacent ones
        planned = plan_masks(sources, ctx.prompt_length, n, budget, ctx.options["seed"], cut, costs, per_pass, kept)
        grouped = _grouped(ctx, sources, costs, per_pass, len(planned), kept, cut)
        if grouped is not None:
            groups, planned = grouped
            sources = _merged(sources, groups)
            settings["groups"] = groups
    masks = planned if planned is not None else plan_masks(  # (planned already where no prior was read)
        sources, ctx.prompt_length, n, budget, ctx.options["seed"], cut, costs, per_pass, spent=prior_cost + kept)
    reread = None  # (re-reads beside the real masks, where they cost at most two real masks: long prompts)
    if ctx.options["rereads"] == "auto" and cut and prior is None and not kept:
        reread = rereads.bought(own, sources, masks, ctx.prompt_length, n, ctx.options["seed"], costs, per_pass)
        masks = masks if reread is None else masks[:reread.real]
    keeps = np.vstack([np.ones((1, len(sources)), bool), masks])
    log_p, _, logits = outcomes(ctx, sources, keeps, "budgeted", shared_prefix=whole if cut else False)
    loss = ctx.options["loss"]
    spent = prior_cost + masks_cost(sources, masks, ctx.prompt_length, n, cut, costs, per_pass)
    if reread is None:
        weights = surrogate(keeps, log_p.sum(1), prior, loss=loss)  # the whole pass's outcome too: a mask keeping all
    else:
        weights, settings["rereading"] = _beside(whole, own, groups, keeps, log_p.sum(1), reread, loss)
        sources, spent = own, spent + reread.cost
    settings |= {"masks": len(masks), "shared_prefix": cut, "design": keeps.astype(int).tolist(),
                 "outcomes": log_p.sum(1).tolist(),
                 "rows": "the response's surrogate weights, each split evenly over the steps and over its tokens"}
    refined = None if not kept else finer.refine(
        ctx, sources, weights, spent,
        lambda units, paid: plan_masks(units, ctx.prompt_length, n, budget, ctx.options["seed"], cut, costs, per_pass,
                                       paid),
        lambda units, unit_keeps: outcomes(ctx, units, unit_keeps, "budgeted, sentences",
                                           shared_prefix=whole if cut else False)[0].sum(1),
        lambda unit_keeps, found: surrogate(unit_keeps, found, loss=loss))
    if refined is not None:
        sources, weights = refined.sources, refined.weights
        spent += masks_cost(refined.units, refined.masks, ctx.prompt_length, n, cut, costs, per_pass)
        settings["refined"] = refined.settings
    spent += whole_cost(ctx.prompt_length, n, costs)
    settings["passes"] = round(spent, 3)
    per_step = np.repeat(weights[:, None] / n, n, axis=1)
    # (a group's weight spread evenly over its tokens, as a source's is)
    return ResponseRows(_rows(ctx, sources, per_step), logits, {"log_probability": log_p[0].tolist()}, settings)


def _beside(whole: Prefix, sources: list[list[int]], groups: list[list[int]] | None, keeps: np.ndarray,
            real: np.ndarray, reread: rereads.Bought, loss: str) -> tuple[np.ndarray, dict]:
    """The sources' weights from the real masks (``keeps`` of the sources, or of their ``groups``; ``real`` their
    outcomes) read beside the re-reads of the same masks and of the extra ones
    (:func:`~normx.methods.ablation.surrogate_fit.with_rereads`), and what ran, for the settings."""
    groups = groups or [[j] for j in range(len(sources))]
    on_sources = keeps[:, group_columns(groups)]  # (each source as its group)
    found = rereads.reread_log_p(whole, sources, np.vstack([on_sources[1:], reread.extra]), reread.first).sum(1)
    weights = with_rereads(keeps, real, on_sources, found, reread.extra,
                           spread(groups, [len(members) for members in sources]), loss)
    return weights, {"first_row": reread.first, "masks": len(found), "extra": reread.extra.astype(int).tolist(),
                     "outcomes": found.tolist(), "passes": round(reread.cost, 3)}


def _check_budget(options: dict) -> dict:
    options = _check(options)
    budget_value(options["budget"])
    return options


register_method(Method(
    "budgeted", _refuse,
    "ContextCite within a budget: one pass with its cache kept, then as many designed source masks as the budget "
    "(in forward passes) pays for, each run from its first removed source on, and a robust (Huber) ridge surrogate of "
    "the response's log-probability (towards a one-pass prior, or over groups of adjacent sources, where the masks "
    "cannot tell the sources apart); a source's score is its weight",
    display="Budgeted ablations", response=budgeted,
    options=[SOURCES_OPTION,
             Option("budget", "balanced", f"forward passes to spend (>= 1), or {', '.join(map(repr, BUDGETS))} "
                    f"({', '.join(f'{v:g}' for v in BUDGETS.values())})"),
             Option("prior", "auto", "a one-pass reading the surrogate shrinks towards, its cost taken from the "
                    "budget: auto (calibrated_attention's scores alone where the model has calibrated weights and "
                    "the budget buys no mask after them, else none), calibrated_attention, none", str,
                    choices=PRIORS),
             Option("coarse", "auto", "without a prior, where the budget buys no more masks than there are "
                    "sources: auto (remove adjacent sources in groups, as few as the masks tell apart; a group's "
                    "score spread over its tokens), none (every source on its own)", str, choices=("auto", "none")),
             Option("finer", "none", "sentences: score the sources (passages) with half of the budget after the "
                    "whole pass, then the sentences of the two that weigh most with the rest (AttriBoT's hierarchy); "
                    "none", str, choices=finer.FINER),
             Option("rereads", "none", "on a cut cache, without a prior or the finer stage: auto (where re-reading "
                    f"the real masks and {rereads.EXTRA} more, the question's and the response's rows only, costs at "
                    f"most {rereads.WORTH:g} real masks, as on long prompts: real masks left out to pay for them, the "
                    "re-reads read as a covariate, every source scored even where the masks remove groups; on "
                    "training contexts no better than none, docs/context.md), none", str, choices=("auto", "none")),
             Option("loss", "huber", "the surrogate's fit: huber (a mask far off the linear surrogate counts as if "
                    "it lay at Huber's corner, 1.345 robust deviations; chosen on training contexts), squares (least "
                    "squares)", str, choices=LOSSES),
             Option("seed", 0, "designs drawn from seed * 8 on", int), BATCH_OPTION],
    cost=lambda tokens, targets, options: budget_value(options["budget"]),
    **{**COMMON, "check_options": _check_budget}))
