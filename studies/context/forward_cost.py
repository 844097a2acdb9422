"""One plain forward pass of held-out context examples at given lengths (SmolLM2, 1 torch thread): the tokens,
sources, the greedy answer's and the forward pass's seconds, and the process's peak resident memory; what a long
context costs before any ablation (docs/context.md, "Longer contexts").

    python -m studies.context.forward_cost --data DATA --lengths 2000 8000 [--out FILE]
"""

from __future__ import annotations

import argparse
import resource
import time

from studies.settings import Printed, add_data_option, add_out_option, data_folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.context.forward_cost",
                                     description=__doc__.split("\n\n")[0])
    add_data_option(parser)
    add_out_option(parser)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2000, 8000])
    parser.add_argument("--kind", default="qa")
    args = parser.parse_args(argv)

    import torch

    import normx
    from normx.data.contexts import context_examples
    from normx.evaluation.context.readings import forward_seconds, prepare

    torch.set_num_threads(1)
    folder = data_folder(args.data)
    model, tokenizer = normx.load_model("smollm2")
    say = Printed(args.out)
    say("| --length | tokens | sources | greedy answer (s) | one forward (s) | peak RSS (MB) |")
    say("|---|---|---|---|---|---|")
    for length in args.lengths:
        example = context_examples(kinds=args.kind, length=length, limit=1, data=folder)[0]
        start = time.perf_counter()
        prepared = prepare(model, tokenizer, example, max_new_tokens=12)
        answer = time.perf_counter() - start
        forward = forward_seconds(model, prepared, repeats=1)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        say(f"| {length} | {len(prepared.ids)} | {len(prepared.spans)} | {answer:.1f} | {forward:.1f} | {peak:.0f} |")
    say.save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
