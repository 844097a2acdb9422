"""Options that several commands share: lists of names, the output folder."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from normx.errors import InvalidInputError


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
