"""What ``budgeted`` would gain from its prior if the prior cost no masks: the masks a run without a prior bought,
refitted towards the prior's scores of the same context (:func:`normx.methods.ablation.budgeted.fit`, the ridge
``PRIOR_RIDGE``), from what runs of :mod:`studies.context.budget` recorded, without running the model again.

The prior costs ``budgeted`` 1.45 forward passes of its budget, so a run with it buys fewer masks; whether sharing
the prior's pass with the whole pass (which would leave it only its last rows: a fraction of a pass on a long prompt)
is worth building depends on what the prior adds to the masks a budget buys without it. Per context: a run on the
check's own sources without a prior (``sources=given``, ``prior`` none, every source its own column) gives the design
and outcomes; the prior's scores come from a run of the same context with the prior on the same sources
(``prior_scores``), else from ``calibrated_attention`` as the study ran it (its rows summed over each source: the
prompt's sentences were its sources; marked so). Each is scored by LDS against the context's 32 real removals, pooled
over every context and over those whose design is near saturation (at most :data:`NEAR` masks more than sources).

    python -m studies.context.free_prior --records FILE [FILE ...] --out FILE.json

The fits are least squares (``loss="squares"``), as when this study was run and recorded; ``budgeted`` fits
with Huber's loss since :mod:`studies.context.surrogate_loss`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

NEAR = 3  # masks beyond the sources at most: a design near saturation


def pairs(records: list[dict]):
    """``(context id, sources, design, outcomes, prior, where the prior came from)`` for each record with a no-prior
    run on the check's sources and a prior for it."""
    import numpy as np

    for record in records:
        methods = record["methods"]
        runs = [found for spec, found in methods.items() if "sources=given" in spec and found.get("design")
                and found.get("prior") == "none" and not found.get("groups")
                and len(found["design"][0]) == record["sources"]]
        priors = [found["prior_scores"] for spec, found in methods.items() if "sources=given" in spec
                  and found.get("prior_scores") and len(found["prior_scores"]) == record["sources"]]
        where = "prior_scores"
        if not priors and "calibrated_attention" in methods:
            priors, where = [methods["calibrated_attention"]["scores"]], "calibrated_attention as read"
        if runs and priors:
            yield (record["id"], record["sources"], np.array(runs[0]["design"], bool), np.array(runs[0]["outcomes"]),
                   np.array(priors[0]), where)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.context.free_prior", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=Path, nargs="+", required=True, help="JSON lines of studies.context.budget")
    parser.add_argument("--out", type=Path, required=True, help="the JSON to write: LDS per context and pooled")
    args = parser.parse_args(argv)

    import numpy as np

    from normx.evaluation.context import metrics
    from normx.methods.ablation.budgeted import surrogate

    rows = []
    for file in args.records:
        records = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines()]
        truths = {r["id"]: np.array(r["truth"]) for r in records if r.get("truth")}
        for context, sources, design, outcomes, prior, where in pairs([r for r in records if r["id"] in truths]):
            masks = metrics.lds_masks(sources, len(truths[context]), 0)
            lds = {name: metrics.lds(scores, masks, truths[context]) for name, scores in (
                ("masks only", surrogate(design, outcomes, loss="squares")), ("prior only", prior),
                ("masks and the prior", surrogate(design, outcomes, prior, loss="squares")))}
            rows.append({"file": file.name, "id": context, "sources": sources, "masks": len(design) - 1,
                         "prior from": where, **lds})
    pooled = {}
    for label, keep in (("every context", lambda r: True), (f"masks <= sources + {NEAR}",
                                                            lambda r: r["masks"] <= r["sources"] + NEAR)):
        chosen = [r for r in rows if keep(r)]
        pooled[label] = {"contexts": len(chosen), **{name: float(np.mean([r[name] for r in chosen])) if chosen else None
                                                    for name in ("masks only", "prior only", "masks and the prior")}}
        gain = [r["masks and the prior"] - r["masks only"] for r in chosen]
        if len(gain) > 1:
            pooled[label]["paired gain"] = float(np.mean(gain))
            pooled[label]["standard error"] = float(np.std(gain, ddof=1) / np.sqrt(len(gain)))
    args.out.write_text(json.dumps({"contexts": rows, "pooled": pooled}, indent=1) + "\n", encoding="utf-8")
    for label, found in pooled.items():
        print(f"{label}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                      for k, v in found.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
