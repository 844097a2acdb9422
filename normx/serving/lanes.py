"""Two lanes for a server's explanation requests: the one-pass methods at once, everything else in an expensive
lane of its own, with bounded concurrency, its own torch threads and a lower OS priority.

:class:`WorkGate` is what a server puts in front of ``explain``: it refuses a request over its budget with
:class:`~normx.errors.WorkBudgetError` (a message that says what to shorten; estimates from
:func:`normx.serving.budget.estimate_gflop`), runs cheap requests in the caller's thread at once, and hands expensive
ones to the lane: ``heavy_slots`` worker threads (a standard :class:`~concurrent.futures.ThreadPoolExecutor`), the
others waiting their turn in its queue, first come first served.

Priority comes from the operating system: the lane's threads run ``heavy_nice`` steps below the server's other
threads (Linux sets nice values per thread; the torch threads they start inherit it). A core that the event loop,
a batch of one-pass requests or a visitor's browser needs is theirs first; the expensive lane has every core when
they are idle (``heavy_threads`` torch threads), so it is not slower alone. Elsewhere than Linux the lane runs at
normal priority (:func:`lower_thread_priority` says whether it could).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from normx.core.inputs import positive_int
from normx.errors import InvalidInputError, WorkBudgetError

T = TypeVar("T")
log = logging.getLogger(__name__)
MAX_NICE = 19
ADVICE = "shorten the text, ask for fewer steps or labels, or choose a one-pass method (normxlogit, logat)"


def lower_thread_priority(steps: int) -> bool:
    """Make the calling thread ``steps`` nice values less favoured by the scheduler (at most nice 19); threads it
    starts afterwards inherit the value. Linux only (where nice values are per thread): returns whether it was done.
    There is no way back for an unprivileged process, so call it only in threads that keep the lower priority."""
    if steps < 0:
        raise InvalidInputError(f"a thread's priority can only be lowered here: steps must be >= 0, got {steps}")
    if steps == 0:
        return True
    if not sys.platform.startswith("linux") or not hasattr(os, "setpriority"):
        return False
    thread = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, thread, min(MAX_NICE, os.getpriority(os.PRIO_PROCESS, thread) + steps))
    except OSError:
        return False
    return True


def _lane_thread(torch_threads: int | None, nice: int) -> None:
    """Initializer of the expensive lane's worker threads."""
    if torch_threads is not None:
        import torch

        torch.set_num_threads(torch_threads)  # this thread's own setting (an OpenMP per-thread value)
    if not lower_thread_priority(nice):
        log.info("the expensive lane runs at normal priority (per-thread nice values need Linux)")


def cost_and_budget(gflop: float, budget: float) -> tuple[str, str]:
    """A cost over the budget and the budget as a refusal prints them: with thousands separators and the fewest
    decimals that show the cost above the budget (2,340 vs 1,500; 1,500.3 vs 1,500.0, never 1,500 vs 1,500)."""
    for decimals in range(0, 12):
        need, allowed = f"{gflop:,.{decimals}f}", f"{budget:,.{decimals}f}"
        if float(need.replace(",", "")) > float(allowed.replace(",", "")):
            return need, allowed
    return f"{gflop!r}", f"{budget!r}"


class WorkGate:
    """A per-request work budget and two lanes: cheap requests run at once; expensive ones (over ``cheap_gflop``,
    or ``heavy=True``) in the expensive lane, at most ``heavy_slots`` at a time, with ``heavy_threads`` torch threads
    each (None: the process's setting) at ``heavy_nice`` nice values below the rest of the server.

    ``run(gflop, fn, what)`` refuses work over ``budget_gflop`` with :class:`WorkBudgetError` (``what`` describes
    the request in the message), else returns ``fn()`` (run in the lane's thread for expensive work: ``fn`` must not
    rely on the caller's thread-local state).
    """

    def __init__(self, budget_gflop: float, *, cheap_gflop: float = 50.0, heavy_slots: int = 1,
                 heavy_threads: int | None = None, heavy_nice: int = 0):
        if not budget_gflop > 0:
            raise InvalidInputError(f"budget_gflop must be positive, got {budget_gflop!r}")
        positive_int(heavy_slots, "heavy_slots")
        positive_int(heavy_threads, "heavy_threads", none=True)
        if not isinstance(heavy_nice, int) or isinstance(heavy_nice, bool) or not 0 <= heavy_nice <= MAX_NICE:
            raise InvalidInputError(f"heavy_nice must be a whole number from 0 to {MAX_NICE}, got {heavy_nice!r}")
        self.budget_gflop = float(budget_gflop)
        self.cheap_gflop = float(cheap_gflop)
        self._lane = ThreadPoolExecutor(heavy_slots, thread_name_prefix="normx-expensive", initializer=_lane_thread,
                                        initargs=(heavy_threads, heavy_nice))

    def check(self, gflop: float, what: str, advice: str = ADVICE) -> None:
        """Refuse ``gflop`` over the budget, saying the request's cost and the budget (:func:`cost_and_budget`) and
        what to ask for instead (``advice``)."""
        if gflop > self.budget_gflop:
            need, allowed = cost_and_budget(gflop, self.budget_gflop)
            raise WorkBudgetError(f"{what} needs about {need} GFLOP; this server allows {allowed} GFLOP per request: "
                                  f"{advice}")

    def run(self, gflop: float, fn: Callable[[], T], what: str = "this request", *, heavy: bool = False,
            advice: str = ADVICE) -> T:
        """``heavy``: the expensive lane whatever the estimate (every method that is not one forward pass)."""
        self.check(gflop, what, advice)
        if gflop <= self.cheap_gflop and not heavy:
            return fn()
        return self._lane.submit(fn).result()
