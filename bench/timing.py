"""Timing one call against a baseline (the plain forward pass), interleaved, inside pytest-benchmark's
``pedantic``.

pytest-benchmark times the target's rounds (its statistics, JSON and ``--benchmark-compare`` are about the target).
Before each round, in the untimed ``setup``, the baseline is timed with the same timer, so the two alternate and
see the same machine load; the ratio reported is the median over rounds of (target round / the baseline run just
before it). Peak memory is measured on the untimed warm-up round only: on CPU a measurement starts with a garbage
collection and ``malloc_trim`` (bench/memory.py), and a trimmed heap makes the next call fault its pages in again,
which must not land in a timed round. GPU work is synchronised before the clock is read (the timed callables
synchronise at their end, and nothing is queued before they start).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch
from memory import PeakTracker
from workloads import Workload, device_name


def timed_rounds(benchmark, target: Callable, baseline: Callable | None, device: torch.device, rounds: int,
                 warmup: int = 1, min_time: float = 0.0, max_rounds: int | None = None):
    """Run ``benchmark.pedantic(target)`` with ``baseline`` timed before each round; returns (result, baseline
    times of the timed rounds, peak tracker: peak memory of the first warm-up round, None without warm-up).

    ``rounds`` is the least number of timed rounds; with ``min_time`` (seconds) more rounds are run, up to
    ``max_rounds``, so that the timed rounds (target and baseline together) take about ``min_time``, as estimated
    from the warm-up: cheap cases get enough rounds for a stable median ratio, expensive ones keep ``rounds``."""
    timer = getattr(benchmark, "_timer", time.perf_counter)
    baseline_times: list[float] = []
    warmup = warmup if benchmark.enabled else 0
    tracker = PeakTracker(device)
    tracker.supported = tracker.supported and warmup > 0
    def seconds(fn: Callable) -> float:
        start = timer()
        fn()
        return timer() - start

    per_round = 0.0
    for index in range(warmup):  # untimed by pytest-benchmark; the first one measures peak memory
        spent = 0.0 if baseline is None else seconds(baseline)
        if index == 0:
            tracker.start()
        spent += seconds(target)
        if index == 0:
            tracker.stop()
        per_round = spent
    if min_time > 0 and per_round > 0:
        rounds = max(rounds, min(max_rounds or rounds, math.ceil(min_time / per_round)))

    def setup():
        if baseline is not None:
            baseline_times.append(seconds(baseline))

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    result = benchmark.pedantic(target, setup=setup, rounds=rounds, warmup_rounds=0)
    return result, baseline_times[-rounds:], tracker


def record(benchmark, work: Workload, baseline_times: list[float], tracker: PeakTracker, level: str,
           **extra) -> None:
    """Fill ``extra_info`` with the case, the device, per-instance times and the interleaved ratio."""
    info = benchmark.extra_info
    info.update(model=work.model_name, method=work.method, L=work.length, batch=work.batch, level=level,
                device=device_name(work.torch_device), dtype=str(next(work.model.parameters()).dtype).split(".")[-1],
                threads=torch.get_num_threads(), peak_memory_bytes=tracker.peak,
                timer=getattr(getattr(benchmark, "_timer", None), "__name__", "perf_counter"), **extra)
    if not benchmark.enabled:
        return
    times = list(benchmark.stats.stats.data)
    info["per_instance_s"] = statistics.median(times) / work.batch
    info["per_instance_min_s"] = min(times) / work.batch
    if baseline_times:
        info["forward_per_instance_s"] = statistics.median(baseline_times) / work.batch
        info["ratio_to_forward"] = statistics.median(t / f for t, f in zip(times, baseline_times))
        info["ratio_of_mins"] = min(times) / min(baseline_times)
    elif work.method == "forward":
        info["ratio_to_forward"] = 1.0


def median_seconds(fn: Callable, rounds: int) -> float:
    """The median wall time of ``rounds`` calls of ``fn`` (for the plain comparisons outside ``pedantic``)."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
