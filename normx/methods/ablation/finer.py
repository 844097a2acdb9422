"""``budgeted``'s finer stage (``finer="sentences"``): AttriBoT's hierarchy (Liu et al., ICLR 2025) on ContextCite's
estimator, within the one budget. The sources (passages, paragraphs, documents) are scored first with a share of
the budget (:data:`COARSE_SHARE` of what is left after the whole pass); then the sentences of the :data:`REFINED`
sources that weigh most are removed in designed masks of their own, every other source kept, with the rest of the
budget, and a surrogate fitted on those masks scores each of them. A refined source's tokens get their sentences'
weights, shifted to sum to the source's own (:func:`on_footing`), every other source keeps its own: the answer's
evidence sentence stands out of its passage, at the price of fewer masks for the passages.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from normx.methods.ablation.sources import split_text, token_sources
from normx.methods.response import ResponseContext

FINER = ("none", "sentences")
COARSE_SHARE = 0.5  # of the budget left after the whole pass: the sources' masks; the rest, their sentences'
REFINED = 2  # the sources whose sentences are scored: the top ones by weight


@dataclass(frozen=True)
class Refined:
    """What the finer stage found: the sources of the rows (the refined ones replaced by their sentences, in
    order), their weights, and what it ran."""

    sources: list[list[int]]
    weights: np.ndarray
    settings: dict
    units: list[list[int]]  # the refined sources' sentences
    masks: np.ndarray  # the masks run over them


def sentences_of(ctx: ResponseContext, members: list[int]) -> list[list[int]]:
    """The sentences of one source (its tokens' indices in the sequence), each as its tokens' indices; tokens
    that fall in no sentence are left out."""
    item = ctx.item
    start, end = item.offsets[members[0]][0], item.offsets[members[-1]][1]
    spans = [(a + start, b + start) for a, b in split_text(item.text[start:end], "sentences")]
    found = token_sources(spans, [item.offsets[i] for i in members], [item.special[i] for i in members])
    return [[members[i] for i in inside] for inside in found if inside]


def reserve(ctx: ResponseContext, sources: list[list[int]], left: float) -> float:
    """The passes of the budget kept for the finer stage out of ``left`` (what the budget has after the whole
    pass and a prior): none unless ``finer="sentences"`` and a source holds more than one sentence."""
    if ctx.options.get("finer", "none") == "none" or left <= 0:
        return 0.0
    if not any(len(sentences_of(ctx, members)) > 1 for members in sources):
        return 0.0
    return (1.0 - COARSE_SHARE) * left


def refine(ctx: ResponseContext, sources: list[list[int]], weights: np.ndarray, spent: float, plan, run, fit
           ) -> Refined | None:
    """The finer stage after the sources' ``weights``: ``plan(units, spent)`` the masks the budget still buys over
    ``units`` once ``spent`` passes are paid, ``run(units, keeps)`` their outcomes (the response's log-probability
    [masks]; row 0 keeps every unit) and ``fit(keeps, outcomes)`` the units' weights. None where no source that weighs
    more than nothing holds more than one sentence."""
    order = [j for j in np.argsort(-weights, kind="stable") if weights[j] > 0]
    chosen = {}
    for j in order:
        found = sentences_of(ctx, sources[j])
        if len(found) > 1:
            chosen[int(j)] = found
        if len(chosen) == REFINED:
            break
    if not chosen:
        return None
    units = [members for j in sorted(chosen) for members in chosen[j]]
    masks = plan(units, spent)
    keeps = np.vstack([np.ones((1, len(units)), bool), masks])
    unit_weights = fit(keeps, run(units, keeps))
    out_sources, out_weights, at = [], [], 0
    for j, members in enumerate(sources):
        if j in chosen:
            count = len(chosen[j])
            out_sources += chosen[j]
            out_weights += list(on_footing(unit_weights[at:at + count], weights[j]))
            at += count
        else:
            out_sources.append(members)
            out_weights.append(weights[j])
    settings = {"sources": sorted(chosen), "sentences": [[m[0], m[-1] + 1] for m in units], "masks": len(masks),
                "sentence_weights": unit_weights.tolist(),
                "rows": "a refined source's sentences: their weights, shifted alike to sum to the source's own"}
    return Refined(out_sources, np.asarray(out_weights, np.float64), settings, units, masks)


def on_footing(found: np.ndarray, total: float) -> np.ndarray:
    """A refined source's sentence weights ``found`` (fitted with every other source kept) on the footing of the
    sources' weights: shifted, each by the same amount, to sum to the source's own weight ``total``. Their differences
    stay the fitted ones; the source's share against the other sources stays its own, as the sources' fit has it."""
    return found + (total - found.sum()) / len(found)
