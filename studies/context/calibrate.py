"""The calibrated context method on SmolLM2 (#46 part 3): fit on training contexts, chosen there, reported on
disjoint held-out contexts beside ContextCite-32, leave-one-out, attention, norm_attention, random and position,
all scored by normx.evaluation.context's one code path.

    OMP_NUM_THREADS=1 python -m studies.context.calibrate --out /tmp/calib --train 64 --heldout 16

Writes into ``--out``: ``train/`` (each training context's features and outcomes, reused by a rerun),
``weights.json`` (the fitted weights, with the cross-validation table in ``choice.json``), ``heldout/``
(``evaluate_context``'s records, ``report.json``, ``table.md``) and ``summary.md``. ``--ship`` also writes the
weights where the smollm2 preset ships them (normx/zoo/presets_data/smollm2/calibrated.json) and ``--store`` into
normx's cache.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from studies.settings import add_data_option, data_folder, provenance

HELD_OUT = ("calibrated_attention", "contextcite@32", "leave_one_out", "attention", "norm_attention", "random",
            "position")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the study's folder")
    add_data_option(parser)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--kinds", default="qa,claim")
    parser.add_argument("--train", type=int, default=64, help="training contexts in all")
    parser.add_argument("--heldout", type=int, default=16, help="held-out contexts in all")
    parser.add_argument("--length", type=int, default=300)
    parser.add_argument("--masks", type=int, default=32, help="training masks per context")
    parser.add_argument("--lds-masks", type=int, default=32, help="held-out LDS masks per context")
    parser.add_argument("--families", default="attention,norm,logit")
    parser.add_argument("--methods", default=",".join(HELD_OUT), help="the held-out readings")
    parser.add_argument("--ship", action="store_true", help="write the smollm2 preset's shipped weights")
    parser.add_argument("--store", action="store_true", help="store the weights in normx's cache")
    parser.add_argument("--weights", type=Path, default=None, help="the held-out reading's weights file (default "
                        "OUT/weights.json)")
    parser.add_argument("--label", default="calibrated_attention", help="the held-out reading's name (to read "
                        "several fits side by side)")
    parser.add_argument("--phase", default="all", choices=("all", "train", "fit", "heldout"),
                        help="train: fit only; fit: fit on the training contexts already kept in OUT/train (no "
                        "model pass); "
                        "heldout: the held-out readings only (calibrated_attention when weights.json is there); the "
                        "held-out records are kept and reused, so the phases can run apart")
    parser.add_argument("--first", type=int, default=0, help="the first training context's index (contexts "
                        "first .. first + train - 1 of the train split; context i's masks are drawn from seed i)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: the cost ratios the held-out "
                        "table reports are measured at one thread)")
    args = parser.parse_args(argv)

    import torch

    import normx

    torch.set_num_threads(args.threads)
    data = data_folder(args.data)
    kinds = args.kinds.split(",")
    families = args.families.split(",")
    model, tokenizer = normx.load_model(args.model)
    if args.phase != "heldout":
        fit_weights(args, model, tokenizer, kinds, families, data, argv)
    if args.phase not in ("train", "fit"):
        held_out(args, model, tokenizer, kinds, data, argv)
    return 0


def fit_weights(args, model, tokenizer, kinds, families, data, argv) -> None:
    from normx.cli.calibrate import training_contexts
    from normx.data.contexts import context_examples
    from normx.methods.calibrated import training
    from normx.methods.calibrated import weights as stored

    started = time.perf_counter()
    examples = context_examples(kinds, "train", args.length, args.first + args.train, 0, data)[args.first:]
    if args.phase == "fit":
        instances = training.kept_instances(args.out / "train", [e.id for e in examples], masks=args.masks,
                                            seed=args.first,
                                            families=families)
    else:
        kept = {inst.id for inst in training.kept_instances(args.out / "train", [e.id for e in examples],
                                                             seed=args.first, masks=args.masks, families=families)}
        contexts = training_contexts(model, tokenizer, examples, kept=kept)
        instances = training.instances_for(model, tokenizer, contexts, masks=args.masks, seed=args.first,
                                           families=families,
                                           keep=args.out / "train")
    described = {"data": "normx.data.contexts", "split": "train", "kinds": kinds, "length": args.length, "seed": 0,
                 "first": args.first,
                 "max_new_tokens": 12, "ids": [inst.id for inst in instances],
                 "command": "python -m studies.context.calibrate " + " ".join(argv or sys.argv[1:])}
    record, choice = training.fitted_record(model, instances, families, training=described)
    train_seconds = time.perf_counter() - started
    stored.write(record, args.out / "weights.json")
    (args.out / "choice.json").write_text(json.dumps({"families": choice.families, "lambda": choice.lam,
                                                      "scaling": choice.scaling, "cv_lds": choice.cv_lds,
                                                      "table": choice.table, "seconds": train_seconds}, indent=1))
    print(f"chosen on {len(instances)} training contexts: {'+'.join(choice.families)}, lambda {choice.lam:g}, "
          f"{choice.scaling}; cross-validated LDS {choice.cv_lds:.3f} ({train_seconds:.0f} s)", flush=True)
    for row in sorted(choice.table, key=lambda r: -r["cv_lds"])[:8]:
        print(f"  {'+'.join(row['families']):<24} lambda {row['lambda']:<8g} {row['scaling']:<8} "
              f"{row['cv_lds']:.3f}", flush=True)
    if args.ship:
        stored.write(record, stored.SHIPPED / "smollm2" / stored.FILE)
    if args.store:
        stored.store(record)
    (args.out / "train.md").write_text(
        f"training: {len(instances)} contexts x {args.masks} masks; chosen {'+'.join(choice.families)}, lambda "
        f"{choice.lam:g}, {choice.scaling}, cross-validated LDS {choice.cv_lds:.3f}\n")


def held_out(args, model, tokenizer, kinds, data, argv) -> None:
    from normx.data.contexts import context_examples
    from normx.evaluation.context import evaluate_context

    heldout = context_examples(kinds, "heldout", args.length, args.heldout, 0, data)
    weights = args.weights or args.out / "weights.json"
    methods = [args.label if m == "calibrated_attention" else m for m in args.methods.split(",") if m]
    if not weights.is_file():
        methods = [m for m in methods if m != args.label]
    options = {args.label: {"method": "calibrated_attention", "weights": str(weights)}}
    report = evaluate_context(model, tokenizer, heldout, methods, method_options=options, masks=args.lds_masks,
                              out=args.out / "heldout",
                              settings={"model": args.model, "length": args.length, "kinds": kinds})
    report.settings["command"] = "python -m studies.context.calibrate " + " ".join(argv or sys.argv[1:])
    report.settings["provenance"] = provenance()
    report.write(args.out / "heldout")
    table = report.table()
    print(table, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
