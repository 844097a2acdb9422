"""``normx space DIR``: a Hugging Face Space folder of the demo (:func:`normx.serving.space.write_space`)."""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    """Add the ``space`` subcommand (light: it imports neither torch nor transformers)."""
    parser = sub.add_parser("space", help="write a Hugging Face Space folder of the demo: README.md (Spaces front "
                                          "matter), app.py, requirements.txt, normx and the models; the package "
                                          "folders get only their packages' own files (an installed wheel's "
                                          "RECORD, or what git has committed), and it prints what it left out")
    parser.add_argument("folder", metavar="DIR", help="an empty folder or a fresh clone of the Space")
    parser.add_argument("--models", default=None, metavar="A,B",
                        help="the presets the Space serves, comma-separated (default: every preset that loads here; "
                             "`normx models`)")
    parser.add_argument("--force", action="store_true",
                        help="write into a folder that holds other files (what normx writes there is replaced)")
    return parser


def run(args) -> int:
    from normx.serving.space import write_space

    models = None if args.models is None else [m.strip() for m in args.models.split(",") if m.strip()]
    print(write_space(args.folder, models, force=args.force).summary())
    return 0
