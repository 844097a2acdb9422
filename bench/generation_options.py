"""Options, settings and case grid of the generation benchmark across lengths (bench/test_generation_lengths.py),
added to the suite's by bench/conftest.py.

Memory budget of the max-batch search: ``--gen-budget-gb``; by default on CUDA the card's 48 GB (the design card's
GPU) or the device's memory where it has less (``torch.cuda.max_memory_allocated``, weights included), on CPU
``CPU_BUDGET_GB`` of working memory above the loaded model (bench/memory.py). The search runs only where one
batch-1 round took at most ``--gen-search-seconds`` (default 30 s on CPU, no limit on GPU): it costs about
2 x cap rounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from generation_lengths import LENGTHS, LONG_LENGTHS, LONG_METHODS, METHODS, MODELS, SMOKE_LENGTHS

GIB = 1024**3
CARD_GB = 48  # the design card's GPU memory
CPU_BUDGET_GB = 4.0
CPU_CAP, GPU_CAP, SMOKE_CAP = 8, 256, 2
CPU_SEARCH_SECONDS = 30.0
# the default CPU grid (--bench-grid default on CPU): the longest length per method, where all 32 steps take
# minutes (measured at 512 tokens, 1 thread: gradient_x_input and attnlrp ~100 s, alti_logit ~19 s; alti_logit
# ~220 s at 2,048); --bench-grid full or --gen-lengths runs every length
CPU_LONGEST = {"gradient_x_input": 512, "attnlrp": 512, "alti_logit": 2048}
SMOKE_LONG_LENGTHS = (256, 512, 1024)  # the long-context row's smoke run: the tiny Llama at these lengths


@dataclass(frozen=True)
class GenCase:
    model: str
    method: str
    length: int

    @property
    def id(self) -> str:
        return f"{self.model}-{self.method}-L{self.length}"


@dataclass(frozen=True)
class GenSettings:
    device: str
    dtype: str
    threads: int | None
    timer: str  # "process_time" or "perf_counter", as --benchmark-timer says
    rounds: int
    round_seconds: float  # no further round once one took longer
    search_seconds: float  # no max-batch search where a batch-1 round took longer
    budget: int  # bytes
    cap: int
    long_lengths: tuple[int, ...]
    enabled: bool


def _csv(value, cast=str) -> list | None:
    return None if not value else [cast(v.strip()) for v in str(value).split(",") if v.strip()]


def add_generation_options(group) -> None:
    group.addoption("--gen-models", help=f"generation models (default smollm2; known: {', '.join(MODELS)})")
    group.addoption("--gen-methods", help=f"generation methods (default all: {', '.join(METHODS)})")
    group.addoption("--gen-lengths", help=f"generation lengths in tokens (default {','.join(map(str, LENGTHS))})")
    group.addoption("--gen-long-lengths", help="the long-context row's lengths on the tiny long Llama (default "
                                               f"{','.join(map(str, LONG_LENGTHS))})")
    group.addoption("--gen-rounds", type=int, default=3, help="interleaved rounds per generation case (default 3)")
    group.addoption("--gen-round-seconds", type=float, default=60.0,
                    help="no further round once one (forward and method) took longer (default 60)")
    group.addoption("--gen-search-seconds", type=float,
                    help=f"search the max batch only where a batch-1 round took at most this (default "
                         f"{CPU_SEARCH_SECONDS:g} on CPU, no limit on GPU)")
    group.addoption("--gen-budget-gb", type=float,
                    help=f"memory budget of the generation max-batch search (default: CPU {CPU_BUDGET_GB:g} GiB of "
                         f"working memory; CUDA min({CARD_GB} GiB, the device's memory))")
    group.addoption("--gen-cap", type=int, help=f"largest generation batch searched (default {CPU_CAP} on CPU, "
                                                f"{GPU_CAP} on GPU)")


def generation_budget(device_type: str, budget_gb: float | None, device_memory: int | None = None) -> int:
    """The max-batch budget in bytes: ``budget_gb`` if given; on CUDA the card's 48 GiB or ``device_memory`` (the
    device's total) where that is less; on CPU ``CPU_BUDGET_GB``."""
    if budget_gb is not None:
        if not budget_gb > 0:
            raise pytest.UsageError(f"--gen-budget-gb must be positive, got {budget_gb}")
        return int(budget_gb * GIB)
    if device_type == "cuda":
        if device_memory is None:
            raise ValueError("a CUDA budget needs the device's memory")
        return min(CARD_GB * GIB, device_memory)
    return int(CPU_BUDGET_GB * GIB)


def _timer_name(config) -> str:
    timer = config.getoption("benchmark_timer", None)
    return "process_time" if "process_time" in str(getattr(timer, "__name__", timer)) else "perf_counter"


def generation_settings(config, enabled: bool) -> GenSettings:
    import torch

    device = config.getoption("bench_device") or ("cuda" if torch.cuda.is_available() else "cpu")
    cpu = device == "cpu"
    memory = None if cpu else torch.cuda.get_device_properties(torch.device(device)).total_memory
    budget = generation_budget("cpu" if cpu else "cuda", config.getoption("gen_budget_gb"), memory)
    cap = config.getoption("gen_cap") or (CPU_CAP if cpu else GPU_CAP)
    search = config.getoption("gen_search_seconds")
    search = (CPU_SEARCH_SECONDS if cpu else math.inf) if search is None else search
    long_lengths = tuple(_csv(config.getoption("gen_long_lengths"), int) or LONG_LENGTHS)
    rounds, round_seconds = config.getoption("gen_rounds"), config.getoption("gen_round_seconds")
    if not enabled:  # the smoke run: tiny models, a small search, one round
        budget, cap, search, rounds, long_lengths = min(budget, GIB), SMOKE_CAP, math.inf, 1, SMOKE_LONG_LENGTHS
    return GenSettings(device, config.getoption("bench_dtype"), config.getoption("bench_threads"),
                       _timer_name(config), rounds, round_seconds, search, budget, cap, long_lengths, enabled)


def _checked(names: list[str], known, option: str) -> list[str]:
    for name in names:
        if name not in known:
            raise pytest.UsageError(f"{option}: unknown {name!r}; known: {', '.join(known)}")
    return names


def generation_cases(config, enabled: bool) -> list[GenCase]:
    methods = _checked(_csv(config.getoption("gen_methods")) or list(METHODS), METHODS, "--gen-methods")
    if not enabled:
        return [GenCase("tiny-llama", m, length) for length in SMOKE_LENGTHS for m in methods]
    models = _checked(_csv(config.getoption("gen_models")) or ["smollm2"], MODELS, "--gen-models")
    given = _csv(config.getoption("gen_lengths"), int)
    device = config.getoption("bench_device") or ("cuda" if _cuda() else "cpu")
    planned = not given and device == "cpu" and config.getoption("bench_grid") == "default"
    longest = CPU_LONGEST if planned else {}
    return [GenCase(model, m, length) for model in models for length in given or LENGTHS for m in methods
            if length <= min(MODELS[model].positions, longest.get(m, length))]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def parametrize_generation(metafunc, enabled: bool) -> None:
    if "generation_case" in metafunc.fixturenames:
        cases = generation_cases(metafunc.config, enabled)
        metafunc.parametrize("generation_case", cases, ids=[case.id for case in cases])
    if "long_methods" in metafunc.fixturenames:
        chosen = _csv(metafunc.config.getoption("gen_methods"))
        methods = [m for m in LONG_METHODS if not chosen or m in chosen] or list(LONG_METHODS)
        if enabled:  # one case per method, each length in a fresh process: minutes at 32k tokens
            params = [pytest.param((m,), id=m, marks=pytest.mark.slow) for m in methods]
        else:  # the smoke run: every method in one process
            params = [pytest.param(tuple(methods), id="smoke")]
        metafunc.parametrize("long_methods", params)
