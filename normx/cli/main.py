"""The ``normx`` command line."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import warnings

from normx._version import __version__
from normx.cli.checks import check_layers, check_texts
from normx.cli.options import add_model_flags, add_output_flags, layer_spec, write_page
from normx.cli.options import texts as read_texts
from normx.errors import CacheWarning, InputWarning, InvalidInputError, NormxError


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser. ``command``: the subcommand about to run; only its heavy parts are built (the method flags
    come from the method registry, the evaluate subcommands from the evaluation modules), so that ``normx --help``
    and the light commands never import torch. ``None`` builds everything."""
    from normx.cli.flags import add_method_flags

    def heavy(name: str) -> bool:
        return command is None or command == name

    parser = argparse.ArgumentParser(prog="normx", description="NormXLogit token attributions for HF models.")
    parser.add_argument("--version", action="version", version=f"normx {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    ex = sub.add_parser("explain", help="explain a model's prediction on one or more texts")
    ex.add_argument("texts", nargs="+", metavar="TEXT", help="text(s) to explain; `-` reads them from standard "
                    "input, one per line")
    ex.add_argument("--model", required=True,
                    help="a preset name (`normx models`), a local model folder, a PEFT adapter folder or a hub id")
    ex.add_argument("--method", default="normxlogit", help="attribution method (see `normx methods`)")
    ex.add_argument("--target", action="append", default=None, metavar="LABEL",
                    help="label, class index or vocabulary token to explain (repeatable; 'all' = every class); "
                         "default: the predicted label")
    ex.add_argument("--foil", default=None, metavar="LABEL", help="contrastive: subtract this label's scores")
    ex.add_argument("--layer", default=None, help="layer index (0 = embeddings, negative from the end) or 'all'")
    ex.add_argument("--pair", default=None, metavar="TEXT", help="second text for sentence-pair models")
    ex.add_argument("--embedding", default="layer", choices=["layer", "word"],
                    help="x^0 for the norm: embedding layer output (default) or raw word embedding")
    ex.add_argument("--words", action="store_true", help="show words: subword tokens summed per word")
    ex.add_argument("--word-aggregation", default=None, choices=["sum", "mean", "max", "absmax"],
                    help="how subword scores make a word's score (implies --words; default sum)")
    ex.add_argument("--truncation", default="warn", choices=["warn", "error"],
                    help="a text longer than the model takes: 'warn' explains its first tokens up to the model's "
                         "limit and says so; 'error' stops (default warn)")
    if heavy("explain"):
        add_method_flags(ex)
    add_output_flags(ex, "print one JSON object with a `results` list", "explanations")

    at = sub.add_parser("attribute", help="explain every row of a corpus into Parquet shards (streamed, resumable; "
                        "torchrun / accelerate launch for many processes)")
    at.add_argument("--model", required=True, help="a preset, a model folder, a PEFT adapter folder, a GGUF file or a "
                    "hub id")
    add_model_flags(at)
    at.add_argument("--data", required=True, help="a TSV / CSV / JSONL / Parquet file, or a hub dataset id "
                    "NAME[:CONFIG][@SPLIT] (online)")
    at.add_argument("--out", required=True, help="output folder: shard-*.parquet and _manifest.json")
    at.add_argument("--text-column", default=None, help="default: text, sentence, sentence1, premise or question")
    at.add_argument("--pair-column", default=None, help="default: the usual partner of the text column, if present; "
                    "'' for none")
    at.add_argument("--method", default="normxlogit")
    at.add_argument("--target", action="append", default=None, metavar="LABEL",
                    help="label(s) to explain (repeatable; 'all'); default: the predicted one")
    at.add_argument("--layer", default=None, help="layer index, comma-separated indices or 'all'")
    at.add_argument("--limit", type=int, default=None, help="the first N rows only")
    at.add_argument("--shard-size", type=int, default=1000, help="rows per output shard (default 1000)")
    at.add_argument("--max-tokens", type=int, default=None,
                    help="padded tokens per forward pass; rows are bucketed by length (default 2048 on CPU, "
                         "16384 on GPU)")
    at.add_argument("--batch-size", type=int, default=None,
                    help="fixed batches of N rows in input order instead of length buckets")
    at.add_argument("--no-progress", action="store_true")
    if heavy("attribute"):
        add_method_flags(at)

    sub.add_parser("methods", help="list the attribution methods")
    models = sub.add_parser("models", help="list the offline preset models")
    models.add_argument("--json", action="store_true")

    tr = sub.add_parser("train", help="train an offline preset's adapter and head (reproducible from --seed)")
    tr.add_argument("preset", help="a preset name from `normx models`")
    tr.add_argument("--data", default=None, help="data folder (default: $NORMX_DATA, else the hub when online)")
    tr.add_argument("--out", default=None, help="output folder (default: the preset's folder in the package)")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--no-progress", action="store_true")
    if heavy("evaluate"):
        from normx.cli.evaluate import add_evaluate_parser

        add_evaluate_parser(sub)
    else:
        sub.add_parser("evaluate", help="evaluate explanations: faithfulness, blimp, context")
    from normx.cli.cache import add_parser as add_cache
    from normx.cli.calibrate import add_parser as add_calibrate
    from normx.cli.cite import add_parser as add_cite
    from normx.cli.generate import add_parser as add_generate
    from normx.cli.space import add_parser as add_space
    from normx.cli.supported import add_parser as add_supported

    add_generate(sub, heavy("generate"))
    add_cite(sub, heavy("cite"))
    add_calibrate(sub, heavy("calibrate"))
    add_space(sub)
    add_cache(sub)
    add_supported(sub)
    show = sub.add_parser("show", help="one HTML report of a folder written by `normx attribute`: the corpus "
                                       "summary and every example, sortable and paged")
    show.add_argument("folder", metavar="DIR")
    show.add_argument("--out", default=None, help="the report's folder (default DIR/_report)")
    show.add_argument("--top", type=int, default=20, help="units per label in the summary tables (default 20)")
    show.add_argument("--min-count", type=int, default=5,
                      help="occurrences a unit needs to be ranked by its mean (default 5)")
    sub.add_parser("demo", add_help=False,
                   help="serve the Gradio demo (demo/app.py; `normx demo --help` for its options)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["demo"]:  # the demo app parses its own options
        return _demo(argv[1:])
    command = next((a for a in argv if not a.startswith("-")), "")  # "": no subcommand (top-level help or usage)
    args = build_parser(command).parse_args(argv)
    try:
        return _run(args)
    except NormxError as exc:
        print(f"normx: error: {exc}", file=sys.stderr)
        return 2


def _run(args) -> int:
    from normx.methods import describe_methods, get_method, list_methods

    if args.command not in ("methods", "models", "supported", "cache", "space"):  # light commands: no torch
        _quiet_transformers()
        if isinstance(getattr(args, "model", None), str):
            from normx.models.loading import check_model_name

            check_model_name(args.model)
    if args.command == "methods":
        offered = describe_methods()
        for name, description in offered.items():
            print(f"{name:<20} {description}")
        experimental = {k: v for k, v in describe_methods(experimental=True).items() if k not in offered}
        if experimental:
            print("\nexperimental (candidates under study, usable by name; docs/variants.md):")
            for name, description in experimental.items():
                print(f"{name:<20} {description}")
        responses = {k: get_method(k).description for k in list_methods(response_only=True) if k not in offered}
        print("\nresponse only (the sources of a whole response: normx cite, explain_generation, explain_context):")
        for name, description in responses.items():
            print(f"{name:<20} {description}")
        return 0
    # with a module of their own
    if args.command in ("evaluate", "generate", "cite", "calibrate", "space", "supported", "cache"):
        return importlib.import_module(f"normx.cli.{args.command}").run(args)
    if args.command == "models":
        return _models(args)
    if args.command == "train":
        return _train(args)
    if args.command == "attribute":
        return _attribute(args)
    if args.command == "show":
        return _show(args)

    # everything that can be checked without the model is checked before it loads
    get_method(args.method)
    layer = layer_spec(args.layer)
    texts = read_texts(args.texts)
    check_texts(texts)
    if args.pair is not None:
        check_texts([args.pair], "--pair text")
    _check_labels(args.model, [*(args.target or []), *([args.foil] if args.foil else [])])
    check_layers(layer, args.model, args.gguf_file)
    from normx.cli.options import load
    from normx.explanations.explain import explain

    model, tokenizer = load(args)
    target = _target(args.target)
    pairs = None if args.pair is None else [args.pair] * len(texts)
    from normx.cli.flags import given_options

    options = given_options(args)
    results = explain(model, tokenizer, texts, method=args.method, target=target, layer=layer,
                            text_pair=pairs, foil=None if args.foil is None else _maybe_int(args.foil),
                            embedding=args.embedding, truncation=args.truncation, **options)
    if args.words or args.word_aggregation:
        results = [r.words(args.word_aggregation or "sum") for r in results]
    _write_html(args, results)
    if args.json:
        print(json.dumps({"model": args.model, "results": [r.to_dict() for r in results]}, ensure_ascii=False))
        return 0
    from normx.cli.render import render_table

    color = not args.no_color and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    print("\n\n".join(render_table(r, color=color) for r in results))
    return 0


def _attribute(args) -> int:
    from normx.bulk.attribute import attribute_dataset
    from normx.cli.flags import given_options
    from normx.cli.options import load
    from normx.data.rows import _pyarrow_parquet
    from normx.methods import get_method

    get_method(args.method)
    layer = layer_spec(args.layer)
    _pyarrow_parquet()  # the shards are Parquet: a missing pyarrow is said before the model loads
    check_layers(layer, args.model, args.gguf_file)
    from normx.bulk.manifest import check_run

    check_run(args.data, args.out, method=args.method, target=_target(args.target), layer=layer,  # before the model
              text_column=args.text_column, pair_column=args.pair_column, limit=args.limit, shard_size=args.shard_size,
              max_tokens=args.max_tokens, batch_size=args.batch_size, **given_options(args))
    model, tokenizer = load(args)
    local = os.environ.get("LOCAL_RANK")
    if local is not None:
        import torch

        if torch.cuda.is_available():
            model.to(f"cuda:{int(local)}")  # one GPU per process under torchrun / accelerate launch
    target = _target(args.target)
    run = attribute_dataset(model, tokenizer, args.data, args.out, method=args.method, target=target, layer=layer,
                            text_column=args.text_column, pair_column=args.pair_column, limit=args.limit,
                            shard_size=args.shard_size, max_tokens=args.max_tokens, batch_size=args.batch_size,
                            progress=not args.no_progress, **given_options(args))
    if run.rank == 0:
        print(run.summary(), file=sys.stderr)
    return 0


def _show(args) -> int:
    from normx.bulk.report import write_report

    if args.top < 1 or args.min_count < 1:
        raise InvalidInputError("--top and --min-count must be at least 1")
    print(write_report(args.folder, args.out, args.top, args.min_count))
    return 0


def _write_html(args, results) -> None:
    """``--html FILE``: the explanations as one self-contained page."""
    if args.html:
        from normx.explanations.html import explanations_html, page

        write_page(args.html, page(explanations_html(results), f"normx: {args.model}"))


def _known_labels(model: str) -> list[str] | None:
    """A classifier's label names, read without loading it (a preset's, or a folder's config.json); None when they
    cannot be known so (hub ids, LM heads, regression)."""
    from pathlib import Path

    from normx.zoo.presets import preset_named

    if (preset := preset_named(model)) is not None:  # a bare preset name is the preset, even beside a folder of it
        labels = list(preset.labels)
        return labels if preset.task == "sequence-classification" and len(labels) > 1 else None
    config = Path(model).expanduser() / "config.json"
    if not config.is_file():
        return None
    names = json.loads(config.read_text()).get("id2label") or {}
    return [names[k] for k in sorted(names, key=int)] if len(names) > 1 else None


def _check_labels(model: str, given: list[str]) -> None:
    """Label names that the model does not have are reported before it loads (indices and 'all' pass)."""
    labels = _known_labels(model)
    if not labels:
        return
    lowered = {label.lower() for label in labels}
    for value in given:
        if value != "all" and not value.strip().lstrip("-").isdigit() and value.lower() not in lowered:
            raise InvalidInputError(f"label {value!r} is not a label of {model}; its labels are {labels} (or indices "
                                    f"0..{len(labels) - 1}, or 'all')")


def _target(target):
    if target is not None and len(target) == 1:
        return _maybe_int(target[0])
    return None if target is None else [_maybe_int(t) for t in target]


def _models(args) -> int:
    from normx.zoo.presets import PRESETS

    rows = [preset.summary() for preset in PRESETS.values()]
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'preset':<14} {'task':<24} {'labels':<36} {'metric (dev)':<18} {'size':>8}  base package")
    for row in rows:
        metric = "" if row["metric"] is None else f"{row['metric']} " + (
            "untrained" if row["value"] is None else f"{row['value']:.3f}")
        labels = ", ".join(row["labels"]) or "vocabulary"
        print(f"{row['name']:<14} {row['task']:<24} {labels:<36} {metric:<18} {row['size_mb']:>6.2f}MB  "
              f"{row['package']}")
    return 0


def _train(args) -> int:
    from normx.zoo.presets import get_preset
    from normx.zoo.training import train

    preset = get_preset(args.preset)
    if preset.recipe is None:
        print(f"normx: preset {preset.name!r} is used untouched; there is nothing to train", file=sys.stderr)
        return 2
    command = " ".join(["normx train", preset.name, f"--seed {args.seed}"] + (["--data DATA"] if args.data else []))
    out = args.out or preset.folder
    metrics = train(preset.recipe, preset.fresh, out, data_path=args.data, seed=args.seed,
                    progress=not args.no_progress, command=command)
    preset.name_base_in(out)
    print(json.dumps({k: metrics[k] for k in ("metric", "value", "examples", "train_examples", "steps",
                                              "train_seconds")}))
    return 0


def _demo(argv: list[str]) -> int:
    """``normx demo [--host H] [--port P] [--model M] [--locked] [--models A,B]``: serve the Gradio demo.

    The app is ``demo/app.py`` of the source checkout (the folder next to the ``normx`` package; the README
    installs normx editable), or the file named by $NORMX_DEMO_APP. It is imported by path and its ``main(argv)``
    runs (blocking until Ctrl-C).
    """
    import importlib.util

    from normx.serving.space import demo_app_file

    try:
        app_file = demo_app_file()
    except NormxError as exc:
        print(f"normx: error: {exc}", file=sys.stderr)
        return 2
    if importlib.util.find_spec("gradio") is None:
        print("normx: error: the demo needs gradio: pip install -e '.[demo]'", file=sys.stderr)
        return 2
    spec = importlib.util.spec_from_file_location("normx_demo_app", app_file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return int(module.main(argv) or 0)


def _quiet_transformers() -> None:
    """Loading progress bars and load reports would drown the explanation; errors still surface."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)  # deprecation notices from transformers / peft
    warnings.showwarning = _show_warning


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings on the terminal as the CLI's own lines (normx's own warnings: truncation, unknown tokens, a cache
    entry repaired; another library's warning names its class and origin)."""
    where = "" if issubclass(category, (InputWarning, CacheWarning)) else f" ({category.__name__}, {filename}:{lineno})"
    print(f"normx: warning: {message}{where}", file=sys.stderr if file is None else file)


def _maybe_int(value: str):
    return int(value) if value.strip().lstrip("-").isdigit() else value


if __name__ == "__main__":
    raise SystemExit(main())
