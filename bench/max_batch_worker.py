"""The max-batch search of several methods on one model and length, in a process of its own.

    python bench/max_batch_worker.py MODEL LENGTH METHOD[,METHOD...] --budget BYTES --cap N [--device cpu]

prints one JSON object: ``{method: {"batch": ..., "trials": {batch: peak bytes or null}}}``.

On CPU the searches run here rather than in the pytest process: this process starts with glibc's
``MALLOC_MMAP_THRESHOLD_=65536``, so every allocation above 64 KiB is its own mapping, returned to the system when
freed; the resident set then follows the live tensors instead of heap fragments left by earlier calls (measured:
repeated peaks of the same call agree to ~1%, against ±10% in a process with the default allocator settings), and
the timing process keeps its usual allocator. Each method first runs once at batch 1 unmeasured (one-off
allocations: thread pools, lazy initialisation).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def search(model: str, length: int, methods: list[str], budget: int, cap: int, device: str = "cpu",
           dtype: str = "float32") -> dict:
    """The searches, in this process (see :func:`run` for a separate one)."""
    import torch
    from memory import is_out_of_memory, max_batch, peak_memory
    from workloads import Workload

    torch_device = torch.device(device)
    results = {}
    for method in methods:
        Workload(model, method, length, 1, device, dtype).attribute()  # one-off allocations, unmeasured

        def measure(batch: int, method=method) -> int | None:
            work = Workload(model, method, length, batch, device, dtype)
            try:
                peak, _ = peak_memory(work.attribute, torch_device)
            except Exception as error:
                if not is_out_of_memory(error):
                    raise
                return None
            finally:
                del work
                if torch_device.type == "cuda":
                    torch.cuda.empty_cache()
            return peak

        found = max_batch(measure, budget, cap)
        results[method] = {"batch": found.batch, "trials": {str(b): p for b, p in sorted(found.trials.items())}}
    return results


def run(model: str, length: int, methods: list[str], budget: int, cap: int, device: str = "cpu",
        dtype: str = "float32", threads: int | None = None) -> dict:
    """The searches in a fresh Python process with the allocator settings above."""
    command = [sys.executable, str(Path(__file__).resolve()), model, str(length), ",".join(methods),
               "--budget", str(budget), "--cap", str(cap), "--device", device, "--dtype", dtype]
    if threads:
        command += ["--threads", str(threads)]
    root = str(HERE.parent)
    env = {**os.environ, **ENV, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"max-batch worker failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("length", type=int)
    parser.add_argument("methods")
    parser.add_argument("--budget", type=int, required=True, help="bytes")
    parser.add_argument("--cap", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int)
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    results = search(args.model, args.length, args.methods.split(","), args.budget, args.cap, args.device, args.dtype)
    print(json.dumps(results))


if __name__ == "__main__":  # run as a script: Python puts bench/ first on the module path, so memory and workloads
    main()                  # import as they do under pytest
