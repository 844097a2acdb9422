"""Peak memory of one call, and the largest batch that stays under a memory budget.

GPU: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, i.e. everything the process holds on
the device at its peak (weights included), as a card's memory limit sees it. The budget is the device's memory
(``--mem-fraction`` of it, e.g. 48/80 to mimic the paper's 48 GB card on an 80 GB H100) or ``--mem-budget-gb``.

CPU: the process's resident-set high-water mark (Linux ``VmHWM``), which Linux lets a process reset to its current
resident size by writing ``5`` to ``/proc/self/clear_refs``. Before each trial the garbage collector runs and
``malloc_trim(0)`` gives the C allocator's freed pages back to the system, so the trial starts from what the
process really holds (weights, libraries, earlier models); the trial's peak is ``VmHWM`` minus that resident size
at its start: the working memory the call adds on top of the loaded model (weights are not counted, unlike on GPU).
The budget (``--mem-budget-gb`` / ``NORMX_BENCH_MEM_GB``) applies to that working memory. Memory the allocator
keeps after ``malloc_trim`` (fragments) can only make a trial look *smaller*; page granularity is 4 KiB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

GIB = 1024**3
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


class MemoryMeasurementError(RuntimeError):
    """Peak memory cannot be measured on this machine."""


def _status_kib(key: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise MemoryMeasurementError(f"{_STATUS} has no {key} line")


def _libc():
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


_LIBC = _libc() if sys.platform.startswith("linux") else None


def cpu_supported() -> str | None:
    """None if CPU peak memory can be measured here, else why not."""
    if not sys.platform.startswith("linux"):
        return f"CPU peak memory is read from Linux /proc (VmHWM); this is {sys.platform}"
    try:
        _CLEAR_REFS.write_text("5")
        _status_kib("VmHWM")
    except (OSError, MemoryMeasurementError) as error:
        return f"cannot reset the resident-set high-water mark through {_CLEAR_REFS}: {error}"
    return None


def _settle_cpu() -> int:
    """Collect garbage, return freed heap pages to the system, reset VmHWM; the resident size in bytes."""
    gc.collect()
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)
    _CLEAR_REFS.write_text("5")
    return _status_kib("VmRSS") * 1024


def peak_memory(fn: Callable[[], object], device: torch.device) -> tuple[int, object]:
    """(peak bytes, result) of ``fn()``: on CUDA the device's peak allocation (all of it), on CPU the peak working
    memory above the resident size at the start (see the module docstring)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device), result
    if device.type != "cpu":
        raise MemoryMeasurementError(f"peak memory is measured on cpu and cuda, not {device.type}")
    why = cpu_supported()
    if why:
        raise MemoryMeasurementError(why)
    start = _settle_cpu()
    result = fn()
    peak = _status_kib("VmHWM") * 1024
    return max(0, peak - start), result


@dataclass
class Search:
    """The result of :func:`max_batch`: the largest batch that fits (0: not even one), and every trial."""

    batch: int
    cap: int
    budget: int
    trials: dict[int, int | None] = field(default_factory=dict)  # batch -> peak bytes (None: out of memory)

    def fits(self, batch: int) -> bool:
        peak = self.trials[batch]
        return peak is not None and peak <= self.budget


def max_batch(measure: Callable[[int], int | None], budget: int, cap: int = 256) -> Search:
    """The largest batch in 1..``cap`` whose ``measure(batch)`` (peak bytes; None for out of memory) is at most
    ``budget``: doubling from 1 until a batch does not fit (or the cap), then binary search in between. Assumes
    memory grows with the batch."""
    if cap < 1:
        raise ValueError(f"cap must be at least 1, got {cap}")
    search = Search(0, cap, budget)

    def fits(batch: int) -> bool:
        if batch not in search.trials:
            search.trials[batch] = measure(batch)
        return search.fits(batch)

    if not fits(1):
        return search
    good, bad = 1, None
    while bad is None and good < cap:
        trial = min(good * 2, cap)
        if fits(trial):
            good = trial
        else:
            bad = trial
    if bad is not None:
        while bad - good > 1:
            middle = (good + bad) // 2
            if fits(middle):
                good = middle
            else:
                bad = middle
    search.batch = good
    return search


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, torch.cuda.OutOfMemoryError | MemoryError):
        return True
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


def default_budget(device: torch.device, budget_gb: float | None, fraction: float) -> int:
    """The memory budget in bytes: ``budget_gb`` if given; on CUDA otherwise ``fraction`` of the device memory."""
    if budget_gb is not None:
        return int(budget_gb * GIB)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory * fraction)
    raise ValueError("a CPU run needs a memory budget (--mem-budget-gb or NORMX_BENCH_MEM_GB)")


class PeakTracker:
    """The largest peak over several calls, each bracketed by :meth:`start` and :meth:`stop` (as
    :func:`peak_memory` measures one call); ``peak`` stays None where memory cannot be measured."""

    def __init__(self, device: torch.device):
        self.device = device
        self.supported = device.type == "cuda" or (device.type == "cpu" and cpu_supported() is None)
        self.peak: int | None = None
        self._start = 0

    def start(self) -> None:
        if not self.supported:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._start = _settle_cpu()

    def stop(self) -> None:
        if not self.supported:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = max(0, _status_kib("VmHWM") * 1024 - self._start)
        self.peak = peak if self.peak is None else max(self.peak, peak)
