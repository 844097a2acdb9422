"""GLUE task data (SST-2, STS-B, MNLI, QNLI) from plain files, or from the Hugging Face hub when online.

The data folder comes from an argument or the ``NORMX_DATA`` environment variable; it holds ``sst2/``,
``stsb/``, ``mnli/``, ``qnli/`` as described in the project's data README. With neither set, the sets are
loaded from the hub's GLUE copies through the optional ``datasets`` package (needs network).

MNLI and QNLI have only their validation splits offline. Their ``"train"`` split here is a fixed, seeded part
of the validation split (``HELD_IN`` of it) and ``"dev"`` is the disjoint rest, so a model trained on one is
reported on data it never saw.
"""

from __future__ import annotations

import csv
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from normx.errors import InvalidInputError, ModelLoadError

ENV = "NORMX_DATA"
TASKS = ("sst2", "stsb", "mnli", "qnli")
SPLITS = ("train", "dev")
LABELS = {
    "sst2": ["negative", "positive"],
    "stsb": ["score"],
    "mnli": ["entailment", "neutral", "contradiction"],
    "qnli": ["entailment", "not_entailment"],
}
HELD_IN = 0.7  # MNLI / QNLI: the part of the validation split used for training
SPLIT_SEED = 0


@dataclass(frozen=True)
class Example:
    text: str
    pair: str | None
    label: int | float


def data_dir(path: str | os.PathLike | None = None) -> Path | None:
    """The data folder: ``path``, else ``$NORMX_DATA``, else None (use the hub)."""
    chosen = path if path is not None else os.environ.get(ENV)
    if chosen is None:
        return None
    folder = Path(chosen).expanduser()
    if not folder.is_dir():
        raise InvalidInputError(f"data folder {folder} does not exist (from {'the argument' if path else ENV})")
    return folder


def load(task: str, split: str, path: str | os.PathLike | None = None) -> list[Example]:
    """Examples of ``task`` (one of TASKS) and ``split`` (``"train"`` or ``"dev"``)."""
    if task not in TASKS:
        raise InvalidInputError(f"unknown task {task!r}; known tasks: {', '.join(TASKS)}")
    if split not in SPLITS:
        raise InvalidInputError(f"unknown split {split!r}; use one of {SPLITS}")
    folder = data_dir(path)
    if folder is None:
        return _from_hub(task, split)
    if task in ("mnli", "qnli"):
        return held_out_split(_read(task, folder), split)
    return _read(task, folder, split)


def _read(task: str, folder: Path, split: str = "dev") -> list[Example]:
    labels = LABELS[task]
    if task == "sst2":
        rows = _tsv(folder / "sst2" / f"{split}.tsv")
        return [Example(r["sentence"].strip(), None, int(r["label"])) for r in rows]
    if task == "stsb":
        rows = _tsv(folder / "stsb" / f"{split}.tsv")
        return [Example(r["sentence1"], r["sentence2"], float(r["score"])) for r in rows]
    if task == "qnli":
        rows = _tsv(folder / "qnli" / "dev.tsv")
        return [Example(r["question"], r["sentence"], labels.index(r["label"])) for r in rows]
    with open(_exists(folder / "mnli" / "dev_matched.jsonl"), encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [Example(r["premise"], r["hypothesis"], labels.index(r["label"])) for r in rows]


def _tsv(file: Path) -> list[dict[str, str]]:
    """GLUE TSV rows by header name; rows with extra fields before the named ones are read from the end."""
    with open(_exists(file), encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader)
        rows = []
        for row in reader:
            if not row:
                continue
            if len(row) > len(header):  # keep the last len(header) - 1 fields aligned with the header's tail
                row = row[:1] + row[len(row) - len(header) + 1:]
            rows.append(dict(zip(header, row)))
    return rows


def _exists(file: Path) -> Path:
    if not file.is_file():
        raise InvalidInputError(f"expected data file {file} is missing")
    return file


def held_out_split(examples: list, split: str) -> list:
    """The seeded ``"train"`` part (``HELD_IN``) of ``examples`` or the disjoint ``"dev"`` rest, in file order."""
    if split not in SPLITS:
        raise InvalidInputError(f"unknown split {split!r}; use one of {SPLITS}")
    order = list(range(len(examples)))
    random.Random(SPLIT_SEED).shuffle(order)
    cut = int(len(order) * HELD_IN)
    chosen = sorted(order[:cut]) if split == "train" else sorted(order[cut:])
    return [examples[i] for i in chosen]


def _from_hub(task: str, split: str) -> list[Example]:
    try:
        import datasets
    except ImportError as exc:
        raise ModelLoadError(
            f"no data folder given: pass one or set {ENV} (e.g. to ../shared/data), or install `datasets` to read "
            "GLUE from the Hugging Face hub (needs network)") from exc
    hub_split = "validation_matched" if task == "mnli" else "validation"
    rows = datasets.load_dataset("nyu-mll/glue", task, split=hub_split if split == "dev" or task in ("mnli", "qnli")
                                 else "train")
    keys = {"sst2": ("sentence", None), "stsb": ("sentence1", "sentence2"), "mnli": ("premise", "hypothesis"),
            "qnli": ("question", "sentence")}[task]
    examples = [Example(r[keys[0]], None if keys[1] is None else r[keys[1]], r["label"]) for r in rows]
    return held_out_split(examples, split) if task in ("mnli", "qnli") else examples
