"""Work estimates for explanation requests, so that a server can refuse what would run for minutes.

The work of one ``explain`` call is estimated in floating-point operations: a forward pass of a transformer costs
about ``2 x (its parameters outside the input embedding table) x tokens`` FLOPs, and each method says how many
forward passes' worth it needs (:meth:`normx.methods.registry.Method.passes`: one for NormXLogit, ``2 + n_steps x (1 +
targets)`` for Integrated Gradients, about ``0.6 x tokens`` for DecompX, ...). The estimate is what matters for a
budget: it grows with tokens, steps, targets and quadratic methods as the real cost does (the factors were measured
on MiniLM on a CPU), and needs no forward pass to compute.

:class:`normx.serving.lanes.WorkGate` puts the budget in front of ``explain``.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from normx.core.inputs import positive_int
from normx.methods import get_method

if TYPE_CHECKING:
    from torch import nn

_SIZES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compute_parameters(model: nn.Module) -> int:
    """Parameters a forward pass multiplies with: all of them but the input embedding table (looked up, not
    multiplied; counted when the output head shares it)."""
    size = _SIZES.get(model)
    if size is None:
        total = sum(p.numel() for p in model.parameters())
        table = getattr(model.get_input_embeddings(), "weight", None) if hasattr(model, "get_input_embeddings") \
            else None
        output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        tied = table is not None and output is not None and getattr(output, "weight", None) is table
        size = max(1, total - (table.numel() if table is not None and not tied else 0))
        _SIZES[model] = size
    return size


def estimate_gflop(model: nn.Module, method: str, tokens: int, *, targets: int = 1, texts: int = 1,
                   options: Mapping[str, Any] | None = None) -> float:
    """Estimated work of explaining ``texts`` texts of ``tokens`` tokens each with ``method`` (``targets``
    explained labels; ``options``: the method's options), in GFLOP."""
    for name, value in (("tokens", tokens), ("targets", targets), ("texts", texts)):
        positive_int(value, name)
    passes = get_method(method).passes(tokens, targets, options)
    return 2 * compute_parameters(model) * tokens * passes * texts / 1e9
