"""How strongly ``budgeted`` should lean on its prior: the ridge towards the scaled prior (``PRIOR_RIDGE``) chosen on
training contexts from what a run of :mod:`studies.context.budget` recorded, without running the model again.

A ``budgeted`` run with a prior keeps, per context, the masks it ran (``design``), their outcomes (``outcomes``) and
the prior's score of each source (``prior_scores``); the fit is refitted at each strength of the grid
(:func:`normx.methods.ablation.budgeted.fit`) and scored by LDS against the context's 32 real removals (``truth``).
Only runs on the check's own sources (``sources=given``) are read, so that the fit's sources are the LDS's.

    python -m studies.context.prior_strength --records FILE [FILE ...] --out FILE.json

The fits are least squares (``loss="squares"``), as when this study was run and recorded; ``budgeted`` fits
with Huber's loss since :mod:`studies.context.surrogate_loss`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studies.context.recorded import pooled as pooled_by_key
from studies.context.recorded import recorded_runs, run_means

GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.context.prior_strength",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=Path, nargs="+", required=True, help="JSON lines of studies.context.budget")
    parser.add_argument("--out", type=Path, required=True, help="the JSON to write: LDS per strength, per run")
    args = parser.parse_args(argv)

    import numpy as np

    from normx.evaluation.context import metrics
    from normx.methods.ablation.budgeted import fit

    table: dict[str, dict[str, list[float]]] = {}
    given = recorded_runs(args.records, lambda spec, found: "sources=given" in spec and bool(found.get("prior_scores")))
    for run, found, masks, truth in given:
        design, outcomes = np.array(found["design"], bool), np.array(found["outcomes"])
        prior = np.array(found["prior_scores"])
        row = table.setdefault(run, {})
        for strength in GRID:
            fitted = fit(design, outcomes, prior, strength, loss="squares")
            row.setdefault(str(strength), []).append(metrics.lds(fitted, masks, truth))
        row.setdefault("masks only", []).append(metrics.lds(fit(design, outcomes, loss="squares"), masks, truth))
        row.setdefault("prior only", []).append(metrics.lds(prior, masks, truth))
    summary = run_means(table)
    pooled = pooled_by_key(table)
    means = {key: float(np.mean(v)) for key, v in pooled.items()}
    best = max((key for key in means if key not in ("masks only", "prior only")), key=lambda k: means[k])
    args.out.write_text(json.dumps({"runs": summary, "pooled": means, "chosen": float(best)}, indent=1) + "\n",
                        encoding="utf-8")
    for key, mean in means.items():
        print(f"{key:>12}: LDS {mean:.3f} ({len(pooled[key])} contexts)")
    print(f"chosen strength: {best}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
