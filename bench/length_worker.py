"""One generation-benchmark case in a process of its own: time, peak memory and max batch of a method at given
lengths, beside the plain forward on the same ids.

    python bench/length_worker.py MODEL METHOD[,METHOD...] LENGTH[,LENGTH...] --budget BYTES --cap N \
        [--rounds N] [--round-seconds S] [--device cpu] [--dtype float32] [--threads N] [--timer process_time]

prints one JSON object ``{method: {length: figures}}`` (see :func:`measure_case`). The process starts with the
allocator settings of bench/max_batch_worker.py (``MALLOC_MMAP_THRESHOLD_=65536``: freed tensors go back to the
system, so each trial's peak is its own; bench/memory.py measures it: CPU working memory above the loaded model from
``VmHWM``, CUDA ``torch.cuda.max_memory_allocated``). Before anything is measured, the forward and each method run
once on a short sequence (one-off allocations: thread pools, lazy initialisation).

Per length: ``rounds`` interleaved rounds (the plain forward, then the method, the same timer), fewer when one round
takes more than ``round_seconds``; the peak memory of each is that of its first round; every method's result is
checked (bench/generation_lengths.py's check_rows). Then, with ``cap > 1``, the max-batch search of
bench/memory.py (doubling, then binary search; batch 1 is the first round) with the time per instance of each trial.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from max_batch_worker import ENV, HERE

WARMUP_LENGTH = 64  # the short sequence of the unmeasured first calls
TIMERS = {"process_time": time.process_time, "perf_counter": time.perf_counter}


def _timed(fn, timer, device, measure_peak: bool):
    """(seconds, peak bytes or None, result) of one call."""
    from memory import is_out_of_memory, peak_memory

    start = timer()
    try:
        if measure_peak:
            peak, result = peak_memory(fn, device)
        else:
            peak, result = None, fn()
    except Exception as error:
        if not is_out_of_memory(error):
            raise
        return None, None, None
    return timer() - start, peak, result


def measure_case(model: str, method: str, length: int, *, rounds: int, round_seconds: float, budget: int, cap: int,
                 search_seconds: float = math.inf, device: str = "cpu", dtype: str = "float32",
                 timer: str = "perf_counter") -> dict:
    """The figures of one method at one length: ``seconds`` / ``forward_seconds`` (per round, batch 1),
    ``ratio_to_forward`` (median of method round / the forward just before it), ``peak_bytes`` /
    ``forward_peak_bytes`` (first round each), ``out_of_memory`` (the method's first round ran out of memory), and
    with ``cap > 1`` ``max_batch``, ``trials`` (batch: peak bytes, None = out of memory) and ``batch_seconds``
    (batch: time per instance), or ``search_skipped`` (why not) where a batch-1 round took over ``search_seconds``."""
    import torch
    from generation_lengths import GenerationWorkload, check_rows
    from memory import max_batch

    clock = TIMERS[timer]
    work = GenerationWorkload(model, method, length, 1, device, dtype)
    torch_device = work.torch_device
    forward_times, times, peaks = [], [], {}
    for index in range(rounds):
        spent, peak, _ = _timed(work.forward, clock, torch_device, index == 0)
        if index == 0:
            peaks["forward"] = peak
        forward_times.append(spent)
        if method == "forward":
            seconds = spent
        else:
            seconds, peak, result = _timed(work.attribute, clock, torch_device, index == 0)
            if index == 0:
                peaks["method"] = peak
                if result is not None:
                    check_rows(work, result)
        if seconds is None:  # out of memory
            break
        times.append(seconds)
        if seconds + (spent or 0) > round_seconds:
            break
    figures = {"seconds": times, "forward_seconds": forward_times[:len(times) or 1],
               "forward_peak_bytes": peaks["forward"], "peak_bytes": peaks.get("method", peaks["forward"]),
               "out_of_memory": not times}
    pairs = [(t, f) for t, f in zip(times, forward_times) if f]
    if pairs:
        figures["ratio_to_forward"] = statistics.median(t / f for t, f in pairs)
    if cap > 1 and times and times[0] > search_seconds:
        figures["search_skipped"] = f"a batch-1 round took {times[0]:.0f} s (> {search_seconds:g} s)"
    elif cap > 1 and times:
        batch_seconds = {1: times[0]}

        def trial(batch: int) -> int | None:
            if batch == 1:
                return figures["peak_bytes"]
            trial_work = GenerationWorkload(model, method, length, batch, device, dtype)
            spent, peak, result = _timed(trial_work.attribute, clock, torch_device, True)
            del trial_work, result
            if torch_device.type == "cuda":
                torch.cuda.empty_cache()
            if spent is not None:
                batch_seconds[batch] = spent / batch
            return peak

        found = max_batch(trial, budget, cap)
        figures.update(max_batch=found.batch, max_batch_cap=cap, budget_bytes=budget,
                       trials={str(b): p for b, p in sorted(found.trials.items())},
                       batch_seconds={str(b): s for b, s in sorted(batch_seconds.items())})
    return figures


def warm_up(model: str, methods: list[str], device: str, dtype: str) -> None:
    """Each method and the forward once on a short sequence, unmeasured."""
    from generation_lengths import GenerationWorkload

    for method in dict.fromkeys(["forward", *methods]):
        GenerationWorkload(model, method, WARMUP_LENGTH, 1, device, dtype).attribute()


def run(model: str, methods: list[str], lengths: list[int], *, budget: int, cap: int, rounds: int = 1,
        round_seconds: float = 60.0, search_seconds: float = math.inf, device: str = "cpu", dtype: str = "float32",
        threads: int | None = None, timer: str = "perf_counter") -> dict:
    """:func:`measure_case` for each method and length, in a fresh Python process (see the module docstring);
    ``{method: {length (str): figures}}``."""
    command = [sys.executable, str(Path(__file__).resolve()), model, ",".join(methods), ",".join(map(str, lengths)),
               "--budget", str(budget), "--cap", str(cap), "--rounds", str(rounds), "--round-seconds",
               str(round_seconds), "--search-seconds", str(search_seconds), "--device", device, "--dtype", dtype,
               "--timer", timer]
    if threads:
        command += ["--threads", str(threads)]
    paths = [str(HERE.parent), str(HERE.parent / "tests"), os.environ.get("PYTHONPATH")]
    env = {**os.environ, **ENV, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"length worker failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("methods")
    parser.add_argument("lengths")
    parser.add_argument("--budget", type=int, required=True, help="bytes")
    parser.add_argument("--cap", type=int, required=True, help="largest batch searched (1: no search)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--round-seconds", type=float, default=60.0,
                        help="no further round once one (forward and method) took longer")
    parser.add_argument("--search-seconds", type=float, default=math.inf,
                        help="no max-batch search where a batch-1 round took longer")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--timer", choices=tuple(TIMERS), default="perf_counter")
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    methods = args.methods.split(",")
    warm_up(args.model, methods, args.device, args.dtype)
    out = {method: {length: measure_case(args.model, method, int(length), rounds=args.rounds,
                                         round_seconds=args.round_seconds, budget=args.budget, cap=args.cap,
                                         search_seconds=args.search_seconds, device=args.device, dtype=args.dtype,
                                         timer=args.timer)
                    for length in args.lengths.split(",")}
           for method in methods}
    print(json.dumps(out))


if __name__ == "__main__":  # run as a script: bench/ is first on the module path
    main()
