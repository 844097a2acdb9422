"""How many real removals is the one-pass reading worth? (#46) On the contexts an earlier ``studies.context.explore
collect`` kept, with the presence features ``studies.context.presence --keep`` wrote: each context's 32 masks cut
into 4 contiguous folds as ``explore report``'s LASSO reference cuts them (scored by the Spearman correlation on the
fold's 8 masks, averaged over the folds), and from the other 24 the first K used as the only ablations:

- ``LASSO, K``: ContextCite's form (a LASSO, alpha 0.01, with an intercept) on those K;
- ``prior``: the shipped families (``tokens`` + ``presence`` + ``response_norm``, lambda 10, spread scaling) fitted
  by the ridge on the other contexts (5 folds over contexts) and put in nats (``fit.in_nats``): no ablation;
- ``prior + K``: the prior corrected by those K, a ridge toward it (each source's score = prior + delta, delta
  penalised by ``lambda`` in nats squared, the intercept free).

``--records`` reads held-out contexts instead (an ``evaluate context`` / ``studies.context.calibrate --phase
heldout`` run's contexts.jsonl): the prior is the scores of the reading named by ``--prior`` there, the ablations
come from the LDS masks (the same folds), and ContextCite-32's own scores, when recorded, are scored on the folds
too. Deterministic::

    python -m studies.context.few --packed gpu_train_0.npz gpu_train_1.npz --side gpu_side.jsonl.gz \\
        --keep FILE.npz --out FILE
    python -m studies.context.few --records DIR/contexts.jsonl --prior calibrated_attention --out FILE
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from studies.settings import Printed, add_out_option

SHIPPED = ("tokens", "presence", "response_norm")
COUNTS = (4, 8, 16, 24)
PULLS = (0.3, 1.0, 3.0)
MASK_FOLDS = 4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.context.few", description=__doc__.split("\n\n")[0])
    add_out_option(parser)
    parser.add_argument("--packed", type=Path, nargs="+", help="explore's packed instances (.npz)")
    parser.add_argument("--side", type=Path, nargs="+", help="their side lines (.jsonl or .jsonl.gz)")
    parser.add_argument("--keep", type=Path, help="presence's features (.npz, from --keep there)")
    parser.add_argument("--masks", type=int, default=32)
    parser.add_argument("--records", type=Path, help="held-out records (contexts.jsonl) instead of --packed")
    parser.add_argument("--prior", default="calibrated_attention", help="with --records: the reading used as prior")
    parser.add_argument("--seed", type=int, default=0, help="with --records: the run's seed (its LDS masks)")
    args = parser.parse_args(argv)
    if args.records:
        return held_out(args)
    if not (args.packed and args.side and args.keep):
        parser.error("--packed, --side and --keep are needed (or --records)")

    from normx.errors import NormxError
    from studies.context.explore import packed_study
    from studies.context.presence import attach

    try:
        found, _ = packed_study(args.packed, args.side, args.masks, ["tokens", "norm"])
        attach(found, dict(np.load(args.keep)), args.keep, response_norm=True)
    except (NormxError, OSError) as error:
        print(f"few: error: {error}", file=sys.stderr)
        return 2
    rows: dict[tuple[str, int], list[float]] = {}
    for inst, prior in zip(found, prior_scores(found)):
        for key, value in scores_of(inst, prior).items():
            rows.setdefault(key, []).append(value)
    kinds = np.array([inst.id.split("-")[0] for inst in found])
    show = Printed(args.out)
    show(f"{len(found)} contexts, {args.masks} masks each in {MASK_FOLDS} folds (each scored on its masks, the "
         "ablations taken from the others); Spearman on the fold's masks, mean over folds and contexts")
    show()
    table(show, rows, kinds)
    return 0


def held_out(args) -> int:
    """The same folds on held-out records: the prior their ``--prior`` reading, the ablations the LDS masks."""
    import json

    from normx.evaluation.context.metrics import lds_masks

    contexts: dict[str, dict] = {}
    try:
        for line in args.records.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)  # a later line of a context adds its readings
            known = contexts.setdefault(record["id"], {"readings": {}})
            known.update(sources=record["sources"], y=record["lds_log_p"])
            known["readings"].update(record["readings"])
    except (OSError, ValueError, KeyError) as error:
        print(f"few: error: {args.records}: {error}", file=sys.stderr)
        return 2
    missing = [name for name, known in contexts.items() if args.prior not in known["readings"]]
    if missing or not contexts:
        print(f"few: error: no {args.prior!r} reading for {missing[:3] or 'any context'}", file=sys.stderr)
        return 2
    rows: dict[tuple[str, int], list[float]] = {}
    for known in contexts.values():
        inst = SimpleNamespace(masks=lds_masks(known["sources"], len(known["y"]), args.seed), y=known["y"])
        found = scores_of(inst, np.asarray(known["readings"][args.prior]["scores"], np.float64))
        if "contextcite@32" in known["readings"]:
            found["contextcite@32 (its own 32 ablations)", 32] = scores_of(
                inst, np.asarray(known["readings"]["contextcite@32"]["scores"], np.float64))["prior", 0]
        for key, value in found.items():
            rows.setdefault(key, []).append(value)
    masks = {len(known["y"]) for known in contexts.values()}
    show = Printed(args.out)
    show(f"{len(contexts)} held-out contexts ({args.records}), the prior {args.prior!r}, {'/'.join(map(str, masks))} "
         f"LDS masks each in {MASK_FOLDS} folds; Spearman on the fold's masks, mean over folds and contexts")
    show()
    table(show, rows, np.array([name.split("-")[0] for name in contexts]))
    return 0


def table(show, rows: dict[tuple[str, int], list[float]], kinds: np.ndarray) -> None:
    """The rows {(reading, real removals): each context's score}, all and per kind, printed and saved."""
    show("| reading | real removals | all | " + " | ".join(sorted(set(kinds))) + " |")
    show("|---|---|---|" + "---|" * len(set(kinds)))
    for (name, count), values in rows.items():
        values = np.asarray(values)
        by_kind = " | ".join(f"{values[kinds == k].mean():.3f}" for k in sorted(set(kinds)))
        show(f"| {name} | {count} | {values.mean():.3f} | {by_kind} |")
    show.save()


def prior_scores(instances: list) -> list[np.ndarray]:
    """Each instance's per-source scores in nats from the shipped families, fitted on the other folds."""
    from normx.methods.calibrated.fit import centred_ridge, folds_of, in_nats

    scores = [None] * len(instances)
    for left in folds_of(len(instances), 5):
        held = set(left.tolist())
        train = [inst for i, inst in enumerate(instances) if i not in held]
        theta, _ = in_nats(train, SHIPPED, centred_ridge(train, SHIPPED, 10.0, "spread"))
        for i in left:
            features = instances[i].features
            scores[i] = np.concatenate([features[f].reshape(len(features[f]), -1) for f in SHIPPED], 1) @ theta
    return scores


def scores_of(inst, prior: np.ndarray) -> dict[tuple[str, int], float]:
    """{(reading, real removals): its Spearman on the held-out fold of masks, averaged over the mask folds}."""
    from normx.methods.ablation.lasso import lasso
    from normx.methods.calibrated.fit import spearman

    x, y = inst.masks.astype(np.float64), np.asarray(inst.y, np.float64)
    out: dict[tuple[str, int], list[float]] = {}

    def add(name, count, weights, test):
        out.setdefault((name, count), []).append(spearman(x[test] @ weights, y[test]))

    for test in np.array_split(np.arange(len(y)), MASK_FOLDS):
        train = np.setdiff1d(np.arange(len(y)), test)
        add("prior", 0, prior, test)
        for k in COUNTS:
            some = train[:k]
            add(f"LASSO, {k}", k, lasso(x[some], y[some], 0.01)[0], test)
            for pull in PULLS:
                add(f"prior + {k} (lambda {pull:g})", k, toward(x[some], y[some], prior, pull), test)
    return {key: float(np.mean(values)) for key, values in out.items()}


def toward(x: np.ndarray, y: np.ndarray, prior: np.ndarray, pull: float) -> np.ndarray:
    """prior + delta minimising ||y - b - x (prior + delta)||^2 + pull ||delta||^2 (the intercept b free)."""
    design = np.c_[np.ones(len(y)), x]
    penalty = np.diag(np.r_[0.0, np.full(x.shape[1], pull)])
    solution = np.linalg.solve(design.T @ design + penalty + 1e-9 * np.eye(len(penalty)), design.T @ (y - x @ prior))
    return prior + solution[1:]


if __name__ == "__main__":
    raise SystemExit(main())
