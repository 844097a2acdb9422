"""Which loss ``budgeted``'s linear surrogate should be fitted with, chosen on training contexts from what a run of
:mod:`studies.context.budget` recorded, without running the model again.

A ``budgeted`` run keeps, per context, the masks it ran (``design``) and the response's log-probability under each
(``outcomes``). Each is refitted (:func:`normx.methods.ablation.budgeted.surrogate`, no prior) with least squares and
with Huber's loss at a grid of corners (``corner``, in robust standard deviations of the residuals), and
scored by LDS against the context's 32 real removals (``truth``). LDS ranks the masks' outcomes, so a few masks far
off a linear surrogate (a removal that changes the answer) can tilt a least-squares fit away from the order of all the
others. The runs read are those without a prior whose design has a column per source of the context (the fit's
sources are the LDS's), of the specs given (``--spec``, a part of the spec each run's must contain; by default all).

    python -m studies.context.surrogate_loss --records FILE [FILE ...] [--spec TEXT] --out FILE.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studies.context.recorded import pooled as pooled_by_key
from studies.context.recorded import recorded_runs, run_means

CORNERS = (0.5, 1.0, 1.345, 2.0, 3.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.context.surrogate_loss",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=Path, nargs="+", required=True, help="JSON lines of studies.context.budget")
    parser.add_argument("--spec", default="", help="read only the runs whose spec contains this text")
    parser.add_argument("--out", type=Path, required=True, help="the JSON to write: LDS per loss, per run")
    args = parser.parse_args(argv)

    import numpy as np

    from normx.evaluation.context import metrics
    from normx.methods.ablation import budgeted

    def keep(spec: str, found: dict) -> bool:
        return args.spec in spec and not found.get("prior_scores")

    table: dict[str, dict[str, list[float]]] = {}
    for run, found, masks, truth in recorded_runs(args.records, keep):
        design, outcomes = np.array(found["design"], bool), np.array(found["outcomes"])
        if design.shape[1] != masks.shape[1]:  # (the method's own sources, or groups: not the LDS's)
            continue
        row = table.setdefault(run, {})
        row.setdefault("squares", []).append(
            metrics.lds(budgeted.surrogate(design, outcomes, loss="squares"), masks, truth))
        for corner in CORNERS:
            row.setdefault(f"huber {corner}", []).append(
                metrics.lds(budgeted.surrogate(design, outcomes, corner=corner), masks, truth))
    pooled = pooled_by_key(table)
    means = {key: float(np.mean(values)) for key, values in pooled.items()}
    summary = run_means(table)
    best = max(means, key=means.get) if means else None
    args.out.write_text(json.dumps({"runs": summary, "pooled": means, "chosen": best}, indent=1) + "\n",
                        encoding="utf-8")
    for key, mean in means.items():
        print(f"{key:>12}: LDS {mean:.4f} ({len(pooled[key])} contexts)")
    print(f"chosen: {best}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
