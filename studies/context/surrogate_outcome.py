"""Which outcome ``budgeted``'s linear surrogate should fit, chosen on training contexts from what a run of
:mod:`studies.context.budget` recorded, without running the model again.

A ``budgeted`` run keeps, per context, the masks it ran (``design``) and the response's log-probability under each
(``outcomes``). Each is refitted (:func:`normx.methods.ablation.budgeted.fit`, no prior) to a monotone transform of
the outcome and scored by LDS against the context's 32 real removals (``truth``): a transform changes what the
linear fit can express, not what LDS ranks. The runs read are those of ``--spec`` (by default the balanced budget on
the check's own sources, no prior: the fit's sources are the LDS's) that removed every source alone. The
transforms: the log-probability itself (``log p``), the log of the negative log-likelihood (``log nll``: a source
that multiplies the loss adds a constant), its square root, the outcomes' ranks, and exp(log p / |median log p|).

    python -m studies.context.surrogate_outcome --records FILE [FILE ...] [--spec SPEC] --out FILE.json

The fits are least squares (``loss="squares"``), as when this study was run and recorded; ``budgeted`` fits
with Huber's loss since :mod:`studies.context.surrogate_loss`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studies.context.recorded import pooled as pooled_by_key
from studies.context.recorded import recorded_runs


def transforms():
    import numpy as np
    from scipy.stats import rankdata

    def nll(y):
        return np.maximum(-y, 1e-6)

    return {"log p": lambda y: y, "log nll": lambda y: -np.log(nll(y)), "sqrt nll": lambda y: -np.sqrt(nll(y)),
            "rank": rankdata, "exp(log p / |median|)": lambda y: np.exp(y / abs(np.median(y)))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.context.surrogate_outcome",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=Path, nargs="+", required=True, help="JSON lines of studies.context.budget")
    parser.add_argument("--spec", default="budgeted:sources=given,prior=none", help="the recorded runs to refit")
    parser.add_argument("--out", type=Path, required=True, help="the JSON to write: LDS per transform, per run")
    args = parser.parse_args(argv)

    import numpy as np

    from normx.evaluation.context import metrics
    from normx.methods.ablation.budgeted import fit

    table: dict[str, dict[str, list[float]]] = {}
    alone = recorded_runs(args.records, lambda spec, found: spec == args.spec and not found.get("groups"))
    for run, found, masks, truth in alone:
        design, outcomes = np.array(found["design"], bool), np.array(found["outcomes"])
        row = table.setdefault(run, {})
        for name, transform in transforms().items():
            row.setdefault(name, []).append(metrics.lds(fit(design, transform(outcomes), loss="squares"), masks, truth))
    pooled = pooled_by_key(table)
    base = np.array(pooled["log p"])
    summary = {key: {"mean": float(np.mean(v)), "paired": float(np.mean(np.array(v) - base)),
                     "paired_se": float(np.std(np.array(v) - base, ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0,
                     "wins": int(np.sum(np.array(v) > base)), "losses": int(np.sum(np.array(v) < base)),
                     "contexts": len(v)} for key, v in pooled.items()}
    runs = {run: {key: float(np.mean(v)) for key, v in row.items()} for run, row in table.items()}
    args.out.write_text(json.dumps({"runs": runs, "pooled": summary}, indent=1) + "\n", encoding="utf-8")
    for key, found in summary.items():
        print(f"{key:>22}: LDS {found['mean']:.3f}, paired with log p {found['paired']:+.3f} ± {found['paired_se']:.3f}"
              f" ({found['wins']} wins, {found['losses']} losses, {found['contexts']} contexts)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
