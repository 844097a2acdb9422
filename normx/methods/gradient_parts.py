"""What every computation of the gradient methods shares, per text (:mod:`normx.methods.gradients`), per generation
step (:mod:`normx.methods.step_gradients`) and per response (:mod:`normx.methods.response`): the word embeddings
they differentiate (:func:`word_embeddings`), how a token's attribution vector is summed up over the embedding
dimensions (:func:`aggregate`, :data:`AGGREGATIONS`) and Integrated Gradients' integration rules
(:func:`rule_parameters`, :data:`RULES`).

Layer 3 (methods): imports ``normx.models`` only (through the adapter it is given).
"""

from __future__ import annotations

import numpy as np

from normx._torch import torch
from normx.models import Adapter

AGGREGATIONS = ("l1", "l2", "sum")
RULES = ("riemann_trapezoid", "riemann_left", "riemann_right", "riemann_middle", "gausslegendre")


def word_embeddings(model: torch.nn.Module, adapter: Adapter, ids: torch.Tensor) -> torch.Tensor:
    """The word embeddings [B, T, H] of ``ids``, without autograd history."""
    with torch.no_grad():
        return adapter.embedding_module(model, "word")(ids).detach()


def aggregate(attributions: torch.Tensor, how: str) -> torch.Tensor:
    """[..., H] -> [...]: l1 (sum of |a|), l2 (||a||) or sum (signed)."""
    if how == "l1":
        return attributions.abs().sum(-1)
    if how == "l2":
        return attributions.norm(dim=-1)
    return attributions.sum(-1)


def rule_parameters(rule: str, n_steps: int) -> tuple[list[float], list[float]]:
    """(step sizes, alphas) of an integration rule, exactly as Captum's ``approximation_parameters``."""
    if rule == "gausslegendre":
        points, weights = np.polynomial.legendre.leggauss(n_steps)
        return (0.5 * weights).tolist(), (0.5 * (1 + points)).tolist()
    sizes = [1 / n_steps] * n_steps
    if rule == "riemann_trapezoid":
        sizes[0] /= 2
        sizes[-1] /= 2
        return sizes, torch.linspace(0, 1, n_steps).tolist()
    ends = {"riemann_left": (0, 1 - 1 / n_steps), "riemann_middle": (1 / (2 * n_steps), 1 - 1 / (2 * n_steps)),
            "riemann_right": (1 / n_steps, 1)}[rule]
    return sizes, torch.linspace(*ends, n_steps).tolist()
