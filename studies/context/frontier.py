"""The cost–faithfulness frontier of context attribution: one point per method and budget, LDS (mean over the
contexts, ± its standard error) against cost (the median over the contexts of the method's wall time over a plain
forward pass), one panel per set of contexts, from records the studies already wrote (no model is run).

Two kinds of records: the JSON lines of :mod:`studies.context.budget` (``--budget LABEL=FILE``: its methods by spec,
``budgeted`` at each budget, ContextCite's estimator, ``calibrated_attention``) and the ``report.json`` of
``normx evaluate context`` or :mod:`studies.context.peers` (``--report LABEL=FILE``: normx's readings and the peers:
ContextCite's own ``ContextCiter``, AT2, FlashTrace). Readings that cost nothing (``random``, ``position``) are drawn
as lines across their panel. Writes a PNG and, beside it, the points as JSON (``FILE.json``).

    python -m studies.context.frontier --budget "300 tokens, sentences=FILE" ... --report "LABEL=FILE" \\
        --out docs/context-frontier.png
    python -m studies.context.frontier --budget "LABEL=FILE,FILE,..." ...   # several budget files, pooled
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

FREE = ("random", "position")  # readings with no model work: lines, not points


def budget_points(files: list[Path], only: set[str]) -> dict[str, dict]:
    """{spec: point} of a budget study's records (one file or several, pooled: a context in two is refused): the
    contexts that have every spec of ``only`` that every file holds (all points of a panel on the same contexts), each
    spec every one of them has."""
    import numpy as np

    from studies.context.pooled import read

    found = read(files)
    held = set.intersection(*({spec for r in records for spec in r["methods"]} for records in found))
    records = [r for records in found for r in records]
    records = [r for r in records if all(spec in r["methods"] for spec in only & held)]
    specs = [spec for spec in records[0]["methods"] if all(spec in r["methods"] for r in records)]
    return {spec: point([r["methods"][spec]["lds"] for r in records],
                        [r["methods"][spec].get("cost", np.nan) for r in records]) for spec in specs}


def report_points(files: list[Path], only: set[str]) -> dict[str, dict]:
    """{reading: point} of an evaluate-context report (its records' LDS and costs), for the readings every context
    has."""
    if len(files) != 1:
        raise SystemExit(f"a report is one file, got {len(files)}")
    data = json.loads(files[0].read_text(encoding="utf-8"))
    found: dict[str, tuple[list, list]] = {}
    for record in data["records"]:
        for name, reading in record["readings"].items():
            lds, cost = found.setdefault(name, ([], []))
            lds.append(reading["lds"])
            # (each reading's seconds over the plain forward run just before it, as the report's own cost)
            seconds, forward = reading.get("seconds"), reading.get("forward_seconds", record.get("forward_seconds"))
            cost.append(seconds / forward if seconds and forward else math.nan)
    total = len(data["records"])  # a reading some contexts lack (a peer that failed on one) is left out
    return {name: point(lds, cost) for name, (lds, cost) in found.items() if len(lds) == total}


def point(lds: list[float], cost: list[float]) -> dict:
    import numpy as np

    lds, cost = np.asarray(lds, float), np.asarray(cost, float)
    cost = cost[np.isfinite(cost) & (cost > 0)]
    return {"lds": float(lds.mean()), "se": float(lds.std(ddof=1) / np.sqrt(len(lds))) if len(lds) > 1 else 0.0,
            "cost": float(np.median(cost)) if len(cost) else None, "contexts": len(lds)}


def draw(panels: dict[str, dict[str, dict]], out: Path) -> None:
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    columns = min(2, len(panels))
    rows = -(-len(panels) // columns)
    fig = Figure(figsize=(6.4 * columns, 4.4 * rows), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).flatten()
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    ticks = [1, 1.5, 2, 3, 5, 10, 20, 50, 100]
    for ax, (label, points) in zip(axes, panels.items()):
        placed = sorted(((found["cost"], found["lds"], name) for name, found in points.items()
                         if found["cost"] is not None and name not in FREE))
        for k, (cost, lds, name) in enumerate(placed):
            found = points[name]
            ax.errorbar(cost, lds, yerr=found["se"], fmt="o", markersize=4, capsize=2,
                        color="C3" if name.startswith("budgeted") else "C0")
            ax.annotate(name, (cost, lds), textcoords="offset points", xytext=(5, 4 if k % 2 else -11), fontsize=7)
        for name, found in points.items():
            if found["cost"] is None or name in FREE:
                ax.axhline(found["lds"], color="0.6", linestyle="--", linewidth=1)
                ax.annotate(name, (0.99, found["lds"]), xycoords=("axes fraction", "data"), ha="right",
                            va="bottom", fontsize=7, color="0.4")
        ax.set_xscale("log")
        ax.set_xlim(0.9, 130)
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticklabels([f"{t:g}×" for t in ticks])
        ax.set_xlabel("cost (× a plain forward pass, median over the contexts)")
        ax.set_ylabel("LDS (mean ± s.e.)")
        ax.set_title(label, fontsize=10)
        ax.grid(True, alpha=0.3)
    fig.suptitle("Context attribution on SmolLM2-135M-Instruct, held-out contexts: faithfulness against cost "
                 "(red: budgeted; dashed: no model work)", fontsize=11)
    fig.savefig(out, format="png", dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.context.frontier", description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", action="append", default=[], help="LABEL=FILE: a budget study's JSON lines "
                        "(FILE,FILE,...: several, pooled)")
    parser.add_argument("--report", action="append", default=[], help="LABEL=FILE: an evaluate-context report.json")
    parser.add_argument("--only", action="append", default=[], help="a method / spec to draw, once per flag "
                        "(specs hold commas; default: every one)")
    parser.add_argument("--name", action="append", default=[], help="SPEC=NAME: what a spec is called in the "
                        "figure (e.g. budgeted:seed=0=budgeted; the last '=' splits); where a panel has two specs of "
                        "one name, the one named later wins")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write (and FILE.json, the points)")
    args = parser.parse_args(argv)
    only = set(args.only)
    names = dict(given.rpartition("=")[::2] for given in args.name)
    panels: dict[str, dict[str, dict]] = {}
    for given, read in [(b, budget_points) for b in args.budget] + [(r, report_points) for r in args.report]:
        label, sep, file = given.rpartition("=")
        if not sep:
            raise SystemExit(f"give LABEL=FILE, not {given!r}")
        chosen: dict[str, tuple[int, dict]] = {}  # name -> (the spec's place among the --name flags, its point)
        for spec, found in read([Path(name) for name in file.split(",")], only).items():
            rank = list(names).index(spec) if spec in names else -1
            name = names.get(spec, spec)
            if (not only or spec in only) and rank >= chosen.get(name, (-2, None))[0]:
                chosen[name] = (rank, found)
        panels.setdefault(label, {}).update({name: found for name, (_, found) in chosen.items()})
    if not panels:
        raise SystemExit("give at least one --budget or --report")
    draw(panels, args.out)
    Path(str(args.out) + ".json").write_text(json.dumps(panels, indent=1) + "\n", encoding="utf-8")
    for label, points in panels.items():
        print(label)
        for name, found in sorted(points.items(), key=lambda kv: kv[1]["cost"] or 0):
            cost = "—" if found["cost"] is None else f"{found['cost']:.1f}×"
            print(f"  {name:55s} LDS {found['lds']:.3f} ± {found['se']:.3f}  cost {cost}  ({found['contexts']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
