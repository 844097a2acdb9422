"""The ``normx`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .errors import NormxError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="normx", description="NormXLogit token attributions for HF models.")
    sub = parser.add_subparsers(dest="command", required=True)

    ex = sub.add_parser("explain", help="explain a model's prediction on one or more texts")
    ex.add_argument("texts", nargs="+", metavar="TEXT", help="text(s) to explain")
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
    ex.add_argument("--words", nargs="?", const="sum", default=None, choices=["sum", "mean", "max", "absmax"],
                    help="aggregate subword tokens into words (default aggregation: sum)")
    ex.add_argument("--truncation", default="warn", choices=["warn", "error"])
    ex.add_argument("--gguf-file", default=None, help="load a GGUF checkpoint file inside the model folder")
    ex.add_argument("--json", action="store_true", help="print one JSON object with a `results` list")
    ex.add_argument("--no-color", action="store_true", help="plain table without ANSI colours")

    sub.add_parser("methods", help="list the attribution methods")
    sub.add_parser("models", help="list the offline preset models")
    sub.add_parser("supported", help="list the supported model classes")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except NormxError as exc:
        print(f"normx: error: {exc}", file=sys.stderr)
        return 2


def _run(args) -> int:
    import normx

    _quiet_transformers()
    if args.command == "methods":
        for name, description in normx.describe_methods().items():
            print(f"{name:<12} {description}")
        return 0
    if args.command == "models":
        from .presets import PRESETS

        for preset in PRESETS.values():
            print(f"{preset.name:<14} {preset.task:<24} {preset.description} [package: {preset.package}]")
        return 0
    if args.command == "supported":
        print("\n".join(normx.supported_models()))
        return 0

    kwargs = {"gguf_file": args.gguf_file} if args.gguf_file else {}
    model, tokenizer = normx.load_model(args.model, **kwargs)
    target = args.target
    if target is not None and len(target) == 1:
        target = target[0]
    if isinstance(target, list):
        target = [_maybe_int(t) for t in target]
    elif target is not None:
        target = _maybe_int(target)
    layer = args.layer if args.layer in (None, "all") else _layer(args.layer)
    pairs = None if args.pair is None else [args.pair] * len(args.texts)
    results = normx.explain(model, tokenizer, list(args.texts), method=args.method, target=target, layer=layer,
                            text_pair=pairs, foil=None if args.foil is None else _maybe_int(args.foil),
                            embedding=args.embedding, truncation=args.truncation)
    if args.words:
        results = [r.words(args.words) for r in results]
    if args.json:
        print(json.dumps({"model": args.model, "results": [r.to_dict() for r in results]}, ensure_ascii=False))
        return 0
    from .rendering import render_table

    color = not args.no_color and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    print("\n\n".join(render_table(r, color=color) for r in results))
    return 0


def _quiet_transformers() -> None:
    """Loading progress bars and load reports would drown the explanation; errors still surface."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def _maybe_int(value: str):
    return int(value) if value.strip().lstrip("-").isdigit() else value


def _layer(value: str):
    if "," in value:
        return [int(v) for v in value.split(",")]
    return int(value) if value.strip().lstrip("-").isdigit() else value


if __name__ == "__main__":
    raise SystemExit(main())
