"""``normx evaluate EXPERIMENT ...``: each experiment module adds its own subcommand.

An experiment module defines ``add_parser(subparsers)``, which adds its subcommand and sets ``func`` (a function
``args -> exit code``) as the parser's default.
"""

from __future__ import annotations

import argparse

EXPERIMENTS = ("faithfulness", "blimp")


def add_evaluate_parser(sub) -> argparse.ArgumentParser:
    import importlib

    parser = sub.add_parser("evaluate", help="evaluate explanations: " + ", ".join(EXPERIMENTS))
    experiments = parser.add_subparsers(dest="experiment", required=True)
    for name in EXPERIMENTS:
        importlib.import_module(f"{__package__}.{name}").add_parser(experiments)
    return parser


def run(args) -> int:
    return int(args.func(args) or 0)
