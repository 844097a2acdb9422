"""Two-level designs for ablation masks: which sources each ablated pass keeps, chosen so that a linear surrogate
learns the most from the fewest passes.

ContextCite draws its masks at random (each source kept with probability 1/2). A linear surrogate fitted on random
masks mixes each source's effect with those of the others and with their interactions; a *resolution IV* design
(Box & Hunter, 1961) balances every source against every other (orthogonal columns) and against every pair's
interaction (each mask comes with its complement: a fold-over), so each source's fitted weight is its main effect,
free of the pairs' interactions, from as few as twice as many masks as sources.

:func:`hadamard` builds the ±1 matrices of order N the designs come from: Sylvester's (N a power of two) and Paley's
first construction (N = q + 1, q a prime with q % 4 == 3), and their Kronecker products with Sylvester's order 2.
:func:`fold_over` turns N of its columns into a design of 2N masks for up to N sources, with a seeded choice of
columns and of which level means "kept" per source, so that different seeds give different, equally good designs.
"""

from __future__ import annotations

from functools import cache, lru_cache

import numpy as np

from normx.errors import InvalidInputError

LARGEST = 4096  # the largest order built; sources past it are not designed (random masks instead)
REPLICATES = 64  # designs drawn for distinct masks before the rest are enumerated (fewer sources than ENUMERATED)
ENUMERATED = 13  # sources from which the masks are never enumerated (more of them than LARGEST)


def _is_prime(q: int) -> bool:
    return q > 1 and all(q % d for d in range(2, int(q ** 0.5) + 1))


@cache
def hadamard(order: int) -> np.ndarray | None:
    """A Hadamard matrix (±1 entries, ``H @ H.T == order * I``) of this order, or None where none is built here."""
    if order == 1:
        return np.ones((1, 1), np.int8)
    if order == 2:
        return np.array([[1, 1], [1, -1]], np.int8)
    if order % 4:
        return None
    q = order - 1
    if _is_prime(q) and q % 4 == 3:  # Paley I: quadratic residues mod q
        squares = {(x * x) % q for x in range(1, q)}
        chi = np.array([0] + [1 if x in squares else -1 for x in range(1, q)])
        jacobsthal = chi[(np.arange(q)[None, :] - np.arange(q)[:, None]) % q]
        core = jacobsthal + np.eye(q, dtype=int)
        matrix = np.ones((order, order), int)
        matrix[1:, 0] = -1
        matrix[1:, 1:] = core
        return matrix.astype(np.int8)
    half = hadamard(order // 2)
    if half is None:
        return None
    return np.block([[half, half], [half, -half]]).astype(np.int8)


def design_order(sources: int) -> int | None:
    """The smallest order N >= ``sources`` (a multiple of 4, or 1 / 2) with a Hadamard matrix built here."""
    for order in range(max(sources, 1), LARGEST + 1):
        if (order <= 2 or order % 4 == 0) and hadamard(order) is not None:
            return order
    return None


def screening(sources: int, seed: int) -> np.ndarray | None:
    """A resolution III design (Plackett & Burman, 1946) for ``sources`` factors: bool [N, sources] (True = kept),
    N the smallest order > ``sources`` built here, from a Hadamard matrix normalised to a first column of ones, the
    sources given a seeded choice of its other columns and of which level means kept. Columns mutually orthogonal,
    each source kept in exactly half the rows. None where no order fits."""
    order = design_order(sources + 1)
    if order is None:
        return None
    rng = np.random.default_rng([seed, sources, 1946])
    matrix = hadamard(order).astype(np.int64)
    matrix = matrix * matrix[:, :1]  # each row times its first entry: the first column all ones
    columns = 1 + rng.permutation(order - 1)[:sources]
    signs = np.where(rng.random(sources) < 0.5, -1, 1)
    return matrix[rng.permutation(order)][:, columns] * signs > 0


KINDS = ("fold_over", "screening")


def masks(sources: int, count: int, seed: int, kind: str = "screening") -> np.ndarray:
    """``count`` masks (bool [count, sources]) in the order a budget should take them. ``"fold_over"``: whole
    resolution IV designs (:func:`fold_over`), seed after seed; ``"screening"``: a resolution III design
    (:func:`screening`), then its rows' complements (together a fold-over: resolution IV), then the same with the next
    seed. A budget that stops inside a design keeps its first rows. Too many sources for a design built here: random
    masks, each source kept with probability 1/2. Each mask once, and never the one that keeps every source (the
    whole pass reads it; the model's outcomes are deterministic, so a mask run again tells nothing new): fewer than
    ``count`` where the sources have fewer (:func:`distinct`); where the designs repeat themselves before that (a few
    sources), the masks they have not given follow, in a seeded order."""
    if sources < 1 or count < 0 or kind not in KINDS:
        raise InvalidInputError(f"masks need at least one source, a count >= 0 and a kind in {KINDS}, got {sources}, "
                                f"{count} and {kind!r}")
    count = min(int(count), distinct(sources))
    size = 64
    while size < count:  # (a design's first masks are the same whatever the count: kept at a few sizes, cut)
        size *= 4
    return _masks(int(sources), min(size, distinct(sources)), int(seed), kind)[:count].copy()


@lru_cache(maxsize=4096)
def _masks(sources: int, count: int, seed: int, kind: str) -> np.ndarray:
    """:func:`masks`, kept (a plan asks for the same designs again and again: every call's candidates, each
    count it tries); read-only, :func:`masks` hands out copies."""
    rows: list[np.ndarray] = []
    seen = {np.ones(sources, bool).tobytes()}
    replicate = 0
    while len(rows) < count and replicate < (REPLICATES if sources < ENUMERATED else 16 * count):
        design = (fold_over if kind == "fold_over" else screening)(sources, seed + replicate)
        if design is None:
            design = np.random.default_rng([seed, sources, replicate]).random((count, sources)) < 0.5
        elif kind == "screening":
            design = np.vstack([design, ~design])
        for row in design:
            if row.tobytes() not in seen:
                seen.add(row.tobytes())
                rows.append(row)
        replicate += 1
    if len(rows) < count:  # (a few sources: the masks not given yet, in a seeded order)
        every = (np.arange(1 << sources)[:, None] >> np.arange(sources)[None] & 1).astype(bool)
        rows += [row for row in every[np.random.default_rng([seed, sources]).permutation(len(every))]
                 if row.tobytes() not in seen]
    found = np.array(rows[:count], bool).reshape(-1, sources)
    found.flags.writeable = False
    return found


def distinct(sources: int) -> int:
    """The masks there are for ``sources`` sources besides the one keeping them all (at most :data:`LARGEST`)."""
    return LARGEST if sources >= ENUMERATED else (1 << sources) - 1


def block(sources: int, kind: str) -> int:
    """The rows of one whole design of this kind (0 where none is built)."""
    order = design_order(sources if kind == "fold_over" else sources + 1)
    return 0 if order is None else (2 * order if kind == "fold_over" else order)


def fold_over(sources: int, seed: int) -> np.ndarray | None:
    """A resolution IV design for ``sources`` factors: bool [2N, sources] (True = the source kept), rows in fold-over
    pairs (row 2i + 1 the complement of row 2i), columns mutually orthogonal and orthogonal to every pair's
    interaction, each source kept in exactly half the rows. None where no order fits (:data:`LARGEST`)."""
    if sources < 1:
        raise InvalidInputError(f"a design needs at least one source, got {sources}")
    order = design_order(sources)
    if order is None:
        return None
    rng = np.random.default_rng([seed, sources, 1961])
    matrix = hadamard(order).astype(np.int64)
    columns = rng.permutation(order)[:sources]
    signs = np.where(rng.random(sources) < 0.5, -1, 1)
    half = matrix[rng.permutation(order)][:, columns] * signs
    rows = np.empty((2 * order, sources), np.int64)
    rows[0::2], rows[1::2] = half, -half
    return rows > 0
