"""What ``budgeted``'s passes cost and which masks a budget buys: the model's work per token (:class:`Costs`), a
mask's cost in plain forward passes (:func:`mask_costs`: on a cut cache only its tokens from its first removed source
on), the masks' together as they run (:func:`masks_cost`: their shared stems once, each pass's attention as it reads
it), the whole pass's (:func:`whole_cost`), the presence prior's on the whole pass's cache
(:func:`shared_prior_cost`), and the designed masks a budget pays for (:func:`plan_masks`; whether they number more
than a count, :func:`buys_more`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from normx.methods.ablation import MIN_ABLATIONS, designs, stems
from normx.methods.ablation.prefix import CALL_ROWS, WINDOW, chunks

# the share of the budget the plan spends on the work it counts: on SmolLM2 on a 2-core CPU the calls ran 0.9-1.15x
# the counted work (the masked attention, Python around the passes; a median 1.00 on 182 held-out sentence contexts,
# 1.06 on 146 passage ones), so a budget of 6 measured a median 5.3x and 5.7x a forward there (docs/context.md)
SPEND = 0.9
CANDIDATES = 8  # designs drawn per call, the one that buys the most masks within the budget kept
MAX_MASKS = 4096  # a budget past what the masks can use: ContextCite's estimator saturates long before
MATERIALIZED_KEYS = 3000  # attention read whole costs 1 + keys / this per key beside a forward's (shared_prior_cost)


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

    def continued(self, begin, count):
        """``count`` tokens run after ``begin`` cached ones through an explicit mask (a masked pass on a cut cache),
        :data:`~normx.methods.ablation.prefix.WINDOW` at a time: every query of a window reads every key up to the
        window's end, where a causal pass's kernel reads only those before it (on 2,000-token prompts the triangle
        undercounted these passes by about a fifth). Numbers or arrays of them alike."""
        full, rest = np.divmod(count, WINDOW)
        keys = full * WINDOW * begin + WINDOW * WINDOW * full * (full + 1) // 2 + rest * (begin + count)
        return count * self.body + self.attention * keys

    def plain(self, total: int) -> float:
        """A plain forward pass over ``total`` tokens, logits at every position."""
        return self.tokens(np.arange(total)) + total * self.head


def mask_costs(sources: list[list[int]], masks: np.ndarray, prompt_length: int, steps: int, shared: bool,
               costs: Costs, per_pass: int = 1) -> np.ndarray:
    """Each mask's cost in plain forward passes over the ``prompt_length + steps`` tokens: the tokens it runs
    (``shared``: its kept tokens from its first removed one on; else all its kept tokens) at their positions, the
    response's, the head at the response's positions, and its share of a forward pass's own cost (reading the weights:
    :data:`~normx.methods.ablation.prefix.CALL_ROWS` rows a pass, ``per_pass`` masks a pass); 0 for a mask that
    removes no token. Counted per source, not per token (a mask's first removed token is its first removed source's
    first; no token of a source it removes lies before that)."""
    removed = ~np.asarray(masks, bool).reshape(-1, len(sources))
    sizes = np.array([len(members) for members in sources], np.int64)
    firsts = np.array([min(members, default=prompt_length) for members in sources], np.int64)
    removes = removed & (sizes > 0)
    begin = np.where(removes, firsts, prompt_length).min(1, initial=prompt_length) if shared else np.zeros(
        len(removed), np.int64)
    count = prompt_length - begin - removes @ sizes + steps  # (its kept tokens from ``begin`` on, and the response)
    if shared:
        work = costs.continued(begin, count)
        calls = -(-count // WINDOW)  # the passes its rows run in
    else:
        work = count * costs.body + costs.attention * count * (count + 1) / 2
        calls = 1
    out = (work + steps * costs.head + calls * CALL_ROWS / per_pass * costs.body) / costs.plain(prompt_length + steps)
    return np.where(removes.any(1), out, 0.0).astype(np.float64)


def masks_cost(sources: list[list[int]], masks: np.ndarray, prompt_length: int, steps: int, shared: bool,
               costs: Costs, per_pass: int = 1) -> float:
    """What the masks cost together in plain forward passes, as :func:`normx.methods.ablation.prefix.response_hidden`
    runs them on a cut cache (``shared``): the stretches several of them read alike after their first removed token
    once, in passes of their own (:func:`normx.methods.ablation.stems.stems`), then each mask what follows its stem;
    each row its own tokens, its share of a pass's call and its attention as its pass reads it (every row of a pass
    reads from the pass's largest cut to its longest row: :func:`normx.methods.ablation.prefix.chunks` makes the
    passes); the head at each mask's response. Else (whole passes) each mask alone (:func:`mask_costs`)."""
    if not shared:
        return float(mask_costs(sources, masks, prompt_length, steps, shared, costs, per_pass).sum())
    return _together(sources, masks, stems.runs(sources, masks, prompt_length), prompt_length, steps, costs, per_pass)


def _together(sources: list[list[int]], masks: np.ndarray, every: list, prompt_length: int, steps: int,
              costs: Costs, per_pass: int, known: dict | None = None) -> float:
    """:func:`masks_cost` on a cut cache, from the masks' runs ``every`` (:func:`normx.methods.ablation.stems.runs`:
    a mask's run is its own, whatever the other masks); ``known``: :func:`normx.methods.ablation.stems.stems`'s."""
    found = [run for run in every if not run.anew]
    chosen = stems.stems(found, CALL_ROWS / per_pass, CALL_ROWS, known)
    into = {i: len(stem.kept) for stem in chosen for i in stem.members}
    plain = costs.plain(prompt_length + steps)
    anew = [run.mask for run in every if run.anew]  # (run whole)
    work = float(mask_costs(sources, np.asarray(masks)[anew], prompt_length, steps, True, costs, per_pass).sum()
                 ) * plain if anew else 0.0
    work += len(found) * steps * costs.head + -(-len(chosen) // per_pass) * CALL_ROWS * costs.body  # (stems' passes)
    stem_rows = [(stem.start, range(len(stem.kept))) for stem in chosen]
    leaf_rows = [(run.start + into.get(i, 0), range(len(run.kept) - into.get(i, 0) + steps))
                 for i, run in enumerate(found)]
    for rows, shares in ((stem_rows, 0.0), (leaf_rows, CALL_ROWS / per_pass)):
        for chunk in chunks(rows, per_pass):
            cut, width = max(begin for begin, _ in chunk), max(len(row) for _, row in chunk)
            attention = costs.continued(cut, width) - width * costs.body  # (what each row of the pass reads)
            for _, row in chunk:
                work += len(row) * costs.body + attention + -(-len(row) // WINDOW) * shares * costs.body
    return work / plain


def plan_masks(sources: list[list[int]], prompt_length: int, steps: int, budget: float, seed: int, shared: bool,
               costs: Costs, per_pass: int = 1, spent: float = 0.0, counted: dict | None = None) -> np.ndarray:
    """The masks :data:`SPEND` of the budget buys after the whole pass (at least :data:`MIN_ABLATIONS`): resolution IV
    designs where one fits, or all but one of its masks (:func:`normx.methods.ablation.designs.masks`,
    ``"fold_over"``), else a resolution III design and as many of its rows' complements as fit (``"screening"``):
    on the training contexts (docs/context.md) a whole fold-over beat the screening design and its complements at
    15-16 masks, and lost to it below. Of :data:`CANDIDATES` equally good designs (seeds ``seed * CANDIDATES`` on),
    the one whose masks buy the most (of equals, the first seed): which sources a design removes first decides what
    its masks cost. Each candidate's masks are counted alone (:func:`_alone`: every candidate's at once), then
    together (:class:`_Counted`, :func:`masks_cost`: their shared stems run once, each pass's attention as it reads
    it), one more or one fewer until they fit, where the candidate could still be the one kept (:func:`_most`).
    ``spent``: passes the budget has paid for already (a prior's reading); ``counted``: the candidates counted
    together so far for these sources and this budget (:func:`buys_more`'s), kept by the caller. On the host a
    plan is still milliseconds (the stems of the candidates that could win, at each count tried): on a card, a
    forward pass or more (docs/context.md, "On a card")."""
    k = len(sources)
    left = SPEND * budget - spent - whole_cost(prompt_length, steps, costs)
    whole = designs.block(k, "fold_over")
    for kind, need in (("fold_over", whole - 1), ("screening", 0)):
        if kind == "fold_over" and not whole:
            continue  # (no resolution IV design for these sources)
        found = _most(sources, kind, seed, prompt_length, steps, shared, costs, per_pass, left, need, counted=counted)
        if found is not None:  # (a resolution IV design, or all but one mask; else the screening design's)
            drawn, count = found
            return designs.masks(k, count, drawn, kind)
    raise AssertionError("unreachable")


def buys_more(sources: list[list[int]], than: int, prompt_length: int, steps: int, budget: float, seed: int,
              costs: Costs, per_pass: int = 1, spent: float = 0.0, counted: dict | None = None) -> bool:
    """Whether :func:`plan_masks` on a cut cache buys more than ``than`` masks (at least 2 sources), without finding
    which candidate buys the most: the first candidate found that buys more answers, a whole resolution IV design (or
    all but one of its masks) counting as more where it is, and the screening designs asked first there (where masks
    are few, the answer they give most often). ``counted``: as :func:`plan_masks`' (the plan for the same sources can
    then go on from what this counted)."""
    left = SPEND * budget - spent - whole_cost(prompt_length, steps, costs)
    whole = designs.block(len(sources), "fold_over")

    def reached(kind: str, need: int) -> bool:
        return _most(sources, kind, seed, prompt_length, steps, True, costs, per_pass, left, need, True,
                     counted) is not None

    if not whole or whole - 1 > than:  # (either design buying that many makes a plan of more: screening first)
        return reached("screening", than + 1) or (bool(whole) and reached("fold_over", whole - 1))
    if reached("fold_over", than + 1):
        return True
    if reached("fold_over", whole - 1):
        return False  # (the plan is a resolution IV design of no more masks than that)
    return reached("screening", than + 1)


def _most(sources: list[list[int]], kind: str, seed: int, prompt_length: int, steps: int, shared: bool,
          costs: Costs, per_pass: int, left: float, need: int, first: bool = False, counted: dict | None = None
          ) -> tuple[int, int] | None:
    """``(seed, masks)`` of the candidate design of this kind that buys the most masks, at least ``need`` (of equals,
    the first seed; ``first``: the first found with at least ``need``), or None where none buys ``need``. Counted
    alone first (:func:`_alone`); on a cut cache (``shared``) then together (:class:`_Counted`), in the order of
    the counts alone, only where a candidate could still win: a count above its count alone is reached only through
    counts that fit (:meth:`_Counted.grown`), so where one mask more does not fit, it buys no more than that; and
    one fewer at a time only down to the count that would win. ``counted``: the :class:`_Counted` by kind and seed
    (this call's where None)."""
    counted = {} if counted is None else counted
    candidates = np.arange(seed * CANDIDATES, (seed + 1) * CANDIDATES)
    alone = _alone(sources, kind, candidates, prompt_length, steps, shared, costs, per_pass, left)
    best: tuple[int, int] | None = None  # (masks, seed)
    for i in sorted(range(len(candidates)), key=lambda i: (-int(alone[i]), int(candidates[i]))):
        drawn, count = int(candidates[i]), int(alone[i])
        if shared:
            wins = need if best is None else max(need, best[0] + (drawn > best[1]))  # (the masks that would win)
            design = counted.get((kind, drawn))
            if design is None:
                design = counted[kind, drawn] = _Counted(sources, kind, drawn, prompt_length, steps, costs, per_pass,
                                                         left)
            if count < wins and not design.fits(count + 1):
                continue
            count = design.grown(count, wins)  # (below ``wins``: it does not win, whatever it buys)
        if count >= need and (best is None or (count, -drawn) > (best[0], -best[1])):
            best = (count, drawn)
            if first:
                break
    return None if best is None else (best[1], best[0])


def _alone(sources: list[list[int]], kind: str, candidates: np.ndarray, prompt_length: int, steps: int, shared: bool,
           costs: Costs, per_pass: int, left: float) -> np.ndarray:
    """How many of each candidate design's first masks fit in ``left`` passes, counted alone (at least
    :data:`MIN_ABLATIONS`, at most the masks there are): 64 masks each, then four times as many while every one fits."""
    k = len(sources)
    size = 64
    while True:  # (each candidate's first masks are the same at every size: a budget stopping early keeps them)
        found = [designs.masks(k, min(size, MAX_MASKS), int(d), kind) for d in candidates]
        each = mask_costs(sources, np.concatenate(found), prompt_length, steps, shared, costs, per_pass)
        bounds = np.cumsum([0] + [len(f) for f in found])
        counts = []
        for i, rows in enumerate(found):
            over = np.flatnonzero(np.cumsum(each[bounds[i]:bounds[i + 1]]) > left)
            if len(over):
                counts.append(min(max(int(over[0]), MIN_ABLATIONS), len(rows)))
            elif len(rows) < size or size >= MAX_MASKS:  # (every mask there is, or as many as a budget uses)
                counts.append(len(rows))
            else:
                break
        if len(counts) == len(found):
            return np.array(counts)
        size *= 4


class _Counted:
    """Design ``drawn``'s first masks counted together (:func:`masks_cost`) against ``left`` passes, each count once."""

    def __init__(self, sources: list[list[int]], kind: str, drawn: int, prompt_length: int, steps: int, costs: Costs,
                 per_pass: int, left: float):
        self.sources, self.kind, self.drawn, self.left = sources, kind, drawn, left
        self.prompt_length, self.steps, self.costs, self.per_pass = prompt_length, steps, costs, per_pass
        self.found, self.every = np.zeros((0, len(sources)), bool), []
        self.known: dict[int, bool] = {}
        self.nodes: dict = {}  # (the stems' best nodes by the runs they are found for: the first n runs of ``every``)

    def fits(self, n: int) -> bool:
        """Whether the first ``n`` masks (those there are, where there are fewer) fit."""
        if n not in self.known:
            if n > len(self.found):  # (the masks' runs, a block at a time: a mask's run is its own)
                self.found = designs.masks(len(self.sources), min(n + 4, MAX_MASKS), self.drawn, self.kind)
                self.every = stems.runs(self.sources, self.found, self.prompt_length)
                self.nodes = {}
            self.known[n] = _together(self.sources, self.found[:n], [run for run in self.every if run.mask < n],
                                      self.prompt_length, self.steps, self.costs, self.per_pass, self.nodes
                                      ) <= self.left
        return self.known[n]

    def grown(self, count: int, least: int = 0) -> int:
        """The masks that fit counted together, from the ``count`` that fit counted alone: one more while it fits,
        else one fewer until they fit; less than ``least`` (one less) where none from ``least`` up does."""
        while count < MAX_MASKS and self.fits(count + 1) and count + 1 <= len(self.found):
            count += 1
        while count > MIN_ABLATIONS and count >= least and not self.fits(count):
            count -= 1
        return count


def whole_cost(prompt_length: int, steps: int, costs: Costs) -> float:
    """The whole pass (its cache kept, the head at the response's positions) in plain forward passes."""
    total = prompt_length + steps
    return (costs.tokens(np.arange(total)) + steps * costs.head) / costs.plain(total)


def shared_prior_cost(total: int, first_row: int, steps: int, costs: Costs) -> float:
    """The presence prior's passes in plain forward passes where it continues from the whole pass's cache (its first
    ``first_row`` tokens cost nothing more): its last rows run plain, again with the bias, and a backward through them
    (about twice a forward's work), on ``first_row`` cached keys; the head at the response's positions twice; three
    calls. Their attention is read whole, [heads, rows, keys] (eager for the norm-based rows, a float bias for the
    gradient), where a forward's kernel streams it: per key it costs ``1 + keys / MATERIALIZED_KEYS`` times the
    forward's (on SmolLM2 on a 2-core CPU, the prior's passes took 0.9-1.0 of a forward at ~300 tokens, 0.7-0.8 at
    800-1,400 and 0.5-0.6 at ~6,900, where the attention read as a forward's would make 0.21 of the last:
    docs/context.md)."""
    rows = total - 1 - first_row
    keys = first_row + rows
    body = 4 * rows * costs.body
    attention = 4 * costs.attention * rows * keys * (1 + keys / MATERIALIZED_KEYS)
    return (body + attention + 2 * steps * costs.head + 3 * CALL_ROWS * costs.body) / costs.plain(total)
