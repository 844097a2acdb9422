"""Time and peak memory of explaining every step of one generation against one plain forward pass, as
``studies/generation/peers.py`` measures every method (normx's, inseq's, Captum's, and LXT's in its own virtualenv:
this module needs only torch and the standard library).

Memory: the peak resident set (Linux ``VmHWM``) reached during one call, minus the resident set just before it.
Before the call the garbage collector runs, ``malloc_trim(0)`` returns freed heap pages, and ``5`` written to
``/proc/self/clear_refs`` resets the high-water mark to the current resident size, so the delta is the working
memory the call adds on top of the loaded model (weights not counted). Not ``getrusage(RUSAGE_SELF).ru_maxrss``:
it is the larger of that mark and the marks recorded when a thread of the process exited, which the reset does
not clear (a worker thread that ended after loading kept ``ru_maxrss`` at the loading peak). Each method is
measured in a fresh process, on its first call after loading (its one-time allocations included), after one
unmeasured plain forward pass (the model's own first-call allocations) and one measured one.

Time: after that first call, ``rounds`` rounds each timing the plain forward pass (the median of 3 calls) and then
the method's call; reported are the medians of the method's times, of the forward times and of the per-round
ratios (interleaving keeps both under the same machine load). A first call longer than ``long_call_s`` (or
``rounds = 0``) is the timing itself, against the median of 3 plain forward passes right after it: its one-time
costs are small beside it, and more rounds of it would take minutes each.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import statistics
import time
from collections.abc import Callable
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_LIBC = ctypes.CDLL(ctypes.util.find_library("c")) if ctypes.util.find_library("c") else None


def _status_kib(key: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{_STATUS} has no {key} line")


def peak_mib(fn: Callable[[], object]) -> float:
    """Peak resident-set growth (MiB) during ``fn()`` above the resident set just before it (see the module
    docstring)."""
    gc.collect()
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)
    _CLEAR_REFS.write_text("5")  # the mm's high-water mark := current RSS
    start = _status_kib("VmRSS")
    fn()
    return max(0, _status_kib("VmHWM") - start) / 1024


def seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(all_steps: Callable[[], object], forward: Callable[[], object], rounds: int,
            long_call_s: float = float("inf")) -> dict:
    """Memory of one plain forward pass (after an unmeasured one: the process's one-time allocations) and of the
    first ``all_steps()``, then ``rounds`` interleaved timings (none if that first call took over ``long_call_s``)."""
    forward()
    forward_mib = peak_mib(forward)
    first = []
    method_mib = peak_mib(lambda: first.append(seconds(all_steps)))
    if first[0] > long_call_s:
        rounds = 0
    method_times, forward_times, ratios = [], [], []
    for _ in range(rounds):
        plain = statistics.median(seconds(forward) for _ in range(3))
        took = seconds(all_steps)
        forward_times.append(plain)
        method_times.append(took)
        ratios.append(took / plain)
    if not rounds:  # the first call is the timing (long calls, where its one-time costs are negligible)
        plain = statistics.median(seconds(forward) for _ in range(3))
        forward_times, method_times, ratios = [plain], first, [first[0] / plain]
    return {"seconds": statistics.median(method_times), "forward_seconds": statistics.median(forward_times),
            "ratio": statistics.median(ratios), "first_call_seconds": first[0], "rounds": rounds,
            "all_seconds": method_times, "all_forward_seconds": forward_times,
            "peak_mib": round(method_mib, 1), "forward_peak_mib": round(forward_mib, 1)}
