"""Options that several commands share: lists of names, the output folder, layers, texts."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from normx.errors import InvalidInputError
from normx.models.tasks import TASKS


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


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    """The loading flags every command that loads a model takes: ``--task``, ``--gguf-file`` and ``--device``."""
    parser.add_argument("--task", default=None, choices=sorted(TASKS),
                        help="the head to load the model with, when its config names none normx supports (a GGUF "
                             "file is a causal LM unless told otherwise)")
    parser.add_argument("--gguf-file", default=None, help="load this GGUF file inside the model folder (a .gguf path "
                        "or a folder holding one .gguf also works as --model)")
    parser.add_argument("--device", default=None, help="run the model on this torch device (cpu, cuda, cuda:1, mps; "
                        "default: where it loads, the CPU)")


def load(args: argparse.Namespace):
    """``(model, tokenizer)`` for ``args.model`` with the loading flags (:func:`add_model_flags`); slow first-time
    steps (a GGUF file's conversion) are said on standard error."""
    from normx.zoo.loading import load_model

    kwargs = {name: value for name in ("task", "gguf_file") if (value := getattr(args, name, None))}
    device = getattr(args, "device", None)
    if device is not None:
        kwargs["device"] = _device(device)
    return load_model(args.model, notify=lambda message: print(f"normx: {message}", file=sys.stderr), **kwargs)


def _device(name: str):
    """``--device``'s torch device, checked before the model loads."""
    from normx._torch import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise InvalidInputError(f"--device {name!r} is not a torch device; use cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInputError(f"--device {name!r}: torch sees no CUDA device here")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise InvalidInputError(f"--device {name!r}: torch sees {torch.cuda.device_count()} CUDA devices")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise InvalidInputError(f"--device {name!r}: torch sees no MPS device here")
    return device


def add_output_flags(parser: argparse.ArgumentParser, json_help: str, what: str) -> None:
    """The output flags ``explain`` and ``generate`` share: ``--json`` (``json_help``), ``--html FILE`` (``what``:
    the results, for its help) and ``--no-color``; and the loading flags (:func:`add_model_flags`)."""
    add_model_flags(parser)
    parser.add_argument("--json", action="store_true", help=json_help)
    parser.add_argument("--html", default=None, metavar="FILE", help=f"also write the {what} as one self-contained "
                        "HTML page")
    parser.add_argument("--no-color", action="store_true", help="no ANSI colours")


def layer_spec(value: str | None):
    """``--layer``: None, an index, a comma-separated list of indices, or 'all' (ranges are checked with the
    model)."""
    if value in (None, "all"):
        return value
    parts = [part.strip() for part in value.split(",")]
    bad = [part for part in parts if not part.lstrip("-").isdigit()]
    if bad or not parts:
        raise InvalidInputError(f"--layer {value!r} is not allowed: give a layer index (0 = embeddings, negative "
                                "counts from the end), a comma-separated list of them, or 'all'")
    numbers = [int(part) for part in parts]
    return numbers if "," in value else numbers[0]


def texts(values: list[str]) -> list[str]:
    """The TEXT arguments; a lone `-` reads the texts from standard input, one per non-empty line."""
    if values != ["-"]:
        return list(values)
    lines = [line.rstrip("\r\n") for line in sys.stdin]
    read = [line for line in lines if line.strip()]
    if not read:
        raise InvalidInputError("`-` reads the texts from standard input, one per line, but it had none")
    return read


def write_text(path: str, text: str) -> Path:
    """Write ``text`` to the file ``path`` (UTF-8), its folder created; a clear error if it cannot be."""
    file = Path(path).expanduser()
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InvalidInputError(f"cannot write {path!r} ({exc.strerror or exc})") from None
    return file


def write_page(path: str, html: str) -> Path:
    """``--html FILE``: the page written (:func:`write_text`), and ``normx: wrote FILE`` said on standard error (so
    that standard output stays the table or the JSON)."""
    file = write_text(path, html)
    print(f"normx: wrote {file} ({file.stat().st_size / 1024:.0f} KB)", file=sys.stderr)
    return file
