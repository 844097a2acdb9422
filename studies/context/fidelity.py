"""How closely re-read ablations track real removals (#46): for training contexts whose real outcomes an earlier
``studies.context.explore collect`` kept (the response's log-probability with each mask's removed sources left out
of the ids), the same masks re-read on one cache (:func:`normx.methods.decoder.rereads.masked_rereads`) from three
first rows — the response's (``response``), the context's end (``query``: the query's rows too), the first source
(``all``: every row after a removed source) — with the positions closed up or kept, and per context the Spearman
correlation over its masks between the re-read and the real outcomes; the table holds their means. ``all`` with
the positions closed up is the removal itself (1.000 up to the two machines' floating point). Deterministic::

    OMP_NUM_THREADS=2 python -m studies.context.fidelity --packed gpu_train_0.npz gpu_train_1.npz \\
        --side gpu_side.jsonl.gz --count 30 --out FILE
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from studies.context.explore import add_packed_options
from studies.settings import Printed, add_out_option

MODES = (("response", "the response's rows"), ("query", "from the context's end"), ("all", "from the first source"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.context.fidelity", description=__doc__.split("\n\n")[0])
    add_out_option(parser)
    add_packed_options(parser)
    parser.add_argument("--count", type=int, default=30, help="the first COUNT contexts in seed order")
    parser.add_argument("--masks", type=int, default=32, help="the masks per context the run kept")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if args.count < 1:
        print(f"fidelity: error: --count must be >= 1, got {args.count}", file=sys.stderr)
        return 2

    import torch

    import normx
    from normx.core.handle import model_handle
    from normx.errors import NormxError
    from normx.methods.calibrated.fit import spearman
    from normx.methods.decoder.rereads import masked_rereads
    from studies.context.explore import packed_study

    torch.set_num_threads(args.threads)
    try:
        found, sides = packed_study(args.packed, args.side, args.masks, ["tokens"])
    except NormxError as error:
        print(f"fidelity: error: {error}", file=sys.stderr)
        return 2
    model, _ = normx.load_model(args.model)
    handle = model_handle(model)
    columns = [(mode, close) for mode, _ in MODES for close in (False, True)]
    scores = {column: [] for column in columns}
    began = time.perf_counter()
    for inst in found[:args.count]:
        record = sides[inst.id]
        ids, length, spans = record["ids"], record["prompt_length"], record["spans"]
        sources = [list(range(a, b)) for a, b in spans]
        rows = {"response": length - 1, "query": max(b for _, b in spans), "all": min(a for a, _ in spans) + 1}
        for mode, close in columns:
            log_p, _ = masked_rereads(handle, ids, length, sources, inst.masks, "fidelity", min(rows[mode], length - 1),
                                      close_up=close)
            scores[(mode, close)].append(spearman(log_p.sum(1), inst.y))
    show = Printed(args.out)
    show(f"{len(scores[columns[0]])} contexts, {args.masks} masks each; Spearman between re-read and real outcomes "
         f"({time.perf_counter() - began:.0f} s)")
    show()
    show("| re-read rows | positions kept | positions closed up |")
    show("|---|---|---|")
    for mode, words in MODES:
        kept, closed = (np.mean(scores[(mode, c)]) for c in (False, True))
        show(f"| {mode} ({words}) | {kept:.3f} | {closed:.3f} |")
    show.save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
