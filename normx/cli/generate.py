"""``normx generate``: explain what a causal LM writes, token by token (:func:`normx.explain_generation`)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from normx.cli.checks import check_layers, check_texts
from normx.cli.options import add_output_flags, layer_spec, load, texts, write_page


def add_parser(sub, heavy: bool) -> argparse.ArgumentParser:
    """Add the ``generate`` subcommand (its method flags only when it is the command about to run)."""
    parser = sub.add_parser("generate", help="explain every token a causal LM writes after a prompt (one forward "
                                             "pass for the head-on-top, attention and recency methods)")
    parser.add_argument("prompts", nargs="+", metavar="PROMPT", help="prompt(s); `-` reads them from standard "
                        "input, one per line")
    parser.add_argument("--model", required=True, help="a causal-LM preset (`normx models`), a model folder, a PEFT "
                        "adapter folder or a hub id")
    parser.add_argument("--max-new-tokens", type=int, default=20, help="the most tokens to generate (default 20)")
    parser.add_argument("--continuation", default=None, metavar="TEXT", help="explain this continuation instead "
                        "of generating one (teacher forcing; give the leading space the words need)")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt as a user message with the "
                        "tokenizer's chat template")
    parser.add_argument("--method", default="normxlogit", help="attribution method (see `normx methods`)")
    parser.add_argument("--layer", default=None, help="layer index (0 = embeddings, negative from the end), a "
                        "comma-separated list, or 'all'")
    parser.add_argument("--top", type=int, default=3, help="how many earlier tokens to show per generated token")
    parser.add_argument("--max-length", "--max-tokens", dest="max_length", type=int, default=None, metavar="N",
                        help="the most tokens of a prompt and its continuation together (default: the model's context "
                        "length)")
    parser.add_argument("--truncation", default="error", choices=["error", "warn"], help="a prompt longer than that: "
                        "an error (default), or 'warn': cut its start, keeping the tokens nearest the continuation, "
                        "and say how many were cut")
    if heavy:
        from normx.cli.flags import add_method_flags

        add_method_flags(parser)
    add_output_flags(parser, "print one JSON object per prompt, one per line", "generations")
    return parser


def run(args) -> int:
    from normx.cli.flags import given_options
    from normx.errors import InvalidInputError
    from normx.methods import get_method

    get_method(args.method)  # everything that can be checked without the model is checked before it loads
    layer = layer_spec(args.layer)
    prompts = texts(args.prompts)
    check_texts(prompts, "prompt")
    if args.top < 1:
        raise InvalidInputError(f"--top must be at least 1, got {args.top}")
    if args.max_new_tokens < 1:
        raise InvalidInputError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.max_length is not None and args.max_length < 1:
        raise InvalidInputError(f"--max-length must be at least 1, got {args.max_length}")
    if args.continuation is not None:
        check_texts([args.continuation], "--continuation text")
    check_layers(layer, args.model, args.gguf_file)
    from normx.explanations.generation import explain_generation

    model, tokenizer = load(args)
    target = None if args.continuation is None else [args.continuation] * len(prompts)
    results = explain_generation(model, tokenizer, prompts, method=args.method, layer=layer, target=target,
                                 max_new_tokens=args.max_new_tokens, chat=args.chat, max_length=args.max_length,
                                 truncation=args.truncation, **given_options(args))
    if args.html:
        from normx.explanations.html import page

        write_page(args.html, page(results.to_html(), f"normx generate: {args.model}"))
    if args.json:
        for generation in results:
            print(json.dumps({"model": args.model, **generation.to_dict()}, ensure_ascii=False))
        return 0
    color = not args.no_color and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    print("\n\n".join(render_generation(g, args.top, color) for g in results))
    return 0


def render_generation(generation, top: int = 3, color: bool = False) -> str:
    """The prompt, the continuation, then one line per generated token: its probability and the earlier tokens it
    drew on most (highest scores first)."""
    bold, reset = ("\033[1m", "\033[0m") if color else ("", "")
    lines = [f"prompt: {generation.prompt!r}", f"output: {bold}{generation.continuation!r}{reset}",
             f"method: {generation.method}, layer {generation.layers[-1]}; {generation.steps} generated tokens"]
    texts = generation.texts  # tokens as the text they stand for (" Paris", not "ĠParis")
    width = max((len(repr(texts[p])) for p in generation.generated), default=0)
    for t, p in enumerate(generation.generated):
        drew = ", ".join(f"{texts[index]!r}@{index} {score:+.3g}" for index, _, score in generation.top(t, top))
        lines.append(f"  {bold}{texts[p]!r:<{width}}{reset}  p={generation.probabilities[t]:.3f}  <- {drew}")
    return "\n".join(lines)
