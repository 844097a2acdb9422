"""How the sources ``budgeted`` finds in a prompt (``sources="auto"``) line up with the check's own sentences, on the
check's layout (``studies.context.budget``'s ``sentences``: ``"Context: s1 s2 ...\\nQuestion: q\\nAnswer:"``), with no
model: how many of the check's sentences share a found source with another (merged: their scores cannot be told
apart), and how many found sources begin inside one of the check's sentences (cut: harmless to a sentence's summed
score, but one more source to estimate).

    python -m studies.context.sentence_splits --data DATA --count 60 --out FILE
"""

from __future__ import annotations

import argparse

from studies.context.budget import layout
from studies.settings import Printed, add_data_option, add_out_option, data_folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.context.sentence_splits",
                                     description=__doc__.split("\n\n")[0])
    add_data_option(parser)
    add_out_option(parser)
    parser.add_argument("--count", type=int, default=60, help="contexts of each split (the first ones)")
    parser.add_argument("--splits", default="heldout,train")
    parser.add_argument("--kinds", default="qa,claim")
    args = parser.parse_args(argv)

    from normx.data.contexts import context_examples
    from normx.methods.ablation.sources import auto_split

    show = Printed(args.out)
    show("| split | contexts | the check's sentences | found | merged with another | found sources cut inside one |")
    show("|---|---|---|---|---|---|")
    for split in args.splits.split(","):
        sentences = found = merged = cut = 0
        examples = context_examples(args.kinds.split(","), split, 300, args.count, 0, data_folder(args.data))
        for example in examples:
            prompt, truth = layout(example, "sentences")
            spans = auto_split(prompt)[1]
            owners = [{i for i, (x, y) in enumerate(truth) if a < y and b > x} for a, b in spans]
            merged += sum(any(i in own and len(own) > 1 for own in owners) for i in range(len(truth)))
            cut += sum(any(x < a < y for x, y in truth) for a, _ in spans)
            sentences, found = sentences + len(truth), found + len(spans)
        show(f"| {split} | {len(examples)} | {sentences} | {found} | {merged} ({merged / sentences:.1%}) | {cut} |")
    show.save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
