"""What the studies share: where the repository's results go, where the data comes from (``--data`` or
``$NORMX_DATA``, as the shared data's README asks: never a machine path), the peers' other virtualenv, and the
provenance written beside results. Imports no normx module (the LXT parity step runs in another virtualenv)."""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
GENERATION_RESULTS = RESULTS / "generation"
# the SST-2 prompt of the generation studies
INSTRUCTION = "Review: {sentence}\nIs this review positive or negative? Answer:"


def data_folder(given: str | Path | None) -> Path:
    """The data folder: ``given`` (``--data``), else ``$NORMX_DATA``; an error saying so when neither is set."""
    value = given or os.environ.get("NORMX_DATA")
    if not value:
        raise SystemExit("no data folder: give --data DIR or set NORMX_DATA (the shared data's README)")
    folder = Path(value)
    if not folder.is_dir():
        raise SystemExit(f"the data folder {folder} does not exist")
    return folder


def add_data_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", help="the data folder (default: $NORMX_DATA)")


def add_lxt_options(parser: argparse.ArgumentParser) -> None:
    """LXT's Python (its own virtualenv) and the model exported for it (``studies.generation.peers export``)."""
    parser.add_argument("--lxt-python", default=os.environ.get("NORMX_LXT_PYTHON"),
                        help="the Python of LXT's virtualenv (default: $NORMX_LXT_PYTHON)")
    parser.add_argument("--lxt-model", default=os.environ.get("NORMX_LXT_MODEL"),
                        help="the model folder exported for LXT (default: $NORMX_LXT_MODEL)")


def lxt_command(python: str | None, model: str | None, *args: str) -> list[str]:
    """The command line running :mod:`studies.parity.lxt_attnlrp` in LXT's virtualenv (from the repository root)."""
    if not python or not model or not Path(python).exists() or not Path(model).exists():
        raise SystemExit(f"LXT needs its Python ({python}) and the exported model ({model}): give --lxt-python and "
                         "--lxt-model (or NORMX_LXT_PYTHON / NORMX_LXT_MODEL); see studies/parity/lxt_attnlrp.py")
    return [python, "-m", "studies.parity.lxt_attnlrp", args[0], model, *args[1:]]


def version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed(name)
    except PackageNotFoundError:
        return None


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def provenance() -> dict:
    """The commit normx ran from, and the files under normx/ that differed from it (others edit the tree)."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else ""

    return {"commit": git("rev-parse", "HEAD").strip(),
            "uncommitted_normx_files": sorted(line[3:] for line in git("status", "--porcelain", "--", "normx")
                                              .splitlines())}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


class Printed:
    """A study's printed lines (a Markdown table), also written to ``--out`` at the end when one is given."""

    def __init__(self, out: Path | None):
        self.out, self.lines = out, []

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def save(self) -> None:
        if self.out is not None:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.out.write_text("\n".join(self.lines) + "\n")


def add_out_option(parser: argparse.ArgumentParser, what: str = "the printed table, also written to this file"
                   ) -> None:
    parser.add_argument("--out", type=Path, default=None, help=what)
