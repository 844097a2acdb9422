"""The largest batch each method runs under a memory budget, and its time per instance there (the paper's
Table 5): doubling from batch 1, then binary search, measuring each trial's peak memory (bench/memory.py).

    python -m pytest bench/test_max_batch.py --benchmark-enable --mem-budget-gb 0.5

On CPU the searches run in a separate process (bench/max_batch_worker.py) for clean memory measurements; the
time per instance at the batch found is measured here.

In the default test run the search runs on a tiny model with a small cap, and the memory measurement and the
search are checked against closed-form cases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import max_batch_worker
import pytest
from memory import Search, cpu_supported, max_batch
from references import check
from timing import record, timed_rounds
from workloads import Workload

MIB = 1024**2


def test_max_batch(benchmark, max_batch_case, bench_settings, max_batch_search):
    s = bench_settings
    case = max_batch_case
    if s.device.type == "cpu" and cpu_supported():
        pytest.skip(cpu_supported())
    found = max_batch_search(case)
    search = Search(found["batch"], s.cap, s.budget, {int(b): p for b, p in found["trials"].items()})
    _assert_consistent(search)
    timed = max(search.batch, 1)  # batch 0 (even one instance is over budget): time batch 1, and say so
    work = Workload(case.model, case.method, case.length, timed, str(s.device), s.dtype)
    benchmark.group = f"max batch: {case.model}, L={case.length}"
    result, _, tracker = timed_rounds(benchmark, work.attribute, None, s.device, max(1, min(s.rounds, 2)))
    record(benchmark, work, [], tracker, "max_batch", max_batch=search.batch, max_batch_cap=search.cap,
           budget_bytes=search.budget, trials={str(b): p for b, p in sorted(search.trials.items())})
    if not benchmark.enabled:
        check(work, result)


def _assert_consistent(search: Search) -> None:
    """Every tried batch up to the answer fits and every larger one does not (memory grows with the batch)."""
    for batch in search.trials:
        assert search.fits(batch) == (batch <= search.batch), (batch, search)
    assert search.batch == search.cap or search.batch + 1 in search.trials or search.batch == 0


# ---- the search and the measurement, on closed-form cases ---------------------------------------------------------

@pytest.mark.parametrize(("per_item", "fixed", "budget", "cap", "expected"), [
    (10, 5, 100, 256, 9),  # 5 + 10 b <= 100
    (10, 5, 4, 256, 0),  # not even one
    (10, 5, 15, 256, 1),
    (1, 0, 1000, 256, 256),  # the cap
    (1, 0, 1000, 100, 100),  # a cap that is not a power of two
    (3, 1, 301, 64, 64),
    (7, 0, 700, 256, 100),
])
def test_search_finds_the_largest_fitting_batch(per_item, fixed, budget, cap, expected):
    calls = []

    def measure(batch):
        calls.append(batch)
        return fixed + per_item * batch

    search = max_batch(measure, budget, cap)
    assert search.batch == expected
    assert len(calls) == len(set(calls))  # no batch measured twice
    assert len(calls) <= 2 * max(1, cap).bit_length() + 1
    _assert_consistent(search)


def test_search_treats_out_of_memory_as_not_fitting():
    search = max_batch(lambda batch: None if batch > 12 else batch, budget=10**9, cap=64)
    assert search.batch == 12
    assert search.trials[16] is None


KNOWN_ALLOCATIONS = """
import json, torch
from memory import peak_memory
MIB = 1024**2
def allocate(mib):
    def run():
        tensor = torch.ones(mib * MIB // 4)  # float32
        return float(tensor[-1])
    return run
def one_after_another():  # two 32 MiB tensors, the first freed before the second is made
    return allocate(32)() + allocate(32)()
allocate(1)()  # one-off allocations of the first call, unmeasured (as the worker does)
print(json.dumps([peak_memory(fn, torch.device("cpu"))[0] for fn in (allocate(16), allocate(64), one_after_another)]))
"""


def test_cpu_peak_memory_of_known_allocations():
    """In the max-batch worker's process settings, the peak of known allocations (the worker does the CPU search)."""
    if cpu_supported():
        pytest.skip(cpu_supported())
    env = {**os.environ, **max_batch_worker.ENV}
    done = subprocess.run([sys.executable, "-c", KNOWN_ALLOCATIONS], env=env, capture_output=True, text=True,
                          cwd=max_batch_worker.HERE, check=True)
    small, big, sequential = json.loads(done.stdout.strip().splitlines()[-1])
    for measured, expected in ((small, 16), (big, 64), (sequential, 32)):  # within 1 MiB (pages, small objects)
        assert abs(measured - expected * MIB) < MIB, (measured / MIB, expected)
