"""How far the golden outputs move between machines: every stored output (tests/methods/golden) recomputed under
other CPU kernel paths, as a fraction of each output's scale (the measure tests/golden.py compares with).

One process per configuration, each a way a user's machine differs from the one that stored the outputs: the ATen
kernels' instruction set (``ATEN_CPU_CAPABILITY``: avx512 / avx2 / default, i.e. none), MKL's
(``MKL_ENABLE_INSTRUCTIONS``: AVX-512 / AVX2 / SSE4.2, as MKL runs on AMD EPYC and on older Intel chips), oneDNN's
(``DNNL_MAX_CPU_ISA``) and the thread count (1 or 2). Prints a table (Markdown) of the largest deviation per method
and configuration; ``--json FILE`` keeps every number.

    python bench/golden_spread.py [--json spread.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
CONFIGS = {
    "as stored (2 threads)": {},
    "1 thread": {"NORMX_SPREAD_THREADS": "1"},
    "AVX2 (ATen, MKL, oneDNN)": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                                "DNNL_MAX_CPU_ISA": "AVX2"},
    "AVX2, 1 thread": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2",
                       "NORMX_SPREAD_THREADS": "1"},
    "no AVX (ATen default, MKL SSE4.2, oneDNN SSE4.1)": {"ATEN_CPU_CAPABILITY": "default",
                                                          "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
                                                          "DNNL_MAX_CPU_ISA": "SSE41"},
}


def measure() -> dict:
    """{case: {method: (deviation, exact mismatches)}} in this process."""
    sys.path.insert(0, str(TESTS))
    import torch

    threads = os.environ.get("NORMX_SPREAD_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    import golden

    out = {}
    for case in golden.cases():
        if not golden.path(case, "normxlogit").exists():
            continue
        model, tokenizer, texts = golden.build(case)
        out[case] = {}
        for file in sorted(golden.path(case, "normxlogit").parent.glob("*.json.gz")):
            method = file.name.removesuffix(".json.gz")
            got = golden.output(model, tokenizer, texts, method)
            worst, problems = golden.deviation(got, golden.load(case, method))
            out[case][method] = [worst, problems]
    return {"capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            "cases": out}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write every measured deviation here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure()))
        return 0
    runs = {}
    for name, env in CONFIGS.items():
        done = subprocess.run([sys.executable, __file__, "--worker"], env={**os.environ, **env},
                              capture_output=True, text=True, check=True)
        runs[name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{name}: ATen {runs[name]['capability']}, {runs[name]['threads']} threads", file=sys.stderr)
    methods = sorted({m for run in runs.values() for case in run["cases"].values() for m in case})
    print("| method | " + " | ".join(runs) + " |")
    print("|---|" + "---|" * len(runs))
    for method in methods:
        cells = []
        for run in runs.values():
            values = [case[method] for case in run["cases"].values() if method in case]
            worst = max(v[0] for v in values)
            mismatches = sum(len(v[1]) for v in values)
            cells.append(f"{worst:.2g}" + (f" ({mismatches} exact mismatches)" if mismatches else ""))
        print(f"| {method} | " + " | ".join(cells) + " |")
    overall = max(v[0] for run in runs.values() for case in run["cases"].values() for v in case.values())
    print(f"\nlargest deviation over every method, case and configuration: {overall:.3g} of the output's scale")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
