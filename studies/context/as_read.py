"""A context method read as a user reads it (#46's check): ``normx.explain_generation(model, tokenizer, prompt,
method=NAME, target=response_ids, chat=True)`` with no ``sources`` (the method's own default), a source's score the
sum of its rows over the steps and the source's tokens, scored by LDS against the held-out masks' outcomes that an
earlier ``studies.context.calibrate`` / ``normx evaluate context`` run kept (its ``contexts.jsonl``: the same
contexts, responses and masks), and its cost: the faster of two readings over the faster of two plain forward
passes, each context, 1 torch thread.

    python -m studies.context.as_read --records /tmp/calib2/heldout/contexts.jsonl --data DATA --heldout 12 \\
        --method calibrated_attention --out FILE

``--train DIR`` reads the training contexts instead, as read: each per-source family of the stored weights alone
(a weights file with that family's weight 1, the others' 0) through the same call, summed over each of the
context's sentences, against the masks and outcomes that ``studies.context.calibrate`` kept in ``DIR/train``; and
the families' cross-validated LDS as read beside the one with the sources given (how the weights were chosen):

    python -m studies.context.as_read --train /tmp/calib6 --first 32 --contexts 40 --data DATA --out FILE
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from studies.settings import Printed, add_data_option, add_out_option, data_folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.context.as_read", description=__doc__.split("\n\n")[0])
    add_data_option(parser)
    add_out_option(parser)
    parser.add_argument("--records", type=Path, help="the contexts.jsonl of the earlier run")
    parser.add_argument("--train", type=Path, help="read the training contexts kept in this calibrate --out folder")
    parser.add_argument("--first", type=int, default=32, help="with --train: the training contexts' first index")
    parser.add_argument("--contexts", type=int, default=40, help="with --train: how many")
    parser.add_argument("--heldout", type=int, default=12, help="held-out contexts (the run's first ones)")
    parser.add_argument("--kinds", default="qa,claim")
    parser.add_argument("--method", default="calibrated_attention")
    parser.add_argument("--masks", type=int, default=32, help="the run's LDS masks per context")
    args = parser.parse_args(argv)
    if (args.records is None) == (args.train is None):
        parser.error("give --records (held-out contexts) or --train (training contexts), one of them")
    if args.train is not None:
        return training(args)

    import numpy as np
    import torch

    import normx
    from normx.data.contexts import context_examples
    from normx.evaluation.context import metrics
    from normx.evaluation.context.readings import forward_seconds, prepare, source_scores

    torch.set_num_threads(1)
    records = {}
    for line in args.records.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        records[record["id"]] = record  # the last line of an id wins, as the evaluation reads them
    model, tokenizer = normx.load_model("smollm2")
    examples = context_examples(args.kinds.split(","), "heldout", 300, args.heldout, 0, data_folder(args.data))
    show = Printed(args.out)
    show("| context | LDS (as read) | LDS (sources given) | cost (× a forward) |")
    show("|---|---|---|---|")
    ldss, costs = [], []
    for example in examples:
        record = records[example.id]
        prepared = prepare(model, tokenizer, example, 12, record["response_ids"])
        forward = min(forward_seconds(model, prepared) for _ in range(2))
        best = None
        for _ in range(2):
            started = time.perf_counter()
            generation = normx.explain_generation(model, tokenizer, prepared.prompt, method=args.method,
                                                  target=prepared.response_ids, chat=True)
            took = time.perf_counter() - started
            best = took if best is None else min(best, took)
        if list(generation.token_ids) != prepared.ids:
            raise RuntimeError(f"{example.id}: explain_generation read other ids than the run")
        scores = source_scores(generation, prepared.spans)
        lds = metrics.lds(scores, metrics.lds_masks(len(prepared.spans), args.masks, 0),
                          np.asarray(record["lds_log_p"]))
        given = record["readings"].get(args.method, {}).get("lds")
        ldss.append(lds)
        costs.append(best / forward)
        show(f"| {example.id} | {lds:.3f} | {'—' if given is None else f'{given:.3f}'} | {best / forward:.2f} |")
    ldss, costs = np.array(ldss), np.array(costs)
    show()
    show(f"{args.method}: LDS {ldss.mean():.3f} ± {ldss.std(ddof=1) / np.sqrt(len(ldss)):.3f} over "
         f"{len(ldss)} contexts; cost {costs.mean():.2f}× a forward on average ({costs.min():.2f}–{costs.max():.2f})")
    show.save()
    return 0


def training(args) -> int:
    import tempfile

    import numpy as np
    import torch

    import normx
    from normx.data.contexts import context_examples
    from normx.evaluation.context.readings import prepare, source_scores
    from normx.methods.calibrated import fit
    from normx.methods.calibrated import training as calibration
    from normx.methods.calibrated import weights as stored
    from normx.methods.calibrated.readings import SCALAR

    torch.set_num_threads(2)
    model, tokenizer = normx.load_model("smollm2")
    record, _ = stored.find(model, "calibrated_attention")
    families = [f for f in record["families"] if f in SCALAR]
    if families != list(record["families"]):
        raise SystemExit(f"--train reads per-source families only; the stored weights have {record['families']}")
    examples = context_examples(args.kinds.split(","), "train", 300, args.first + args.contexts, 0,
                                data_folder(args.data))[args.first:]
    kept = {inst.id: inst for inst in calibration.kept_instances(args.train / "train", [e.id for e in examples],
                                                                  masks=args.masks, seed=args.first,
                                                                  families=families)}
    show = Printed(args.out)
    read, given = [], []
    with tempfile.TemporaryDirectory() as folder:
        files = {}
        for family in families:  # one family alone: its weight 1, the others 0
            alone = {f: np.full((1, 1), 1.0 if f == family else 0.0) for f in families}
            made = stored.make_record(record["method"], record["model"], families, alone, record["shape"],
                                      record["lambda"], record["scaling"], record["cv_lds"], record["training"])
            files[family] = str(stored.write(made, Path(folder) / f"{family}.json"))
        for example in examples:
            if example.id not in kept:
                continue
            inst = kept[example.id]
            prepared = prepare(model, tokenizer, example, 12)
            features = {}
            for family in families:
                generation = normx.explain_generation(model, tokenizer, prepared.prompt, method=record["method"],
                                                      target=prepared.response_ids, chat=True, weights=files[family])
                features[family] = np.asarray(source_scores(generation, prepared.spans))[:, None, None]
            read.append(fit.Instance(features, inst.masks, inst.y, inst.id))
            given.append(inst)
    show(f"{len(read)} training contexts ({args.train / 'train'}), {'+'.join(families)}, 5-fold cross-validated LDS "
         "(the best lambda and scaling):")
    show()
    show("| features | cross-validated LDS | lambda | scaling |")
    show("|---|---|---|---|")
    for label, instances in (("sources given (how the weights were chosen)", given), ("as read", read)):
        best = max((fit.cross_validate(instances, families, lam, scaling, 5, "all"), lam, scaling)
                   for lam in fit.LAMBDAS for scaling in fit.SCALINGS)
        show(f"| {label} | {best[0]:.3f} | {best[1]:g} | {best[2]} |")
    show.save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
