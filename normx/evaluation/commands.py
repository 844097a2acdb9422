"""``normx evaluate EXPERIMENT ...``: each experiment module adds its own subcommand.

An experiment module defines ``add_parser(subparsers)``, which adds its subcommand and sets ``func`` (a function
``args -> exit code``) as the parser's default.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..errors import InvalidInputError

EXPERIMENTS = {"faithfulness": "faithfulness_cli", "blimp": "blimp_cli"}  # experiment -> module with add_parser


def add_evaluate_parser(sub) -> argparse.ArgumentParser:
    import importlib

    parser = sub.add_parser("evaluate", help="evaluate explanations: " + ", ".join(EXPERIMENTS))
    experiments = parser.add_subparsers(dest="experiment", required=True)
    for module in EXPERIMENTS.values():
        importlib.import_module(f"{__package__}.{module}").add_parser(experiments)
    return parser


def add_names_argument(parser: argparse.ArgumentParser, flag: str, help: str, default=None) -> None:
    """A list option that takes names separated by spaces, commas or both (``--methods a b``, ``--methods a,b``),
    the same in every experiment; read it with :func:`names`."""
    parser.add_argument(flag, nargs="+", default=default, metavar="NAME", help=help + " (space- or comma-separated)")


def names(values: list[str] | None) -> list[str] | None:
    """The names of an :func:`add_names_argument` option, split at commas; ``None`` (not given) stays ``None``."""
    if values is None:
        return None
    return [name.strip() for value in values for name in value.split(",") if name.strip()]


def output_folder(path: str) -> Path:
    """The ``--out`` folder, created now (before any model loads or work runs): a clear error if it cannot be."""
    folder = Path(path).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInputError(f"--out {path!r}: cannot create the output folder ({exc.strerror or exc})") from None
    if not os.access(folder, os.W_OK):
        raise InvalidInputError(f"--out {path!r}: the folder is not writable")
    return folder


def run(args) -> int:
    return int(args.func(args) or 0)
