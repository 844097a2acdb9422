"""Model-free baselines: seeded uniform scores per position (``random``) or per token type (``random_types``), the
same for a text in any batch, at any position, on any device; and each token's position (``recency``: later tokens
first). They read only the ids and the attention mask (``Method.model_free``): ``explain_generation`` runs no forward
pass for them (``normx.explain`` still runs its prediction pass, which gives the Explanation its prediction)."""

from __future__ import annotations

import hashlib

from normx._torch import torch
from normx.methods.registry import Context, Method, Option, register_method


def _seeded_scores(ctx: Context, salt: str, draw) -> torch.Tensor:
    """Scores of each text's real tokens from ``draw(token ids, generator)``, the generator seeded by (salt, seed,
    the text's token ids): the same text gets the same scores in any batch, at any position, on any device."""
    ids, mask = ctx.run.inputs["input_ids"].cpu(), ctx.run.inputs["attention_mask"].bool().cpu()
    scores = torch.zeros(ids.shape, dtype=torch.float32)
    for row in range(ids.shape[0]):
        tokens = ids[row][mask[row]].tolist()
        digest = hashlib.sha256(f"{salt}:{ctx.options['seed']}:{tokens}".encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        scores[row, mask[row]] = draw(tokens, generator)
    return ctx.expand(scores[:, None])


def _random(ctx: Context) -> torch.Tensor:
    """Uniform [0, 1) scores, one per position."""
    return _seeded_scores(ctx, "normx-random", lambda tokens, generator: torch.rand(len(tokens), generator=generator))


def _random_types(ctx: Context) -> torch.Tensor:
    """Uniform [0, 1) scores per vocabulary id: every occurrence of a token in a text (in both texts of a pair)
    gets the same score, so a random ranking removes a word wherever it occurs."""
    def draw(tokens, generator):
        kinds = sorted(set(tokens))
        values = dict(zip(kinds, torch.rand(len(kinds), generator=generator).tolist()))
        return torch.tensor([values[t] for t in tokens])

    return _seeded_scores(ctx, "normx-random-types", draw)


def _recency_first(ctx: Context) -> torch.Tensor:
    """Recency, but each text's first real token ranks above every other (the token a decoder's attention sinks
    on): 1 for the first token, 1 - 1 / (j + 1) for the token at position j >= 1 (so a prefix's scores are the
    whole text's). Padding gets 0."""
    mask = ctx.run.inputs["attention_mask"]
    positions = ((mask.cumsum(-1) - 1).clamp_min(0) * mask).float()
    scores = torch.where(positions == 0, 1.0, 1 - 1 / (positions + 1))
    return ctx.expand((scores * mask)[:, None])


def _recency(ctx: Context) -> torch.Tensor:
    """Each real token's position among the text's tokens (0, 1, ...): later tokens score higher. Padding gets 0."""
    mask = ctx.run.inputs["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp_min(0) * mask
    return ctx.expand(positions.float()[:, None])


register_method(Method(
    "random_types", _random_types,
    "Random baseline per token type: every occurrence of a vocabulary id in a text (or pair) gets the same seeded "
    "uniform score; on sentence pairs it removes shared words from both sentences at once",
    display="Random (per type)", label_dependent=False, layered=False, reading="magnitude", model_free=True,
    options=[Option("seed", 0, "the seed", int)]))
register_method(Method(
    "random", _random, "Random baseline: uniform [0, 1) scores, seeded by (seed, text); label-independent",
    display="Random", label_dependent=False, layered=False, reading="magnitude", model_free=True,
    options=[Option("seed", 0, "the seed", int)]))
register_method(Method(
    "recency", _recency,
    "Recency baseline: the score of token j is its position j (0 for the first token), so later tokens rank first; "
    "model-free, label-independent; in a causal LM one pass holds every generation step",
    display="Recency", label_dependent=False, layered=False, reading="magnitude", per_position=True,
    model_free=True))
register_method(Method(
    "recency_first", _recency_first,
    "Experimental (docs/generation.md): recency with the first token first (it ranks above all others, then later "
    "tokens first); model-free, label-independent",
    display="Recency + first", label_dependent=False, layered=False, reading="magnitude", per_position=True,
    experimental=True, model_free=True))
