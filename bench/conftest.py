"""Options and the case grid of the benchmark suite (see bench/README.md).

With benchmarks disabled (the default test run) every benchmark runs once, as a smoke test, on tiny models and
asserts its result; with ``--benchmark-enable`` the grid below is timed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch
from generation_options import add_generation_options, generation_settings, parametrize_generation
from workloads import LENGTHS, METHODS, MODELS, applies

# The grid of a timed run. "full": every model x method x length x batch. "default": the full grid on GPU; on CPU
# the plan below, which leaves out what takes too long there (DecompX costs ~30x a forward pass at L=40 and ~100x at
# L=120 on CPU, Integrated Gradients ~150x): a timed CPU run of it takes ~30 min on 2 cores (bench/README.md).
DEFAULT_MODELS = ("bert-base", "minilm-sst2", "minilm-stsb", "minilm-mnli", "smollm2-sst2")
CHEAP = ("forward", "normxlogit", "logat_all", "l2norm")  # one forward pass each
GRADIENTS = ("gradient_norm", "gradient_x_input")
ALL_LENGTHS, NOT_TIMED = max(LENGTHS), 0
CPU_BATCHES, GPU_BATCHES = (1, 4), (1, 32)
# (model, method) -> (longest L, batches; None = the default batches) of the default CPU grid; absent: every
# length at the default batches
CPU_PLAN = {
    ("bert-base", "integrated_gradients"): (40, (1,)),
    ("bert-base", "decompx"): (40, (1,)),
    **{("bert-base", m): (120, None) for m in GRADIENTS},
    ("minilm-sst2", "integrated_gradients"): (120, (1,)),
    ("minilm-sst2", "decompx"): (120, (1,)),
    **{(model, m): (NOT_TIMED, None) for model in ("minilm-stsb", "minilm-mnli")  # other heads, same backbone
       for m in METHODS if m not in CHEAP},
    **{("smollm2-sst2", m): (120, None) for m in CHEAP},  # 30 layers: ~2 s a forward pass at L=512 on CPU
    **{("smollm2-sst2", m): (40, None) for m in GRADIENTS},
    ("smollm2-sst2", "integrated_gradients"): (NOT_TIMED, None),
}
CPU_END_TO_END_MODELS = ("minilm-sst2",)
CPU_MAX_BATCH_MODELS = ("minilm-sst2",)
# DecompX decomposes one text at a time, so its memory hardly grows with the batch: on CPU its search meets the
# cap, at ~0.5-1 s an instance; searched at L=40 only
CPU_MAX_BATCH_PLAN = {"integrated_gradients": 120, "decompx": 40}
CPU_BUDGET_GB, CPU_CAP, GPU_CAP = 0.25, 32, 1024
MIN_TIME_CPU, MIN_TIME_GPU, MAX_ROUNDS_CPU, MAX_ROUNDS_GPU = 5.0, 2.0, 30, 100
SMOKE_LENGTH, SMOKE_BATCH = 16, 2
END_TO_END_METHODS = ("forward", "normxlogit", "logat_all")
SMOKE_MAX_BATCH_METHODS = ("forward", "normxlogit", "gradient_x_input")


@dataclass(frozen=True)
class Case:
    model: str
    method: str
    length: int
    batch: int | None = None  # None for the max-batch search

    @property
    def id(self) -> str:
        batch = "" if self.batch is None else f"-b{self.batch}"
        return f"{self.model}-{self.method}-L{self.length}{batch}"


def _csv(value: str | None, cast=str):
    return None if not value else [cast(v.strip()) for v in value.split(",") if v.strip()]


def pytest_addoption(parser):
    group = parser.getgroup("normx benchmarks")
    group.addoption("--bench-models", help=f"comma-separated models (known: {', '.join(MODELS)})")
    group.addoption("--bench-methods", help=f"comma-separated methods (known: {', '.join(METHODS)})")
    group.addoption("--bench-lengths", help="comma-separated input lengths in tokens (default 40,120,360,512)")
    group.addoption("--bench-batches", help="comma-separated batch sizes timed per case (default 1,4 on CPU, "
                                            "1,32 on GPU)")
    group.addoption("--bench-grid", choices=("default", "full"), default="default",
                    help="'full': every model x method x length x batch; 'default': the full grid on GPU, the "
                         "CPU plan of bench/conftest.py on CPU")
    group.addoption("--bench-device", help="cpu or cuda (default: cuda if available)")
    group.addoption("--bench-dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    group.addoption("--bench-threads", type=int, help="torch CPU threads (default: torch's)")
    group.addoption("--bench-rounds", type=int, help="least timed rounds per case (default 3 on CPU, 10 on GPU)")
    group.addoption("--bench-min-time", type=float,
                    help="seconds of timed rounds per speed case (method and forward together, estimated from the "
                         f"warm-up): cheap cases run more rounds, up to {MAX_ROUNDS_CPU} on CPU / {MAX_ROUNDS_GPU} "
                         f"on GPU (default {MIN_TIME_CPU} s on CPU, {MIN_TIME_GPU} s on GPU; 0: just --bench-rounds)")
    group.addoption("--mem-budget-gb", type=float, default=_env_float("NORMX_BENCH_MEM_GB"),
                    help="memory budget of the max-batch search (also NORMX_BENCH_MEM_GB). CPU: working memory "
                         f"above the loaded model, default {CPU_BUDGET_GB}; GPU: all device memory, default "
                         "--mem-fraction of the device's")
    group.addoption("--mem-fraction", type=float, default=1.0,
                    help="GPU: budget = this fraction of the device memory (e.g. 0.6 on an 80 GB card ~ 48 GB)")
    group.addoption("--max-batch-cap", type=int,
                    help=f"largest batch the search tries (default {CPU_CAP} on CPU, {GPU_CAP} on GPU)")
    add_generation_options(group)


def _env_float(name: str) -> float | None:
    value = os.environ.get(name)
    return float(value) if value else None


def benchmarks_enabled(config) -> bool:
    return not config.getoption("benchmark_disable") or config.getoption("benchmark_enable")


@dataclass(frozen=True)
class Settings:
    device: torch.device
    dtype: str
    rounds: int  # the least number of timed rounds
    min_time: float  # seconds of timed rounds per speed case (more rounds for cheap cases)
    max_rounds: int
    budget: int
    cap: int
    enabled: bool


def settings(config) -> Settings:
    from memory import GIB, default_budget

    device = torch.device(config.getoption("bench_device") or ("cuda" if torch.cuda.is_available() else "cpu"))
    cpu = device.type == "cpu"
    budget_gb = config.getoption("mem_budget_gb")
    if budget_gb is None and cpu:
        budget_gb = CPU_BUDGET_GB
    enabled = benchmarks_enabled(config)
    budget = default_budget(device, budget_gb, config.getoption("mem_fraction"))
    cap = config.getoption("max_batch_cap") or (CPU_CAP if cpu else GPU_CAP)
    if not enabled:  # the smoke run: a small search
        budget, cap = min(budget, GIB // 4), min(cap, 4)
    min_time = config.getoption("bench_min_time")
    return Settings(device, config.getoption("bench_dtype"), config.getoption("bench_rounds") or (3 if cpu else 10),
                    (MIN_TIME_CPU if cpu else MIN_TIME_GPU) if min_time is None else min_time,
                    MAX_ROUNDS_CPU if cpu else MAX_ROUNDS_GPU, budget, cap, enabled)


def pytest_configure(config):
    threads = config.getoption("bench_threads", None)
    if threads:  # for every benchmark in the session, bench/test_gradients_bench.py's too
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def bench_settings(request) -> Settings:
    return settings(request.config)


@pytest.fixture(scope="session")
def gen_settings(request):
    """The generation benchmark's settings (bench/generation_options.py)."""
    return generation_settings(request.config, benchmarks_enabled(request.config))


def _grid(config, kind: str) -> list[Case]:
    """The cases of one test (kind: speed, end_to_end or max_batch)."""
    device = config.getoption("bench_device") or ("cuda" if torch.cuda.is_available() else "cpu")
    enabled = benchmarks_enabled(config)
    cpu_plan = enabled and device == "cpu" and config.getoption("bench_grid") == "default"
    models = _csv(config.getoption("bench_models"))
    methods = _csv(config.getoption("bench_methods"))
    if enabled:
        models = models or list(DEFAULT_MODELS)
        lengths = _csv(config.getoption("bench_lengths"), int) or list(LENGTHS)
        batches = _csv(config.getoption("bench_batches"), int) or list(CPU_BATCHES if device == "cpu" else GPU_BATCHES)
        methods = methods or list(METHODS)
    else:  # the smoke run
        models = models or (["tiny-bert"] if kind == "max_batch" else [n for n, spec in MODELS.items() if spec.smoke])
        lengths, batches = [SMOKE_LENGTH], [SMOKE_BATCH]
        methods = methods or list(SMOKE_MAX_BATCH_METHODS if kind == "max_batch" else METHODS)
    for name in models:
        if name not in MODELS:
            raise pytest.UsageError(f"--bench-models: unknown model {name!r}; known: {', '.join(MODELS)}")
    for name in methods:
        if name not in METHODS:
            raise pytest.UsageError(f"--bench-methods: unknown method {name!r}; known: {', '.join(METHODS)}")
    if kind == "end_to_end":
        methods = [m for m in methods if m in END_TO_END_METHODS]
    cases = []
    for model in models:
        if cpu_plan and kind == "end_to_end" and model not in CPU_END_TO_END_MODELS:
            continue
        if cpu_plan and kind == "max_batch" and model not in CPU_MAX_BATCH_MODELS:
            continue
        for method in methods:
            if not applies(model, method):
                continue
            longest, planned = ALL_LENGTHS, None
            if cpu_plan:
                longest, planned = ((CPU_MAX_BATCH_PLAN.get(method, ALL_LENGTHS), None) if kind == "max_batch"
                                    else CPU_PLAN.get((model, method), (ALL_LENGTHS, None)))
            for length in lengths:
                if length > longest:
                    continue
                if kind == "max_batch":
                    cases.append(Case(model, method, length))
                else:
                    cases.extend(Case(model, method, length, b) for b in batches if planned is None or b in planned)
    return cases


_MAX_BATCH_CASES: list[Case] = []


def pytest_generate_tests(metafunc):
    parametrize_generation(metafunc, benchmarks_enabled(metafunc.config))
    for name, kind in (("speed_case", "speed"), ("end_to_end_case", "end_to_end"), ("max_batch_case", "max_batch")):
        if name in metafunc.fixturenames:
            cases = _grid(metafunc.config, kind)
            if kind == "max_batch":
                _MAX_BATCH_CASES[:] = cases
            metafunc.parametrize(name, cases, ids=[case.id for case in cases])


@pytest.fixture(scope="session")
def max_batch_search(bench_settings, request):
    """``search(case) -> {"batch", "trials"}``. The searches of one model and length run together, on first
    request: on CPU in a separate process (bench/max_batch_worker.py), on GPU in this one."""
    import max_batch_worker

    s = bench_settings
    done: dict[tuple[str, int], dict] = {}

    def search(case: Case) -> dict:
        key = (case.model, case.length)
        if key not in done or case.method not in done[key]:
            methods = [c.method for c in _MAX_BATCH_CASES if (c.model, c.length) == key] or [case.method]
            if case.method not in methods:
                methods.append(case.method)
            if s.device.type == "cpu":
                done[key] = max_batch_worker.run(case.model, case.length, methods, s.budget, s.cap, "cpu", s.dtype,
                                                 request.config.getoption("bench_threads"))
            else:
                done[key] = max_batch_worker.search(case.model, case.length, methods, s.budget, s.cap,
                                                    str(s.device), s.dtype)
        return done[key][case.method]

    return search
