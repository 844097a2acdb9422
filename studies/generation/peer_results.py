"""The generation peers study's results file (docs/results/generation/peers.json), keyed by method so that a method
is added or replaced without touching the others, and the Markdown table of docs/generation.md made from it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from studies.generation.peer_rows import BASELINE, COST_LENGTHS, COST_NEW_TOKENS, MODES, NORMX_CANDIDATES, PEERS
from studies.settings import GENERATION_RESULTS

OUT = GENERATION_RESULTS / "peers.json"


def paired(values: Sequence[float], baseline: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the per-step differences ``values - baseline``."""
    diff = np.asarray(values, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    if diff.size < 2:
        return float(diff.mean()), float("nan")
    return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(diff.size))


@contextlib.contextmanager
def _locked(path: Path):
    """Exclusive access to the results file while an entry is read, merged and written (other sessions add their
    methods' entries with the same commands)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(Path(tempfile.gettempdir()) / "normx_generation_peers.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_report(path: Path = OUT) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def update_report(path: Path, section: str, shared_key: str, shared, entries: Mapping[str, dict],
                  fresh: bool = False, merge: bool = False) -> None:
    """Store ``entries`` (method -> entry) in ``report[section]["methods"]``, leaving every other method's entry
    as it is (``merge``: update the method's stored entry with the given keys instead of replacing it).
    ``report[section][shared_key]`` (the steps, or the cost sequences) must equal ``shared``: entries measured on
    other inputs are not mixed (``fresh``: drop the section's stored entries instead)."""
    with _locked(path):
        report = read_report(path)
        part = report.setdefault(section, {})
        if fresh:
            part.clear()
        if part.get(shared_key) is not None and part[shared_key] != shared:
            raise SystemExit(f"{path}: the stored {section} entries were measured on other {shared_key} than this "
                             "run's; rerun every method with --fresh, or find why the ids changed")
        part[shared_key] = shared
        stored = part.setdefault("methods", {})
        for name, entry in entries.items():
            stored[name] = {**stored.get(name, {}), **entry} if merge else entry
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(report, indent=1) + "\n")
        os.replace(temporary, path)



def _order(names) -> list[str]:
    known = [*NORMX_CANDIDATES, *PEERS]
    return sorted(names, key=lambda n: (known.index(n) if n in known else len(known), n))


def _figure(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def table(path: Path = OUT) -> str:
    """The Markdown table of docs/generation.md from the results file: AOPC (± standard error over the steps),
    the paired per-step difference from recency, and what all steps cost at each length."""
    report = read_report(path)
    faith = report.get("faithfulness", {}).get("methods", {})
    cost = report.get("cost", {})
    results = cost.get("methods", {})
    lengths = [length for length in COST_LENGTHS if any(length in r for r in results.values())]
    head = ["method", "comprehensiveness ↑", "sufficiency ↓", f"comp. − {BASELINE}", f"suff. − {BASELINE}"]
    for length in lengths:
        tokens = cost["sequences"][length]["tokens"]
        head += [f"{tokens} tok: × forward (s)", f"{tokens} tok: peak MiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = faith.get(BASELINE)
    for method in _order(set(faith) | set(results)):
        entry = faith.get(method)
        cells = [f"`{method}`"]
        if entry is None:
            cells += ["—"] * 4
        else:
            cells += [f"{entry['aopc'][m]:.3f} ± {entry['standard_error'][m]:.3f}" for m in MODES]
            for mode in MODES:
                if base is None or method == BASELINE:
                    cells.append("—")
                else:
                    mean, se = paired(entry["per_step"][mode], base["per_step"][mode])
                    cells.append(f"{mean:+.3f} ± {se:.3f}".replace("-", "−"))
        for length in lengths:
            r = results.get(method, {}).get(length)
            cells += ["—", "—"] if r is None else [f"{_figure(r['ratio'])} ({_figure(r['seconds'])})",
                                                   f"{r['peak_mib']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    if faith:
        steps = {e["steps"] for e in faith.values()}
        lines += ["", f"AOPC ± standard error over the {'/'.join(map(str, sorted(steps)))} steps; "
                     f"comp. / suff. − {BASELINE}: the mean per-step difference from {BASELINE} ± its standard "
                     "error (comprehensiveness: positive is better; sufficiency: negative is better)."]
    for length in lengths:
        measured = [r[length] for r in results.values() if length in r]
        seconds = [r["forward_seconds"] for r in measured]
        peaks = [r["forward_peak_mib"] for r in measured]
        lines.append(f"{cost['sequences'][length]['tokens']} tokens ({cost['sequences'][length]['prompt_tokens']} "
                     f"prompt + {COST_NEW_TOKENS} generated): one plain forward pass {min(seconds):.3f}–"
                     f"{max(seconds):.3f} s, peak {min(peaks):.0f}–{max(peaks):.0f} MiB across the methods' "
                     "processes.")
    machines = sorted({(r["cpu"], r["cpus"], r["threads"]) for by in results.values() for r in by.values()
                       if "cpu" in r})
    dates = sorted({r["date"][:10] for by in results.values() for r in by.values() if "date" in r}
                   | {e["date"][:10] for e in faith.values() if "date" in e})
    for cpu, cpus, threads in machines:
        lines.append(f"Cost measured on {cpu} ({cpus} CPUs), torch threads = {threads}.")
    if dates:
        lines.append(f"Measured {' – '.join(dict.fromkeys([dates[0], dates[-1]]))}.")
    return "\n".join(line if line.startswith("|") else textwrap.fill(line, 120, break_on_hyphens=False)
                     for line in lines)


