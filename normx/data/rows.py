"""Rows of a corpus, streamed: TSV, CSV, JSONL and Parquet files, or a Hugging Face hub dataset id (online).

:func:`iter_rows` yields ``(id, text, text_pair)`` one row at a time, ``id`` being the row's 0-based index in the
input, so memory does not grow with the corpus. Every line of a TSV, CSV or JSONL file is a row (blank and malformed
lines too, as rows with an error: :mod:`~normx.data.lines`), so row ``k`` is the ``k``-th line after a TSV / CSV
header (line ``k + 2``) and line ``k + 1`` of a JSONL file. :func:`fingerprint` identifies a file's content.

Columns default to the usual names (``text``, ``sentence``, ``sentence1``, ``premise``, ``question`` for the text;
``text_pair``, ``sentence2``, ``hypothesis`` and, after ``question``, ``sentence`` for the pair): the GLUE files in
the shared data folder work without options.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from normx.data import lines
from normx.data.lines import ERROR
from normx.errors import InvalidInputError, ModelLoadError

SUFFIXES = (".tsv", ".csv", ".jsonl", ".parquet")
TEXT_COLUMNS = ("text", "sentence", "sentence1", "premise", "question")
PAIR_COLUMNS = {"text": "text_pair", "sentence1": "sentence2", "premise": "hypothesis", "question": "sentence"}


@dataclass(frozen=True)
class Row:
    id: int
    text: str
    text_pair: str | None
    error: str | None = None  # why the row could not be read (``iter_rows(errors="record")``); its text is ""


ERRORS = ("raise", "record")


def iter_rows(source: str | Path, text_column: str | None = None, pair_column: str | None = None,
              limit: int | None = None, errors: str = "raise") -> Iterator[Row]:
    """The rows of ``source`` (a file, or a hub dataset id as ``NAME[:CONFIG][@SPLIT]``), in order, at most
    ``limit``. ``pair_column=""`` reads single texts even where a pair column exists. A row that cannot be read
    (a blank line, undecodable bytes, a malformed line, no text in the column) raises :class:`InvalidInputError` naming
    ``file:line``, or with ``errors="record"`` is yielded as a :class:`Row` with that message in ``error``."""
    if errors not in ERRORS:
        raise InvalidInputError(f"errors={errors!r} is not allowed; use one of {ERRORS}")
    records = _records(source)
    leading, first = [], None  # rows that could not be read before the first that can (it names the columns)
    for entry in records:
        if ERROR not in entry[1]:
            first = entry
            break
        if errors == "raise":
            raise InvalidInputError(entry[1][ERROR])
        leading.append(entry)
    if first is None:
        raise InvalidInputError(f"{source} has no rows" + (f" that can be read ({leading[0][1][ERROR]})"
                                                           if leading else ""))
    text_column, pair_column = _columns(source, first[1], text_column, pair_column)
    count = 0
    for number, record in itertools.chain(leading, [first], records):
        if limit is not None and count >= limit:
            return
        problem = record.get(ERROR)
        text = record.get(text_column)
        pair = record.get(pair_column) if pair_column else None
        if problem is None and not isinstance(text, str):
            problem = f"{source}:{number}: no text in column {text_column!r}"
        elif problem is None and pair_column and not isinstance(pair, str):
            problem = f"{source}:{number}: no text in the pair column {pair_column!r}"
        if problem is not None:
            if errors == "raise":
                raise InvalidInputError(problem)
            yield Row(count, "", None, problem)
        else:
            yield Row(count, text, pair)
        count += 1


def _columns(source, record: dict, text_column: str | None, pair_column: str | None) -> tuple[str, str | None]:
    names = list(record)
    if text_column is None:  # a known pair first: QNLI has both question and sentence
        text_column = next((t for t, p in PAIR_COLUMNS.items() if t in record and p in record), None)
    if text_column is None:
        text_column = next((c for c in TEXT_COLUMNS if c in record), None)
        if text_column is None:
            raise InvalidInputError(f"{source}: no text column found among {names}; name it with text_column= "
                                    f"(CLI: --text-column); looked for {', '.join(TEXT_COLUMNS)}")
    elif text_column not in record:
        raise InvalidInputError(f"{source}: no column {text_column!r}; the columns are {names}")
    if pair_column is None:
        guess = PAIR_COLUMNS.get(text_column)
        pair_column = guess if guess in record else None
    elif pair_column == "":
        pair_column = None
    elif pair_column not in record:
        raise InvalidInputError(f"{source}: no pair column {pair_column!r}; the columns are {names}")
    return text_column, pair_column


_FINGERPRINTS: dict[tuple, dict] = {}  # (path, size, mtime, inode, device) -> fingerprint, for this process
_SETTLED = 2.0


def fingerprint(source) -> dict | None:
    """The content of the data file ``source``: ``{"bytes": size, "sha256": hex digest}``; None for a hub dataset id,
    whose content is not checked. A file last changed more than :data:`_SETTLED` seconds before it was read is read
    once per process while its size, time and inode stay (a file changed within a clock tick of its read could
    keep its time: it is read again)."""
    path = Path(str(source)).expanduser()
    if not path.is_file():
        return None
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_dev)
    if key in _FINGERPRINTS:
        return dict(_FINGERPRINTS[key])
    started = time.time()
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    found = {"bytes": stat.st_size, "sha256": digest.hexdigest()}
    if started - stat.st_mtime_ns / 1e9 > _SETTLED:
        _FINGERPRINTS.clear()
        _FINGERPRINTS[key] = found
    return dict(found)


def check_source(source) -> None:
    """Raise :class:`InvalidInputError` for a ``source`` that is neither a data file normx reads nor a hub dataset id
    (no file at a path, another suffix); reads nothing."""
    _records(source).close()


def _records(source) -> Iterator[tuple[int, dict]]:
    """(line or row number for messages, record) pairs."""
    path = Path(str(source)).expanduser()
    if path.is_file():
        if path.suffix not in SUFFIXES:
            raise InvalidInputError(f"{path} has the suffix {path.suffix!r}; use one of {', '.join(SUFFIXES)}")
        return {".tsv": lines.tsv, ".csv": lines.csv, ".jsonl": lines.jsonl, ".parquet": _parquet}[path.suffix](path)
    if path.suffix in SUFFIXES or str(source).startswith((".", "/", "~")):
        raise InvalidInputError(f"no data file at {path}")
    return _hub(str(source))


def _parquet(path: Path) -> Iterator[tuple[int, dict]]:
    parquet = _pyarrow_parquet()
    number = 0
    for batch in parquet.ParquetFile(path).iter_batches(batch_size=1024):
        for record in batch.to_pylist():
            number += 1
            yield number, record


def _hub(source: str) -> Iterator[tuple[int, dict]]:
    try:
        import datasets
    except ImportError:
        raise ModelLoadError(f"{source!r} is not a file; reading a hub dataset needs `datasets` "
                             "(pip install 'normx[hub]') and network access") from None
    name, _, split = source.partition("@")
    name, _, config = name.partition(":")
    rows = datasets.load_dataset(name, config or None, split=split or "train", streaming=True)
    for number, record in enumerate(rows, 1):
        yield number, dict(record)


def _pyarrow_parquet():
    try:
        import pyarrow.parquet as parquet
    except ImportError:
        raise ModelLoadError("Parquet needs pyarrow: pip install 'normx[attribute]'") from None
    return parquet
