"""A context method read as a user reads it (#46's check): ``normx.explain_generation(model, tokenizer, prompt,
method=NAME, target=response_ids, chat=True)`` with no ``sources`` (the method's own default), a source's score the
sum of its rows over the steps and the source's tokens, scored by LDS against the held-out masks' outcomes that an
earlier ``studies.context.calibrate`` / ``normx evaluate context`` run kept (its ``contexts.jsonl``: the same
contexts, responses and masks), and its cost: the faster of two readings over the faster of two plain forward
passes, each context, 1 torch thread.

    python -m studies.context.as_read --records /tmp/calib2/heldout/contexts.jsonl --data DATA --heldout 12 \\
        --method calibrated_attention --out FILE
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
    parser.add_argument("--records", type=Path, required=True, help="the contexts.jsonl of the earlier run")
    parser.add_argument("--heldout", type=int, default=12, help="held-out contexts (the run's first ones)")
    parser.add_argument("--kinds", default="qa,claim")
    parser.add_argument("--method", default="calibrated_attention")
    parser.add_argument("--masks", type=int, default=32, help="the run's LDS masks per context")
    args = parser.parse_args(argv)

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


if __name__ == "__main__":
    raise SystemExit(main())
