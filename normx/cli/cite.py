"""``normx cite``: which part of a context a causal LM's answer came from (:func:`normx.explain_context`): the
context from a file or standard input, split into sources (sentences, paragraphs, lines), a query, a method (the
ablation reference ``contextcite`` by default); a table of the top sources, ``--json FILE``, ``--html FILE``."""

from __future__ import annotations

import argparse
import os
import sys

from normx.cli.checks import check_texts
from normx.cli.options import add_model_flags, load, write_page, write_text
from normx.errors import InvalidInputError

SOURCES = ("sentences", "paragraphs", "lines")
OWN = ("sources", "n_ablations")  # method options cite has flags of its own for


def add_parser(sub, heavy: bool) -> argparse.ArgumentParser:
    """Add the ``cite`` subcommand (the method option flags only when it is the command about to run)."""
    parser = sub.add_parser("cite", help="which sentences (paragraphs, lines) of a context a causal LM's answer "
                                         "came from (ContextCite's ablations by default)")
    parser.add_argument("context", metavar="CONTEXT", help="a UTF-8 text file with the context; `-` reads standard "
                        "input")
    parser.add_argument("--model", required=True, help="a causal-LM preset (`normx models`), a model folder, a PEFT "
                        "adapter folder or a hub id")
    parser.add_argument("--query", default=None, help="the question or instruction, put after the context "
                        "('Context: ...\\n\\nQuery: ...', as ContextCite)")
    parser.add_argument("--sources", default="sentences", choices=SOURCES, help="how the context is split "
                        "(default sentences: nltk Punkt, offline; a line break ends one)")
    parser.add_argument("--method", default="contextcite", help="contextcite (default; contextcite@N: N "
                        "ablations), budgeted (budgeted@fast / @balanced / @faithful / @N: a budget of N forward "
                        "passes), leave_one_out, calibrated_attention, or a method of `normx methods` that explains "
                        "a causal LM (the gradient methods and attnlrp at the response level)")
    parser.add_argument("--response", default=None, metavar="TEXT", help="explain this answer instead of "
                        "generating one (give the leading space it needs)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="the most tokens to generate (default 64)")
    chat = parser.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="chat", action="store_true", default=None, help="wrap the prompt with the "
                      "tokenizer's chat template (the default where it has one)")
    chat.add_argument("--no-chat", dest="chat", action="store_false", help="give the prompt as it is, without the "
                      "chat template")
    parser.add_argument("--n-ablations", type=int, default=None, help="contextcite: random source masks, one "
                        "forward pass each (default 64)")
    parser.add_argument("--top", type=int, default=5, help="how many sources to show (default 5)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the result as JSON")
    parser.add_argument("--html", default=None, metavar="FILE", help="also write the context with its sources "
                        "highlighted as one HTML page")
    parser.add_argument("--no-color", action="store_true", help="no ANSI colours")
    add_model_flags(parser)
    if heavy:
        from normx.cli.flags import add_method_flags

        add_method_flags(parser, cite_methods(), own=OWN)
    return parser


def cite_methods() -> list[str]:
    """The methods ``cite`` takes: the context methods first (ContextCite, leave-one-out, calibrated attention: the
    ones that score a response's sources), then every other method that explains what a causal LM writes."""
    from normx.methods import get_method, list_methods

    context = list_methods(response_only=True)
    first = [name for name in context if get_method(name).response_only]
    return first + [name for name in context if name not in first and get_method(name).explains_generation]


def cite_method(given: str) -> tuple[str, dict]:
    """``--method`` as cite reads it: a name of :func:`cite_methods`, or ``contextcite@N`` (N ablations, as
    ``normx evaluate context`` names it) -> (name, options it sets); an error naming the closest and every one."""
    import difflib

    name, at, tag = given.partition("@")
    methods = cite_methods()
    if name not in methods:
        close = difflib.get_close_matches(name, methods, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise InvalidInputError(f"cite has no method {given!r}; {hint}cite's methods: {', '.join(methods)}")
    if not at:
        return name, {}
    from normx.methods import get_method

    if "n_ablations" in get_method(name).options and tag.isdigit():
        return name, {"n_ablations": int(tag)}
    if "budget" in get_method(name).options:
        from normx.methods.ablation.budgeted import budget_option

        return name, {"budget": budget_option(tag)}  # a named budget or a number of passes, else its error
    raise InvalidInputError(f"--method {given!r}: NAME@N sets the ablations (contextcite@32: --n-ablations 32) or the "
                            f"budget (budgeted@fast, budgeted@6: --budget) of a method that takes them; {name} takes "
                            "neither")


def read_context(path: str) -> str:
    """The context file's text (``-``: standard input), refused when unreadable, not UTF-8 or empty."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
    except FileNotFoundError:
        raise InvalidInputError(f"no context file {path!r}") from None
    except IsADirectoryError:
        raise InvalidInputError(f"{path!r} is a folder; give a text file with the context") from None
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"the context file {path!r} is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise InvalidInputError(f"cannot read the context file {path!r}: {exc.strerror}") from None
    check_texts([text], "context")
    return text


def run(args) -> int:
    from normx.cli.checks import refuse_unless_causal_lm
    from normx.cli.flags import given_options
    from normx.methods import get_method

    # everything that can be checked without the model is checked before it loads, in time that does not grow with
    # the context (its length is checked against the model's once the model is there: explain_context)
    method, tagged = cite_method(args.method)
    spec = get_method(method)
    refuse_unless_causal_lm(args.model, getattr(args, "task", None), "cite")
    context = read_context(args.context)
    if args.query is not None:
        check_texts([args.query], "--query text")
    if args.response is not None:
        check_texts([args.response], "--response text")
    for flag, value in (("--top", args.top), ("--max-new-tokens", args.max_new_tokens)):
        if value < 1:
            raise InvalidInputError(f"{flag} must be at least 1, got {value}")
    options = given_options(args, cite_methods(), own=OWN)
    if args.n_ablations is not None:
        if "n_ablations" not in spec.options:
            raise InvalidInputError(f"--n-ablations is an option of contextcite, not of {method}")
        if tagged and tagged["n_ablations"] != args.n_ablations:
            raise InvalidInputError(f"--method {args.method} and --n-ablations {args.n_ablations} disagree; give one")
        options["n_ablations"] = args.n_ablations
    options = {**tagged, **options}
    spec.resolve_options(options)  # bad values before the load
    from normx.context import explain_context

    model, tokenizer = load(args)
    if args.chat is None:
        from normx.context.explain import has_chat_template

        args.chat = has_chat_template(tokenizer)
        if args.chat:
            print("normx: asking through the tokenizer's chat template (--no-chat to give the prompt as it is)",
                  file=sys.stderr)
    result = explain_context(model, tokenizer, context, args.query, sources=args.sources, method=method,
                             response=args.response, chat=args.chat, max_new_tokens=args.max_new_tokens, **options)
    if args.json:
        file = write_text(args.json, result.to_json() + "\n")
        print(f"normx: wrote {file}", file=sys.stderr)
    if args.html:
        from normx.explanations.html import page

        write_page(args.html, page(result.to_html(), f"normx cite: {args.model}"))
    color = not args.no_color and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    print(render_citation(result, args.top, color, spec.passes(result.generation.prompt_length, 1,
                                                              _options(result))))
    return 0


def _options(result) -> dict:
    settings = result.generation.settings
    spec_options = {"n_ablations", "sources"}
    return {k: settings[k] for k in spec_options if k in settings}


def render_citation(result, top: int = 5, color: bool = False, passes: float | None = None) -> str:
    """The response, then the top sources: rank, index, score and a short excerpt."""
    bold, reset = ("\033[1m", "\033[0m") if color else ("", "")
    cost = f"; about {passes:.0f} forward passes" if passes is not None else ""
    lines = [f"response: {bold}{result.response!r}{reset}",
             f"method: {result.method} ({result.reading} scores; {len(result.sources)} sources{cost})"]
    settings = result.generation.settings
    if settings.get("weights_file"):  # calibrated weights: which ones this run read
        lines.append(f"weights: {settings['weights_file']} (sha256 {str(settings.get('weights_sha256'))[:12]})")
    lines.append(f"{'rank':>4}  {'source':>6}  {'score':>10}  text")
    for rank, (index, text, score) in enumerate(result.top(top), 1):
        excerpt = " ".join(text.split())
        excerpt = excerpt if len(excerpt) <= 70 else excerpt[:69] + "…"
        lines.append(f"{rank:>4}  {index:>6}  {score:>+10.4g}  {excerpt}")
    return "\n".join(lines)
