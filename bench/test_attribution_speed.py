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


def _workload(case, settings) -> Workload:
    return Workload(case.model, case.method, case.length, case.batch, str(settings.device), settings.dtype)


def test_batch_speed(benchmark, speed_case, bench_settings):
    """``attribute_batch`` (or the plain forward) on an encoded batch of exactly L tokens per row."""
    work = _workload(speed_case, bench_settings)
    benchmark.group = f"batch: {speed_case.model}, L={speed_case.length}, batch {speed_case.batch}"
    baseline = None if work.method == "forward" else work.forward
    result, forward_times, tracker = timed_rounds(benchmark, work.attribute, baseline, bench_settings.device,
                                                  bench_settings.rounds, min_time=bench_settings.min_time,
                                                  max_rounds=bench_settings.max_rounds)
    record(benchmark, work, forward_times, tracker, "batch")
    check(work, result, full=not benchmark.enabled)


def test_end_to_end_speed(benchmark, end_to_end_case, bench_settings):
    """``normx.explain`` on texts (tokenising and result objects included) against tokenise + forward + softmax."""
    work = _workload(end_to_end_case, bench_settings)
    benchmark.group = f"end to end: {end_to_end_case.model}, L={end_to_end_case.length}, batch {end_to_end_case.batch}"
    baseline = None if work.method == "forward" else work.forward_end_to_end
    result, forward_times, tracker = timed_rounds(benchmark, work.explain, baseline, bench_settings.device,
                                                  bench_settings.rounds, min_time=bench_settings.min_time,
                                                  max_rounds=bench_settings.max_rounds)
    record(benchmark, work, forward_times, tracker, "end_to_end")
    check_end_to_end(work, result)
