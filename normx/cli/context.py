"""``normx evaluate context``: the command line of :func:`normx.evaluation.context.run.evaluate_context` on the
context data sets of :mod:`normx.data.contexts`."""

from __future__ import annotations

import sys

from normx.cli.options import add_model_flags, add_names_argument, load, names, output_folder
from normx.data import contexts
from normx.errors import InvalidInputError
from normx.evaluation.context.run import DEFAULT_METHODS, evaluate_context, label_options


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "context", help="context attribution: LDS, top-k log-prob drops, evidence recall and cost of each method",
        description="Build contexts from the shared data (sources with the evidence planted at a random position), "
                    "let the model answer, read each method's score per source (its rows summed over the answer and "
                    "the source's tokens) and score them: LDS over held-out random source masks, the drop in the "
                    "answer's log-probability when the top-1 / top-3 sources are removed, evidence@1 / @3, and the "
                    "cost in plain forward passes. Writes report.json, table.md and contexts.jsonl (finished "
                    "contexts, reused when the command runs again).")
    parser.add_argument("--model", required=True, help="a causal LM: a preset (smollm2), a model folder, a GGUF file "
                        "or a hub id")
    add_model_flags(parser)
    parser.add_argument("--data", default=None, help="the shared data folder (default: $NORMX_DATA)")
    add_names_argument(parser, "--kinds", f"context kinds: {', '.join(contexts.KINDS)} (default all)")
    parser.add_argument("--length", type=int, default=300, help="the context's size in tokens (about; default 300)")
    parser.add_argument("--split", default="heldout", choices=contexts.SPLITS,
                        help="heldout (default; report on it) or train (rows disjoint from heldout's)")
    parser.add_argument("--limit", type=int, default=8, help="contexts in all, the kinds in turn (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="the contexts' and the LDS masks' seed")
    add_names_argument(parser, "--methods", "method names (`normx methods`), NAME@N for an ablation method with N "
                       "ablations (contextcite@32), NAME@response for one backward pass of the whole answer, and the "
                       "baselines random and position (default: " + ",".join(DEFAULT_METHODS) + ")")
    parser.add_argument("--masks", type=int, default=32, help="held-out random masks for the LDS (default 32)")
    parser.add_argument("--max-new-tokens", type=int, default=12, help="the answer's length at most (default 12)")
    parser.add_argument("--batch-size", type=int, default=8, help="masked sequences per forward pass")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)
    return parser


def run(args) -> int:
    kinds = names(args.kinds) or list(contexts.KINDS)
    methods = names(args.methods) or list(DEFAULT_METHODS)
    for label in methods:  # unknown names are said before anything loads
        if label not in ("random", "position"):
            label_options(label)
    if len(set(methods)) != len(methods):
        raise InvalidInputError(f"--methods names a method twice: {methods}")
    if args.max_new_tokens < 1 or args.batch_size < 1:
        raise InvalidInputError("--max-new-tokens and --batch-size must be at least 1")
    if args.masks < 2:  # (before the model loads; evaluate_context says the same)
        raise InvalidInputError(f"--masks must be at least 2 (the LDS is a rank correlation over them), got "
                                f"{args.masks}")
    from normx.cli.checks import refuse_unless_causal_lm

    refuse_unless_causal_lm(args.model, getattr(args, "task", None), "evaluate context")
    examples = contexts.context_examples(kinds, args.split, args.length, args.limit, args.seed, args.data)
    output_folder(args.out)
    model, tokenizer = load(args)
    report = evaluate_context(model, tokenizer, examples, methods, masks=args.masks, seed=args.seed,
                              max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, out=args.out,
                              progress=not args.no_progress,
                              settings={"model": args.model, "gguf_file": args.gguf_file, "task": args.task})
    report.settings.update(kinds=kinds, length=args.length, split=args.split, limit=args.limit,
                           command=_command(args, kinds, methods))
    written = report.write(args.out)
    print(report.table())
    print(f"wrote {args.out}/: {', '.join(file.name for file in written)}, contexts.jsonl", file=sys.stderr)
    return 0


def _command(args, kinds, methods) -> str:
    parts = ["normx evaluate context", f"--model {args.model}", "--data DATA", f"--kinds {','.join(kinds)}",
             f"--length {args.length}", f"--split {args.split}", f"--limit {args.limit}", f"--seed {args.seed}",
             f"--methods {','.join(methods)}", f"--masks {args.masks}", f"--max-new-tokens {args.max_new_tokens}"]
    if getattr(args, "device", None):
        parts.append(f"--device {args.device}")
    return " ".join([*parts, f"--out {args.out}"])
