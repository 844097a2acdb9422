"""Other fits of ``budgeted``'s recorded masks, beside the one it uses (Huber's loss on the log of the loss), without
running the model again: whether shrinking, sparsity or ContextCite's LASSO reads the same masks better.

Each recorded run without a prior whose design has a column per source of the context (the fit's sources are the
LDS's) is refitted by

- ``huber``: :func:`normx.methods.ablation.budgeted.surrogate` as the method fits (the reference);
- ``ridge R``: the same with a ridge of ``R`` on the weights in place of the method's
  (:data:`~normx.methods.ablation.surrogate_fit.RIDGE`);
- ``equal S``: the same, shrunk towards equal weights (the prior ``1`` per source at ridge strength ``S``: the
  weights ``c + d``, ``d`` shrunk);
- ``soft T``: its weights soft-thresholded by ``T`` times the largest (small weights set to 0);
- ``lasso A``: ContextCite's LASSO (:func:`normx.methods.ablation.lasso.surrogate`, ``alpha`` ``A``) on the log of
  the loss, times the whole context's loss (the method's units);

and scored by LDS against the context's 32 real removals (``truth``), pooled over every run and by how many masks the
design has beyond its sources (``surplus``: a design near saturation, 0-2, has no residual for a robust fit to
read).

The runs read are those of every spec, or of the specs containing ``--spec``.

    python -m studies.context.estimators --records FILE [FILE ...] [--spec TEXT] --out FILE.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studies.context.recorded import recorded_runs

STRENGTHS = (0.3, 1.0, 3.0)
RIDGES = (0.1, 0.3, 1.0, 3.0)
THRESHOLDS = (0.05, 0.1)
ALPHAS = (0.003, 0.01)
SURPLUS = {"0-2": (-99, 2), "3-5": (3, 5), "6+": (6, 99)}


def fits(design, outcomes) -> dict:
    """Each fit's weights for one run's masks and outcomes."""
    import numpy as np

    from normx.methods.ablation import budgeted, lasso

    sources = design.shape[1]
    found = {"huber": budgeted.surrogate(design, outcomes)}
    for ridge in RIDGES:
        found[f"ridge {ridge}"] = budgeted.surrogate(design, outcomes, ridge=ridge)
    for strength in STRENGTHS:
        found[f"equal {strength}"] = budgeted.surrogate(design, outcomes, np.ones(sources), strength=strength)
    for threshold in THRESHOLDS:
        weights = found["huber"]
        found[f"soft {threshold}"] = np.sign(weights) * np.maximum(np.abs(weights) - threshold * np.abs(weights).max(),
                                                                   0.0)
    nll = np.maximum(-outcomes, budgeted.TINY_NLL)
    for alpha in ALPHAS:
        steps = 8  # (lasso.surrogate divides the outcome by the response's tokens and multiplies back: a scale)
        found[f"lasso {alpha}"] = lasso.surrogate(design, -np.log(nll) * steps, steps, alpha)[0] * nll[0]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.context.estimators", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=Path, nargs="+", required=True, help="JSON lines of studies.context.budget")
    parser.add_argument("--spec", default="", help="read only the runs whose spec contains this text")
    parser.add_argument("--out", type=Path, required=True, help="the JSON to write: LDS per fit, pooled and by surplus")
    args = parser.parse_args(argv)

    import numpy as np

    from normx.evaluation.context import metrics

    rows = []
    for run, found, masks, truth in recorded_runs(args.records, lambda spec, found: args.spec in spec
                                                  and not found.get("prior_scores") and "groups" not in found):
        design, outcomes = np.array(found["design"], bool), np.array(found["outcomes"])
        if design.shape[1] != masks.shape[1] or not design[0].all():  # (the method's own sources, or groups)
            continue
        scores = {key: metrics.lds(weights, masks, truth) for key, weights in fits(design, outcomes).items()}
        rows.append({"run": run, "surplus": len(design) - 1 - design.shape[1], "lds": scores})

    def summary(chosen: list[dict]) -> dict:
        base = np.array([r["lds"]["huber"] for r in chosen])
        out = {}
        for key in chosen[0]["lds"]:
            values = np.array([r["lds"][key] for r in chosen])
            paired = values - base
            out[key] = {"lds": float(values.mean()), "paired": float(paired.mean()),
                        "paired_se": float(paired.std(ddof=1) / np.sqrt(len(paired))) if len(paired) > 1 else 0.0}
        return {"runs": len(chosen), "fits": out}

    result = {"all": summary(rows)} if rows else {}
    for name, (low, high) in SURPLUS.items():
        chosen = [r for r in rows if low <= r["surplus"] <= high]
        if chosen:
            result[f"surplus {name}"] = summary(chosen)
    args.out.write_text(json.dumps({"records": [str(p) for p in args.records], "summary": result}, indent=1) + "\n",
                        encoding="utf-8")
    for part, found in result.items():
        print(f"{part} ({found['runs']} runs)")
        for key, row in found["fits"].items():
            print(f"  {key:>12}: LDS {row['lds']:.4f}, paired with huber {row['paired']:+.4f} ± {row['paired_se']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
