"""Examples to evaluate on: a GLUE task's dev split (:mod:`normx.data.glue`) or a user's TSV / JSONL file, and their
gold labels as the model's columns.

User data files: a TSV file with a header row (tab-separated, no quoting) or a JSONL file (one object per line) with
the fields ``text``, optionally ``text_pair`` (sentence-pair models) and ``label`` (a label name or class index of
the model, or a number for regression models). Either every example has a label or none has (then there is no
accuracy curve); errors name the file and line.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from normx.core.inputs import positive_int
from normx.core.labels import LabelSpace
from normx.data import glue
from normx.errors import InvalidInputError

DATA_SUFFIXES = (".tsv", ".jsonl")


def load_examples(source: str, data_dir: str | None = None, limit: int | None = None, split: str = "dev"
                  ) -> list[glue.Example]:
    """Examples from a GLUE task name (its ``split``, ``"dev"`` by default: :func:`normx.data.glue.load`; ``"train"``
    is the data the presets were trained on, e.g. to choose settings on data that is not reported) or a user TSV /
    JSONL file (see the module docstring); the first ``limit`` of them."""
    positive_int(limit, "limit", none=True)
    if source in glue.TASKS:
        examples = glue.load(source, split, data_dir)
    elif split != "dev":
        raise InvalidInputError(f"split={split!r} applies to a GLUE task ({', '.join(glue.TASKS)}), not to the data "
                                f"file {source!r}")
    else:
        examples = read_examples(source)
    return examples[:limit] if limit is not None else examples


def read_examples(path: str | Path) -> list[glue.Example]:
    file = Path(path).expanduser()
    if not file.is_file():
        raise InvalidInputError(f"--data {str(path)!r} is neither a task ({', '.join(glue.TASKS)}) nor an existing "
                                f"file ({' or '.join(DATA_SUFFIXES)})")
    if file.suffix not in DATA_SUFFIXES:
        raise InvalidInputError(f"data file {file} has the suffix {file.suffix!r}; use a TSV (.tsv, with a header "
                                "row) or JSONL (.jsonl) file with the fields text, text_pair (optional), label")
    rows = _rows(file)  # (line number, row)
    examples, unlabelled = [], []
    for number, row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise InvalidInputError(f"{file}:{number}: no `text` field (the fields are text, text_pair, label)")
        pair = row.get("text_pair") or None
        label = row.get("label")
        if label in (None, ""):
            label = None
            unlabelled.append(number)
        examples.append(glue.Example(row["text"], pair, label))
    if not examples:
        raise InvalidInputError(f"data file {file} has no examples")
    if unlabelled and len(unlabelled) < len(examples):  # a few missing labels would silently drop the accuracy
        raise InvalidInputError(f"{file}:{unlabelled[0]}: no label, but other examples have one"
                                + (f" ({len(unlabelled)} without: lines {', '.join(map(str, unlabelled[:5]))}"
                                   + (", ..." if len(unlabelled) > 5 else "") + ")" if len(unlabelled) > 1 else "")
                                + "; give every example a label, or none")
    return examples


def _rows(file: Path) -> list[tuple[int, object]]:
    """(line number, row) of a TSV (by header) or JSONL file; clear errors for files that are not UTF-8 text."""
    rows = []
    try:
        with open(file, encoding="utf-8", newline="") as handle:
            if file.suffix == ".tsv":
                reader = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
                try:
                    for row in reader:
                        rows.append((reader.line_num, row))
                except csv.Error as exc:
                    raise InvalidInputError(f"{file}:{reader.line_num + 1}: not a TSV line ({exc})") from None
            else:
                for number, line in enumerate(handle, 1):
                    if line.strip():
                        try:
                            rows.append((number, json.loads(line)))
                        except json.JSONDecodeError as exc:
                            raise InvalidInputError(f"{file}:{number} is not valid JSON: {exc}") from None
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{file} is not UTF-8 text (an undecodable byte at offset {exc.start}); give a "
                                "UTF-8 TSV or JSONL file") from None
    return rows


def gold_labels(examples: Sequence, labels: LabelSpace, task: str | None = None) -> np.ndarray | None:
    """Gold labels as model columns (classification) or floats (regression); None when any example has none.

    Integer labels of a GLUE task are mapped through the task's label names to the model's labels of the same
    name, so a model whose labels are ordered differently is still scored right.
    """
    raw = [getattr(e, "label", None) for e in examples]
    if any(value is None for value in raw):
        if labels.regression:
            raise InvalidInputError("a regression model is scored by the Pearson correlation with gold scores, but "
                                    "some examples have no label")
        return None
    if labels.regression:
        try:
            return np.array([float(v) for v in raw], dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"regression labels must be numbers: {exc}") from exc
    names = [name.lower() for name in labels.names]
    task_names = glue.LABELS.get(task) if task in glue.LABELS else None
    out = []
    for value in raw:
        if isinstance(value, str):
            text = value.strip()
            if text.lower() in names:
                out.append(names.index(text.lower()))
                continue
            if not text.lstrip("-").isdigit():
                raise InvalidInputError(f"label {value!r} is not a label of this model; its labels are "
                                        f"{labels.names} (or indices 0..{len(names) - 1})")
            value = int(text)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise InvalidInputError(f"label {value!r} is neither a label name nor a class index")
        if task_names is not None and 0 <= value < len(task_names) and task_names[value].lower() in names:
            out.append(names.index(task_names[value].lower()))
        elif 0 <= value < len(names):
            out.append(int(value))
        else:
            raise InvalidInputError(f"label {value} is out of range: the model has {len(names)} labels {labels.names}")
    return np.array(out, dtype=np.int64)
