"""The records of several ``studies.context.budget`` runs read together (resumable runs over further contexts of the
same layout write files of their own): per method, LDS mean ± standard error over the contexts where both it and the
reference ran, its difference from the reference paired by context, its cost (× a plain forward: median, range, how
many contexts above 6×) and, for a method that plans its passes (``budgeted``), the passes it planned, the measured
cost over them and the masks it bought. ``--by kind`` reads each kind of context apart (``qa``, ``claim``: the
context's id begins with it); ``--by found``, the contexts by whether the first method's own sources (its design's
columns, or its groups' sources) are fewer than the check's, as many or more (sentences it found in the prompt
against the check's).

    python -m studies.context.pooled docs/results/context-budgeted/passages.jsonl \\
        docs/results/context-budgeted/passages-6.jsonl docs/results/context-budgeted/passages-12.jsonl \\
        --methods "budgeted:seed=0" --reference contextcite@32 --out FILE.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def pooled(records: list[dict], methods: list[str], reference: str) -> list[dict]:
    """One row per method (the reference's own first): contexts, LDS, paired difference, cost."""
    import numpy as np

    def se(values) -> float:
        return float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else 0.0

    rows = []
    for method in [reference, *[m for m in methods if m != reference]]:
        both = [r["methods"] for r in records if method in r["methods"] and reference in r["methods"]]
        if not both:
            continue
        lds = np.array([m[method]["lds"] for m in both])
        paired = lds - np.array([m[reference]["lds"] for m in both])
        cost = np.array([m[method]["cost"] for m in both])
        plans = [m[method] for m in both if "passes" in m[method]]  # runs that count their own passes
        planned = np.array([m["passes"] for m in plans])
        over_plan = np.array([m["cost"] for m in plans]) / planned if plans else []
        rows.append({"method": method, "contexts": len(both), "lds": float(lds.mean()), "lds_se": se(lds),
                     "paired": float(paired.mean()), "paired_se": se(paired), "cost_median": float(np.median(cost)),
                     "cost_min": float(cost.min()), "cost_max": float(cost.max()),
                     "over_6": int((cost > 6).sum()),
                     "over_6_first_calls": sum(m[method]["cost"] > 6 and bool(m[method].get("first_call"))
                                               for m in both),
                     "planned_median": float(np.median(planned)) if plans else None,
                     "masks_mean": float(np.mean([m["masks"] for m in plans])) if plans and all(
                         "masks" in m for m in plans) else None,
                     "measured_over_planned": float(np.median(over_plan)) if plans else None})
    return rows


def group_of(record: dict, by: str | None, method: str) -> str:
    """The group a context falls in (:data:`BY`); ``"all"`` without ``by``; ``""`` where the method has no design."""
    if by is None:
        return "all"
    if by == "kind":
        return record["id"].split("-")[0]
    found = record["methods"].get(method, {})
    if not found.get("design"):
        return ""
    own = sum(len(group) for group in found["groups"]) if found.get("groups") else len(found["design"][0])
    return ("fewer sources than the check's" if own < record["sources"] else
            "more sources than the check's" if own > record["sources"] else "the check's sources")


BY = ("kind", "found")


def table(rows: list[dict], reference: str) -> str:
    lines = [f"| method | contexts | LDS | paired with `{reference}` | cost (× a forward, median, range) | over 6× "
             "(first calls) | "
             "planned passes (median) | measured / planned (median) | masks (mean) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        paired = "—" if row["method"] == reference else f"{row['paired']:+.3f} ± {row['paired_se']:.3f}"
        lines.append(f"| `{row['method']}` | {row['contexts']} | {row['lds']:.3f} ± {row['lds_se']:.3f} | {paired} | "
                     f"{row['cost_median']:.1f} ({row['cost_min']:.1f}–{row['cost_max']:.1f}) | {row['over_6']} "
                     f"({row['over_6_first_calls']}) | "
                     + ("— | — |" if row["planned_median"] is None else
                        f"{row['planned_median']:.2f} | {row['measured_over_planned']:.2f} |")
                     + (" — |" if row.get("masks_mean") is None else f" {row['masks_mean']:.1f} |"))
    return "\n".join(lines) + "\n"


def read(paths: list[Path]) -> list[list[dict]]:
    """Each file's records (the JSON lines of :mod:`studies.context.budget`); a context in two of the files is
    refused (pooled, each context counts once)."""
    seen: set[str] = set()
    out = []
    for path in paths:
        out.append([json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()])
        for record in out[-1]:
            if record["id"] in seen:
                raise SystemExit(f"{path}: context {record['id']} is in another of the files too")
            seen.add(record["id"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.context.pooled", description=__doc__.split("\n\n")[0])
    parser.add_argument("records", type=Path, nargs="+", help="JSON lines written by studies.context.budget")
    parser.add_argument("--methods", required=True, help="space-separated specs, as the runs named them")
    parser.add_argument("--reference", default="contextcite@32")
    parser.add_argument("--by", choices=BY, default=None, help="read the contexts in groups: their kind, or whether "
                        "the first method found fewer, as many or more sources than the check's")
    parser.add_argument("--out", type=Path, required=True, help="the JSON to write: one row per method (the table "
                        "is printed)")
    args = parser.parse_args(argv)
    records = {record["id"]: record for found in read(args.records) for record in found}
    methods = args.methods.split()
    groups: dict[str, list[dict]] = {}
    for record in records.values():
        groups.setdefault(group_of(record, args.by, methods[0]), []).append(record)
    found = {name: pooled(members, methods, args.reference) for name, members in sorted(groups.items()) if name}
    rows = found.get("all")
    args.out.write_text(json.dumps({"records": [str(p) for p in args.records], "reference": args.reference,
                                    **({"rows": rows} if args.by is None else {"by": args.by, "groups": found})},
                                   indent=1) + "\n", encoding="utf-8")
    for name, group_rows in found.items():
        print(("" if args.by is None else f"{name}:\n") + table(group_rows, args.reference), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
