"""How far the golden outputs move between machines: every stored output (tests/methods/golden/<case>/<method>.json.gz)
recomputed under other CPU kernel paths, as a fraction of each output's scale (the measure tests/golden.py compares
with), recorded per file as the spread its tolerance is derived from.

One pytest process per configuration, each a way a user's machine differs from the one that stored the outputs: the
ATen kernels' instruction set (``ATEN_CPU_CAPABILITY``: the machine's own, avx2, default = none), MKL's
(``MKL_ENABLE_INSTRUCTIONS``), oneDNN's (``DNNL_MAX_CPU_ISA``), MKL's conditional numerical reproducibility
(``MKL_CBWR=COMPATIBLE``: MKL's SSE2 code paths, as on a CPU MKL does not optimise for) and the thread count. Each
runs tests/methods/test_golden.py with ``NORMX_GOLDEN_RECORD`` set, so the golden cases are the tests' own and this
script imports none of them. A file's spread is its largest deviation over the configurations.

    python -m studies.golden.spread --out tests/methods/golden/spread.json [--methods attnlrp,decompx]
    python -m studies.golden.spread --second-pass    # CI: the golden tests under SECOND_PASS, asserted

``--out`` merges: the measured files' entries are replaced, the others kept (a new method measures only its own
files). Prints the largest spread per method and configuration, and per case and method (Markdown).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = "tests/methods/test_golden.py"
GOLDEN = REPO / "tests" / "methods" / "golden"
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2"}
NO_AVX = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "DNNL_MAX_CPU_ISA": "SSE41"}
# .ci/run's second pass of the golden tests runs under this one (it reproduces the failure an Intel Xeon showed
# with AttnLRP's conservation compared in logit units: docs/golden.md)
SECOND_PASS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "2"}
CONFIGS = {  # name: (what it is, its environment)
    "1-thread": ("1 thread", {"OMP_NUM_THREADS": "1"}),
    "2-threads": ("2 threads", {"OMP_NUM_THREADS": "2"}),
    "avx2-1-thread": ("AVX2 (ATen, MKL, oneDNN), 1 thread", {**AVX2, "OMP_NUM_THREADS": "1"}),
    "avx2-2-threads": ("AVX2 (ATen, MKL, oneDNN), 2 threads", {**AVX2, "OMP_NUM_THREADS": "2"}),
    "no-avx-1-thread": ("no AVX (ATen default, MKL SSE4.2, oneDNN SSE4.1), 1 thread",
                        {**NO_AVX, "OMP_NUM_THREADS": "1"}),
    "mkl-cbwr-1-thread": ("MKL_CBWR=COMPATIBLE, 1 thread", {"MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "1"}),
    "second-pass": ("CI's second pass (ATen default, MKL_CBWR=COMPATIBLE, 2 threads)", SECOND_PASS),
}
# switches a caller's environment must not leak into a configuration
KNOBS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR",
         "DNNL_MAX_CPU_ISA", "NORMX_UPDATE_GOLDEN", "NORMX_GOLDEN_RECORD")


def stored(methods: set[str] | None) -> list[tuple[str, str]]:
    """(case, method) of every stored file (of ``methods`` only, where given)."""
    pairs = sorted((file.parent.name, file.name.removesuffix(".json.gz")) for file in GOLDEN.glob("*/*.json.gz"))
    return [(case, method) for case, method in pairs if methods is None or method in methods]


def run(name: str, env: dict[str, str], pairs: list[tuple[str, str]]) -> dict[tuple[str, str], dict]:
    """Each file's record (deviation, exact mismatches, ATen capability, threads) under one configuration."""
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "record.jsonl"
        base = {k: v for k, v in os.environ.items() if k not in KNOBS}
        ids = [f"{TESTS}::test_outputs_unchanged[{case}-{method}]" for case, method in pairs]
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ids], cwd=REPO,
                              env={**base, **env, "NORMX_GOLDEN_RECORD": str(record)}, capture_output=True,
                              text=True)
        if done.returncode != 0:
            raise SystemExit(f"{name}: pytest exited with {done.returncode}:\n{done.stdout[-3000:]}{done.stderr}")
        lines = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    got = {(line["case"], line["method"]): line for line in lines}
    skipped = [pair for pair in pairs if pair not in got]
    if skipped:
        print(f"{name}: {len(skipped)} not measured (skipped by the tests: {skipped[:3]} ...)", file=sys.stderr)
    return got


def _machine() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def merge(out: Path, runs: dict[str, dict], configurations: dict) -> dict:
    """``out``'s table with the measured files' entries replaced (an entry: its spread, the configuration where it
    was largest, the deviation under each)."""
    table = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {"runs": [], "spread": {}}
    table["about"] = ("The largest deviation of each stored golden output from its file, as a fraction of its scale, "
                      "over the configurations of its run: python -m studies.golden.spread --out " +
                      str(out.relative_to(REPO) if out.is_relative_to(REPO) else out))
    pairs = sorted({pair for got in runs.values() for pair in got})
    for case, method in pairs:
        by = {name: got[(case, method)]["deviation"] for name, got in runs.items() if (case, method) in got}
        where = max(by, key=by.get)
        table["spread"].setdefault(case, {})[method] = {"spread": by[where], "where": where,
                                                        "by_configuration": by}
    table["spread"] = {case: dict(sorted(methods.items())) for case, methods in sorted(table["spread"].items())}
    table["runs"].append({"date": datetime.date.today().isoformat(), "machine": _machine(),
                          "cores": os.cpu_count(), "torch": version("torch"), "files": len(pairs),
                          "configurations": configurations})
    return table


def tables(runs: dict[str, dict]) -> str:
    """Markdown: the largest spread per method and configuration; per case and method (over configurations)."""
    methods = sorted({method for got in runs.values() for _, method in got})
    cases = sorted({case for got in runs.values() for case, _ in got})
    lines = ["| method | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
    for method in methods:
        cells = [max((r["deviation"] for (_, m), r in got.items() if m == method), default=0.0)
                 for got in runs.values()]
        lines.append(f"| {method} | " + " | ".join(f"{c:.2g}" for c in cells) + " |")
    lines += ["", "| case | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for case in cases:
        cells = []
        for method in methods:
            found = [got[(case, method)] for got in runs.values() if (case, method) in got]
            refused = found and all(r["refused"] for r in found)
            cells.append("" if not found else "-" if refused else f"{max(r['deviation'] for r in found):.2g}")
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", "(-: the method refuses the model, as stored)"])


def dump(table: dict) -> str:
    """``table`` as JSON with one line per file's entry (readable diffs)."""
    spread = table["spread"]
    head = json.dumps({k: v for k, v in table.items() if k != "spread"}, indent=1)[:-2]
    cases = [f'  {json.dumps(case)}: {{\n' + ",\n".join(f"   {json.dumps(m)}: {json.dumps(entry)}"
                                                      for m, entry in methods.items()) + "\n  }"
             for case, methods in spread.items()]
    return head + ',\n "spread": {\n' + ",\n".join(cases) + "\n }\n}\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="merge the measured spreads into this table (tests/methods/golden/spread.json)")
    parser.add_argument("--methods", default=None, help="comma-separated: measure only these methods' files")
    parser.add_argument("--configs", default=None, help=f"comma-separated, of {', '.join(CONFIGS)} (default: all)")
    parser.add_argument("--second-pass", action="store_true",
                        help=f"run {TESTS} (asserted, not measured) under {CONFIGS['second-pass'][0]}")
    args = parser.parse_args()
    if args.second_pass:
        base = {k: v for k, v in os.environ.items() if k not in KNOBS}
        return subprocess.run([sys.executable, "-m", "pytest", "-q", TESTS], cwd=REPO,
                              env={**base, **SECOND_PASS}).returncode
    pairs = stored(set(args.methods.split(",")) if args.methods else None)
    if not pairs:
        parser.error(f"no stored golden files of {args.methods} under {GOLDEN}")
    names = args.configs.split(",") if args.configs else list(CONFIGS)
    unknown = [name for name in names if name not in CONFIGS]
    if unknown:
        parser.error(f"unknown configurations {unknown}; known: {list(CONFIGS)}")
    runs, configurations = {}, {}
    for name in names:
        label, env = CONFIGS[name]
        runs[name] = run(name, env, pairs)
        seen = sorted({(r["capability"], r["threads"]) for r in runs[name].values()})
        configurations[name] = {"label": label, "env": env, "aten_capability_threads": seen}
        print(f"{name}: ATen capability, threads {seen}", file=sys.stderr)
    print(tables({CONFIGS[name][0]: got for name, got in runs.items()}))
    overall = max(r["deviation"] for got in runs.values() for r in got.values())
    print(f"\nlargest deviation over {len(pairs)} files and {len(runs)} configurations: {overall:.3g} of the scale")
    mismatched = {pair for got in runs.values() for pair, r in got.items() if r["problems"]}
    if mismatched:
        print("exact mismatches (tokens, labels, layers, predicted label); these files are not recorded:\n" +
              "\n".join(f"{name}: {pair}: {r['problems'][:2]}" for name, got in runs.items()
                        for pair, r in got.items() if r["problems"]), file=sys.stderr)
        runs = {name: {pair: r for pair, r in got.items() if pair not in mismatched} for name, got in runs.items()}
    if args.out:
        args.out.write_text(dump(merge(args.out.resolve(), runs, configurations)), encoding="utf-8")
    return 1 if mismatched else 0


if __name__ == "__main__":
    raise SystemExit(main())
