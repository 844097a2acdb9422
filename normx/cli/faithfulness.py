"""``normx evaluate faithfulness``: the command line of :mod:`normx.evaluation.faithfulness.run`."""

from __future__ import annotations

from normx.cli.flags import add_method_flags, given_options, option_words
from normx.cli.options import add_model_flags, add_names_argument, load, names, output_folder
from normx.data import glue
from normx.errors import InvalidInputError
from normx.evaluation.faithfulness.examples import load_examples
from normx.evaluation.faithfulness.perturbation import SPECIAL_TOKENS, STRATEGIES
from normx.evaluation.faithfulness.report import format_table
from normx.evaluation.faithfulness.run import RANKINGS, _method_names, evaluate
from normx.methods import get_method


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "faithfulness", help="AOPC comprehensiveness / sufficiency of attribution methods on a model and data set",
        description="Rank each example's tokens by each method's attributions, perturb the top K% (comprehensiveness)"
                    " or all but the top K% (sufficiency) for K = 0..100%, and report the confidence drop and "
                    "accuracy (Pearson for regression) curves and their AOPC (mean over K = 10..90%).")
    parser.add_argument("--model", required=True, help="a preset name (`normx models`), a model folder, a GGUF file "
                        "or a hub id")
    add_model_flags(parser)
    parser.add_argument("--data", required=True,
                        help=f"a task ({', '.join(glue.TASKS)}: its dev split, from --data-dir or $NORMX_DATA) or a "
                             "TSV / JSONL file with the fields text, text_pair (optional), label")
    parser.add_argument("--data-dir", default=None, help="the GLUE data folder (default: $NORMX_DATA)")
    add_names_argument(parser, "--methods", "method names (`normx methods`), or all (the default)")
    parser.add_argument("--limit", type=int, default=None, help="evaluate the first N examples")
    parser.add_argument("--split", default="dev", choices=glue.SPLITS,
                        help="a GLUE task's split: dev (default; for MNLI / QNLI the part the presets were not "
                             "trained on) or train (the presets' training data: for choosing settings on data "
                             "you will not report)")
    parser.add_argument("--out", required=True, help="output folder for summary.json, curves.csv, summary.csv, PNGs")
    parser.add_argument("--regression-ranking", default="farthest", choices=RANKINGS,
                        help="regression models: LogAt / NormXLogit rank tokens farthest from the prediction first "
                             "(the paper's formula; default) or closest first")
    parser.add_argument("--special-tokens", default="include", choices=SPECIAL_TOKENS,
                        help="include: [SEP] etc. are ranked and perturbed like words (the authors' protocol); "
                             "exclude: never perturbed. The pooled token is never perturbed.")
    parser.add_argument("--perturbation", default="auto", choices=STRATEGIES,
                        help="auto: replace by the mask token if the tokenizer has one, else delete")
    parser.add_argument("--batch-size", type=int, default=16, help="texts per explain batch")
    parser.add_argument("--eval-batch-size", type=int, default=64, help="perturbed inputs per forward pass")
    parser.add_argument("--max-length", type=int, default=None, help="truncate inputs to this many tokens")
    add_method_flags(parser)
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG figures")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)
    return parser


def run(args) -> int:

    methods = names(args.methods)
    if methods == ["all"] or not methods:
        methods = None
    chosen = _method_names(methods)
    given = given_options(args)
    method_options = {m: {k: v for k, v in given.items() if k in get_method(m).options} for m in chosen}
    unused = sorted(set(given) - {k for opts in method_options.values() for k in opts})
    if unused:
        raise InvalidInputError(f"option(s) {', '.join('--' + u.replace('_', '-') for u in unused)} given, but none "
                                f"of the methods {chosen} takes them")
    examples = load_examples(args.data, args.data_dir, args.limit, args.split)
    output_folder(args.out)
    model, tokenizer = load(args)
    report = evaluate(model, tokenizer, examples, chosen, task=args.data if args.data in glue.TASKS else None,
                      special_tokens=args.special_tokens, perturbation=args.perturbation, batch_size=args.batch_size,
                      eval_batch_size=args.eval_batch_size, max_length=args.max_length,
                      method_options={m: o for m, o in method_options.items() if o}, progress=not args.no_progress,
                      skip_unsupported=methods is None, regression_ranking=args.regression_ranking)
    report.settings["model"] = args.model
    report.settings["data"] = args.data
    report.settings["split"] = args.split
    report.settings["command"] = _command(args)
    written = report.write(args.out, plots=not args.no_plots)
    print(format_table(report))
    print(f"wrote {args.out}/: {', '.join(file.name for file in written)}")
    return 0


def _command(args) -> str:
    parts = ["normx evaluate faithfulness", f"--model {args.model}", f"--data {args.data}"]
    if args.data_dir:
        parts.append(f"--data-dir {args.data_dir}")
    parts.append(f"--methods {','.join(names(args.methods) or ['all'])}")
    if args.limit is not None:
        parts.append(f"--limit {args.limit}")
    if args.split != "dev":
        parts.append(f"--split {args.split}")
    if args.special_tokens != "include":
        parts.append(f"--special-tokens {args.special_tokens}")
    if args.regression_ranking != "farthest":
        parts.append(f"--regression-ranking {args.regression_ranking}")
    if args.perturbation != "auto":
        parts.append(f"--perturbation {args.perturbation}")
    if args.max_length is not None:
        parts.append(f"--max-length {args.max_length}")
    parts += option_words(args)
    parts.append(f"--out {args.out}")
    return " ".join(parts)
