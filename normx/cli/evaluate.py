"""``normx evaluate EXPERIMENT ...``: each experiment's module adds its own subcommand.

An experiment module defines ``add_parser(subparsers)``, which adds its subcommand and sets ``func`` (a function
``args -> exit code``) as the parser's default.
"""

from __future__ import annotations

import argparse

import normx.cli.blimp
import normx.cli.context
import normx.cli.faithfulness

# experiment -> module with add_parser (imported by their paths: `from normx.cli import ...` would run the package's
# __init__, which imports normx.cli.main, which imports this module)
EXPERIMENTS = {"faithfulness": normx.cli.faithfulness, "blimp": normx.cli.blimp, "context": normx.cli.context}


def add_evaluate_parser(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser("evaluate", help="evaluate explanations: " + ", ".join(EXPERIMENTS))
    experiments = parser.add_subparsers(dest="experiment", required=True)
    for module in EXPERIMENTS.values():
        module.add_parser(experiments)
    return parser


def run(args) -> int:
    return int(args.func(args) or 0)
