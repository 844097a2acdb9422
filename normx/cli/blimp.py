"""``normx evaluate blimp``: the command line of :mod:`normx.evaluation.blimp.run`."""

from __future__ import annotations

from normx.cli.options import add_model_flags, add_names_argument, load, names, output_folder
from normx.data import blimp as ev
from normx.evaluation.blimp.run import SPECIAL_TOKENS, SPLITS, evaluate_blimp


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "blimp", help="evidence alignment on BLiMP (Dot Product, Average Precision per layer)",
        description="Per-layer alignment of attributions with the evidence word of BLiMP minimal pairs, for a "
                    "masked-LM or causal-LM model.")
    parser.add_argument("--model", required=True, help="a preset (e.g. smollm2), a model folder, a GGUF file or a hub "
                        "id")
    add_model_flags(parser)
    add_names_argument(parser, "--paradigms", f"BLiMP paradigms: {', '.join(ev.PARADIGMS)} (default: "
                                              f"{' '.join(ev.DEFAULT_PARADIGMS)})")
    add_names_argument(parser, "--methods", "registered methods (`normx methods`); default: logat (target and foil "
                                            "curves), normxlogit, l2norm, random and the registered decomposition "
                                            "baselines")
    parser.add_argument("--data", default=None, help="data folder holding blimp/ (default: $NORMX_DATA, else the "
                                                     "hub when online)")
    parser.add_argument("--split", choices=SPLITS, default="all",
                        help="which pairs of each paradigm: all, or the seeded 70%% train part / the held-out 30%% "
                             "dev part (evaluate a model fine-tuned on BLiMP, e.g. minilm-blimp, on dev)")
    parser.add_argument("--limit", type=int, default=None, help="at most N covered pairs per paradigm (a seeded "
                                                                 "sample); default: all")
    parser.add_argument("--seed", type=int, default=0, help="seed of the --limit sample and of `random`")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--evidence", choices=ev.EVIDENCE, default="phrase",
                        help="evidence tokens: phrase = the authors' definitions (ana: the antecedent noun phrase; "
                             "elsewhere the evidence word), word = every token of the evidence word, first = its "
                             "first token only")
    parser.add_argument("--special-tokens", choices=SPECIAL_TOKENS, default="include",
                        help="rank special tokens ([CLS], [SEP], <s>) with the words (include, the paper's code) "
                             "or leave them out (exclude)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(func=run)
    return parser


def run(args) -> int:

    output_folder(args.out)
    model, tokenizer = load(args)
    paradigms = names(args.paradigms) or list(ev.DEFAULT_PARADIGMS)
    report = evaluate_blimp(model, tokenizer, paradigms, names(args.methods), data=args.data, split=args.split,
                            limit=args.limit, seed=args.seed, batch_size=args.batch_size,
                            evidence=args.evidence, special_tokens=args.special_tokens,
                            progress=not args.no_progress)
    report.settings["model"] = args.model
    for file in report.write(args.out, plots=not args.no_plots):
        print(file)
    table = report.table()
    if table:
        print("\n" + table)
    return 0
