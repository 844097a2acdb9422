"""Work estimates for explanation requests, so that a server can refuse what would run for minutes.

The work of one ``explain`` call is estimated in floating-point operations: a forward pass of a transformer costs
about ``2 x (its parameters outside the input embedding table) x tokens`` FLOPs, and each method says how many
forward passes' worth it needs (:meth:`normx.methods.registry.Method.passes`: one for NormXLogit, ``2 + n_steps x (1 +
targets)`` for Integrated Gradients, about ``0.6 x tokens`` for DecompX, ...). The estimate is what matters for a
budget: it grows with tokens, steps, targets and quadratic methods as the real cost does (the factors were measured
on MiniLM on a CPU), and needs no forward pass to compute.

:class:`WorkGate` is what a server puts in front of ``explain``: it refuses a request over its budget with
:class:`WorkBudgetError` (a message that says what to shorten), runs cheap requests at once and lets expensive ones
through a few at a time, so that a burst of expensive requests never makes cheap ones wait behind it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from normx.core.inputs import positive_int
from normx.errors import InvalidInputError, WorkBudgetError
from normx.methods import get_method

if TYPE_CHECKING:
    from torch import nn

T = TypeVar("T")
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


class WorkGate:
    """A per-request work budget and two lanes: cheap requests run at once; expensive ones (over ``cheap_gflop``,
    or holding the model exclusively) run at most ``heavy_slots`` at a time, the others waiting their turn.

    ``run(gflop, fn, what)`` refuses work over ``budget_gflop`` with :class:`WorkBudgetError` (``what`` describes
    the request in the message), else returns ``fn()``.
    """

    def __init__(self, budget_gflop: float, *, cheap_gflop: float = 50.0, heavy_slots: int = 1):
        if not budget_gflop > 0:
            raise InvalidInputError(f"budget_gflop must be positive, got {budget_gflop!r}")
        positive_int(heavy_slots, "heavy_slots")
        self.budget_gflop = float(budget_gflop)
        self.cheap_gflop = float(cheap_gflop)
        self._heavy = threading.BoundedSemaphore(heavy_slots)

    def check(self, gflop: float, what: str) -> None:
        if gflop > self.budget_gflop:
            raise WorkBudgetError(
                f"{what} needs about {gflop:,.3g} GFLOP, {gflop / self.budget_gflop:.1f}x the "
                f"{self.budget_gflop:,.4g} GFLOP this server allows per request: shorten the text, ask for fewer "
                "steps or labels, or choose a one-pass method (normxlogit, logat)")

    def run(self, gflop: float, fn: Callable[[], T], what: str = "this request", *, heavy: bool = False) -> T:
        """``heavy``: the expensive lane whatever the estimate (work that holds the model exclusively:
        ``Method.exclusive``)."""
        self.check(gflop, what)
        if gflop <= self.cheap_gflop and not heavy:
            return fn()
        with self._heavy:
            return fn()
