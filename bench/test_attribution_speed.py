"""Time per instance of each attribution method against the plain forward pass (the paper's Table 4), on an
encoded batch and end to end.

    python -m pytest bench/test_attribution_speed.py --benchmark-enable   # the timed grid (see bench/README.md)

With benchmarks disabled (the default test run) each case runs once on a tiny model and checks its result against
an independent reference (bench/references.py).
"""

from __future__ import annotations

from references import check, check_end_to_end
from timing import record, timed_rounds
from workloads import Workload


def _timed(benchmark, case, settings, level: str, group: str, run_name: str, baseline_name: str):
    """Time ``work.<run_name>`` against ``work.<baseline_name>`` (the plain forward, which has no baseline)."""
    work = Workload(case.model, case.method, case.length, case.batch, str(settings.device), settings.dtype)
    benchmark.group = f"{group}: {case.model}, L={case.length}, batch {case.batch}"
    baseline = None if work.method == "forward" else getattr(work, baseline_name)
    result, forward_times, tracker = timed_rounds(benchmark, getattr(work, run_name), baseline, settings.device,
                                                  settings.rounds, min_time=settings.min_time,
                                                  max_rounds=settings.max_rounds)
    record(benchmark, work, forward_times, tracker, level)
    return work, result


def test_batch_speed(benchmark, speed_case, bench_settings):
    """``attribute_batch`` (or the plain forward) on an encoded batch of exactly L tokens per row."""
    work, result = _timed(benchmark, speed_case, bench_settings, "batch", "batch", "attribute", "forward")
    check(work, result, full=not benchmark.enabled)


def test_end_to_end_speed(benchmark, end_to_end_case, bench_settings):
    """``normx.explain`` on texts (tokenising and result objects included) against tokenise + forward + softmax."""
    work, result = _timed(benchmark, end_to_end_case, bench_settings, "end_to_end", "end to end", "explain",
                          "forward_end_to_end")
    check_end_to_end(work, result)
