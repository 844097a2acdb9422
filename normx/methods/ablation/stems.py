"""Which ablated sequences share a stem: masks that remove their first source at the same token and then keep the
same tokens for a while read the same tokens at the same (closed-up) positions after the same prefix, so their states
there are the same. One pass runs each such shared stretch (a *stem*) once; the masks then continue from their stem's
end, on the whole pass's cache up to their first removed token and the stem's keys after it.

A mask's *run* is its first removed token and the positions of the prompt tokens it keeps from there on
(:func:`runs`). Runs with the same first removed token form a trie over those positions; :func:`stems` picks one
level of it, the set of disjoint nodes (each shared by at least two runs) that saves the most rows: a node of depth
``d`` shared by ``k`` runs saves ``(k - 1) * d`` rows and costs a row's share of a pass (``share``); stems whose
savings do not pay for the pass they need (``call`` rows) are not taken. On fold-overs of 16 masks for 8 sources of
150 tokens the plan counts 8-10 % less with them (:func:`normx.methods.ablation.planning.masks_cost`, four seeds;
tests/context/test_stems.py checks 5-20 %).

Layer 3 (methods): numpy only; :mod:`normx.methods.ablation.prefix` runs what this plans and
:mod:`normx.methods.ablation.planning` counts it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Run:
    """A mask's ablated sequence after its unchanged prefix: ``mask`` (its row), ``start`` (its first removed
    token) and ``kept`` (the positions of the prompt tokens it keeps from there on, ascending)."""

    mask: int
    start: int
    kept: np.ndarray

    @property
    def anew(self) -> bool:
        """Whether it removes every prompt token with nothing before them: its sequence starts anew, read by a
        whole pass, not from the cache."""
        return not self.start and not len(self.kept)


@dataclass(frozen=True)
class Stem:
    """Prompt tokens that several runs read first: from ``start`` (their first removed token), the positions
    ``kept`` (the first ``len(kept)`` of each member's), read by the runs ``members`` (indices into the runs)."""

    start: int
    kept: np.ndarray
    members: tuple[int, ...]


def runs(sources: list[list[int]], keeps: np.ndarray, prompt_length: int) -> list[Run]:
    """The run of each mask of ``keeps`` (bool [masks, sources]) that removes a token; a mask keeping every source
    has none."""
    owner = np.full(prompt_length, -1)
    sizes = [len(members) for members in sources]
    if sum(sizes):
        owner[np.concatenate([np.asarray(members, np.int64) for members in sources])] = np.repeat(
            np.arange(len(sources)), sizes)
    keeps = np.asarray(keeps, bool).reshape(-1, len(sources))
    masks = np.flatnonzero((~keeps[:, np.asarray(sizes) > 0]).any(1))  # (those removing a token)
    kept = (owner[None] < 0) | keeps[masks][:, np.maximum(owner, 0)]  # [masks, prompt]
    starts = np.argmin(kept, axis=1)  # (each mask's first removed token)
    after = kept & (np.arange(prompt_length)[None] >= starts[:, None])
    flat = np.flatnonzero(after)  # (row-major: each mask's kept positions, ascending)
    positions = flat % prompt_length if prompt_length else flat
    ends = np.cumsum(after.sum(1)).tolist()
    return [Run(int(m), int(start), positions[a:b]) for m, start, a, b in
            zip(masks.tolist(), starts.tolist(), [0, *ends][:-1], ends, strict=True)]


def stems(found: list[Run], share: float, call: float, known: dict | None = None) -> list[Stem]:
    """The stems worth running for ``found`` (see the module's docstring): each a node of the runs' trie, no run in
    two; none where what they save is no more than ``call`` rows (the pass they add). ``known``: the best nodes of
    each first removed token's runs found before, by their indices in ``found``, for a caller that counts the first
    masks of one design again and again (its runs the first of the same list: a run's nodes are its runs' own)."""
    by_start: dict[int, list[int]] = {}
    for i, run in enumerate(found):
        by_start.setdefault(run.start, []).append(i)
    chosen: list[Stem] = []
    saved = 0.0
    for start, members in by_start.items():
        if known is None:
            value, picks = _best(found, members, 0, share)
        else:
            key = (share, *members)
            if key not in known:
                known[key] = _best(found, members, 0, share)
            value, picks = known[key]
        if value > 0:
            saved += value
            chosen += [Stem(start, found[members_[0]].kept[:depth], tuple(members_)) for members_, depth in picks]
    return chosen if saved > call else []


def _best(found: list[Run], members: list[int], depth: int, share: float) -> tuple[float, list]:
    """The rows saved by the best disjoint nodes under the node of ``members`` (runs sharing their first ``depth``
    kept positions), and those nodes as (members, depth)."""
    if len(members) < 2:
        return 0.0, []
    kept = [found[i].kept for i in members]
    shortest = min(len(k) for k in kept)
    if shortest > depth:  # how far beyond ``depth`` they all agree
        stacked = np.stack([k[depth:shortest] for k in kept])
        same = (stacked == stacked[0]).all(0)
        depth += int(np.argmin(same)) if not same.all() else len(same)
    own = (len(members) - 1) * depth - share
    children: dict[int, list[int]] = {}
    for i, k in zip(members, kept):
        children.setdefault(int(k[depth]) if depth < len(k) else -1, []).append(i)
    below, picks = 0.0, []
    if len(children) > 1:  # (a single child would be this node again)
        for child in children.values():
            value, chosen = _best(found, child, depth, share)
            below, picks = below + value, picks + chosen
    if own > below and depth > 0:
        return own, [(members, depth)]
    return below, picks
