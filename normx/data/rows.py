"""Rows of a corpus, streamed: TSV, CSV, JSONL and Parquet files, or a Hugging Face hub dataset id (online).

:func:`iter_rows` yields ``(id, text, text_pair)`` one row at a time, ``id`` being the row's 0-based index in the
input, so memory does not grow with the corpus. Columns default to the usual names (``text``, ``sentence``,
``sentence1``, ``premise``, ``question`` for the text; ``text_pair``, ``sentence2``, ``hypothesis`` and, after
``question``, ``sentence`` for the pair): the GLUE files in the shared data folder work without options.
"""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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
_ERROR = "\0normx-error"  # the key of a record that could not be read (the value says why, with file:line)


def iter_rows(source: str | Path, text_column: str | None = None, pair_column: str | None = None,
              limit: int | None = None, errors: str = "raise") -> Iterator[Row]:
    """The rows of ``source`` (a file, or a hub dataset id as ``NAME[:CONFIG][@SPLIT]``), in order, at most
    ``limit``. ``pair_column=""`` reads single texts even where a pair column exists. A row that cannot be read
    (undecodable bytes, a malformed line, no text in the column) raises :class:`InvalidInputError` naming
    ``file:line``, or with ``errors="record"`` is yielded as a :class:`Row` with that message in ``error``."""
    if errors not in ERRORS:
        raise InvalidInputError(f"errors={errors!r} is not allowed; use one of {ERRORS}")
    records = _records(source)
    leading, first = [], None  # rows that could not be read before the first that can (it names the columns)
    for entry in records:
        if _ERROR not in entry[1]:
            first = entry
            break
        if errors == "raise":
            raise InvalidInputError(entry[1][_ERROR])
        leading.append(entry)
    if first is None:
        raise InvalidInputError(f"{source} has no rows" + (f" that can be read ({leading[0][1][_ERROR]})"
                                                           if leading else ""))
    text_column, pair_column = _columns(source, first[1], text_column, pair_column)
    count = 0
    for number, record in itertools.chain(leading, [first], records):
        if limit is not None and count >= limit:
            return
        problem = record.get(_ERROR)
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


def _records(source) -> Iterator[tuple[int, dict]]:
    """(line or row number for messages, record) pairs."""
    path = Path(str(source)).expanduser()
    if path.is_file():
        if path.suffix not in SUFFIXES:
            raise InvalidInputError(f"{path} has the suffix {path.suffix!r}; use one of {', '.join(SUFFIXES)}")
        return {".tsv": _delimited, ".csv": _delimited, ".jsonl": _jsonl, ".parquet": _parquet}[path.suffix](path)
    if path.suffix in SUFFIXES or str(source).startswith((".", "/", "~")):
        raise InvalidInputError(f"no data file at {path}")
    return _hub(str(source))


def _open(path: Path, newline: str | None = None):
    """The file as text; bytes that are not UTF-8 become lone surrogates (:func:`_undecodable` finds them), so
    that a bad byte is reported with its line instead of ending the read."""
    return open(path, encoding="utf-8", errors="surrogateescape", newline=newline)


def _undecodable(path: Path, number: int, *values) -> dict | None:
    """An error record if any of ``values`` holds bytes that were not UTF-8, else None."""
    for value in values:
        if isinstance(value, str):
            bad = next((i for i, ch in enumerate(value) if "\udc80" <= ch <= "\udcff"), None)
            if bad is not None:
                byte = ord(value[bad]) - 0xDC00
                return {_ERROR: f"{path}:{number}: not UTF-8 text (the byte 0x{byte:02x} at character {bad + 1})"}
    return None


def _delimited(path: Path) -> Iterator[tuple[int, dict]]:
    """TSV: GLUE style, no quoting, one row a line, fields of any length (extra fields before the named ones read
    from the end). CSV: quoted fields, up to the csv module's field limit (131,072 characters; a longer one is an
    error naming the line; the limit is process-wide state that normx leaves alone)."""
    with _open(path, newline="" if path.suffix == ".csv" else None) as handle:
        if path.suffix == ".tsv":
            header = next(handle, "").rstrip("\n").split("\t")
            if _undecodable(path, 1, *header):
                raise InvalidInputError(_undecodable(path, 1, *header)[_ERROR])
            for number, line in enumerate(handle, 2):
                row = line.rstrip("\n").split("\t")
                if row != [""]:
                    if len(row) > len(header):
                        row = row[:1] + row[len(row) - len(header) + 1:]
                    yield number, _undecodable(path, number, line) or dict(zip(header, row))
        else:
            reader = csv.DictReader(handle)
            try:
                for row in reader:
                    yield reader.line_num, _undecodable(path, reader.line_num, *row.values()) or row
            except csv.Error as exc:
                raise InvalidInputError(f"{path}:{reader.line_num}: not a CSV line ({exc})") from None


def _jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    with _open(path) as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                bad = _undecodable(path, number, line)
                if bad is not None:
                    yield number, bad
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    yield number, {_ERROR: f"{path}:{number}: not valid JSON ({exc})"}
                    continue
                yield number, record if isinstance(record, dict) else {
                    _ERROR: f"{path}:{number}: not a JSON object"}


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
