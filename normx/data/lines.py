"""Line-based corpus files read record by record, every line accounted for: TSV, CSV and JSONL.

Each reader yields ``(line number, record)`` pairs, the record a dict of column -> text, or an error record (its
:data:`ERROR` key says why, as ``file:line: what is wrong``) for a line that cannot be read: a blank line, bytes that
are not UTF-8, a TSV line whose tab-separated fields do not match the header (a tab inside a text), a CSV line that
does not parse (an unbalanced quote, text after a closing quote, fields that do not match the header), JSON that is
not an object, a line longer than :data:`MAX_CHARS`. So the ``k``-th line after a TSV / CSV header, or the ``k``-th
line of a JSONL file, is the ``k``-th record (a CSV record whose quoted field spans lines is one record).

A line ends at ``\\n`` (``\\r\\n`` too); a lone ``\\r`` is a character of the text. No field has a size limit of its
own: a line (a CSV record) may hold up to :data:`MAX_CHARS` characters, more than any model reads, so that one
hostile line cannot take the memory; the csv module (and its process-wide field limit) is not used.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from normx.errors import InvalidInputError

ERROR = "\0normx-error"  # the key of an error record (the value says why, with file:line)
MAX_CHARS = 2**24  # characters of one line (one CSV record): 16,777,216


def tsv(path: Path) -> Iterator[tuple[int, dict]]:
    """GLUE style: no quoting, a header line, one row a line with as many tab-separated fields as the header."""
    with _open(path) as handle:
        lines = _lines(handle)
        header = _header(path, next(lines, (1, "")), "\t")
        for number, line in lines:
            if line is None or not line.strip("\r\n"):
                yield number, _problem(path, number, line)
                continue
            text = _strip(line)
            bad = _undecodable(path, number, text)
            fields = text.split("\t")
            if bad is None and len(fields) != len(header):
                bad = _error(path, number, f"{_count(len(fields), 'tab-separated field')} where the header has "
                             f"{len(header)}"
                             + (" (a tab inside a text?)" if len(fields) > len(header) else ""))
            yield number, bad or dict(zip(header, fields))


def csv(path: Path) -> Iterator[tuple[int, dict]]:
    """RFC 4180 CSV: a header record, fields separated by ``,``, quoted with ``"`` (``""`` inside for one quote, line
    ends allowed inside). A record that does not parse or has not as many fields as the header is an error record
    for its first line, and its other lines are read again as records of their own, so that an unbalanced quote costs
    its own line only."""
    with _open(path) as handle:
        lines = _Pushback(_lines(handle))
        first = next(lines, (1, ""))
        if first[1] is None or not first[1].strip("\r\n"):
            raise InvalidInputError(f"{path}:1: the header line is " + ("too long" if first[1] is None else "empty"))
        header, problem, _ = _csv_record(path, lines, first)
        if problem is not None:
            raise InvalidInputError(f"{problem} (the header)")
        if _undecodable(path, 1, *header):
            raise InvalidInputError(_undecodable(path, 1, *header)[ERROR])
        for number, line in lines:
            if line is None or not line.strip("\r\n"):
                yield number, _problem(path, number, line)
                continue
            fields, problem, taken = _csv_record(path, lines, (number, line))
            if problem is None and len(fields) != len(header):
                problem = f"{path}:{number}: {_count(len(fields), 'field')} where the header has {len(header)}" + (
                    f" (a quoted field runs on to line {taken[-1][0]}: an unbalanced quote?)" if len(taken) > 1
                    else "")
            if problem is not None:
                lines.push(taken[1:])  # the lines it took are read again, each as a record of its own
                yield number, {ERROR: problem}
                continue
            yield number, _undecodable(path, number, *fields) or dict(zip(header, fields))


def jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """One JSON object a line."""
    with _open(path) as handle:
        for number, line in _lines(handle):
            if line is None or not line.strip():
                yield number, _problem(path, number, line)
                continue
            bad = _undecodable(path, number, line)
            if bad is not None:
                yield number, bad
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                yield number, _error(path, number, f"not valid JSON ({exc})")
                continue
            yield number, record if isinstance(record, dict) else _error(path, number, "not a JSON object")


# ---- lines -----------------------------------------------------------------------------------------------------------

def _open(path: Path):
    """The file as text, lines split at ``\\n`` only; bytes that are not UTF-8 become lone surrogates
    (:func:`_undecodable` finds them), so that a bad byte is reported with its line instead of ending the read."""
    return open(path, encoding="utf-8", errors="surrogateescape", newline="\n")


def _lines(handle) -> Iterator[tuple[int, str | None]]:
    """(line number from 1, the line with its end) for each line; None for a line of more than :data:`MAX_CHARS`
    characters, which is read past, not kept."""
    number = 0
    while True:
        line = handle.readline(MAX_CHARS + 1)
        if not line:
            return
        number += 1
        if len(_strip(line)) > MAX_CHARS:
            while not line.endswith("\n"):
                line = handle.readline(1 << 20)
                if not line:
                    break
            yield number, None
            continue
        yield number, line


def _strip(line: str) -> str:
    """The line without its end (``\\n`` or ``\\r\\n``)."""
    if line.endswith("\n"):
        line = line[:-2] if line.endswith("\r\n") else line[:-1]
    return line


def _header(path: Path, first: tuple[int, str | None], separator: str) -> list[str]:
    number, line = first
    if line is None or not line.strip("\r\n"):
        raise InvalidInputError(f"{path}:1: the header line is " + ("too long" if line is None else "empty"))
    text = _strip(line)
    if _undecodable(path, number, text):
        raise InvalidInputError(_undecodable(path, number, text)[ERROR])
    return text.split(separator)


def _problem(path: Path, number: int, line: str | None) -> dict:
    """The error record of a blank or over-long line."""
    if line is None:
        return _error(path, number, f"a line of more than {MAX_CHARS:,} characters (the most a line may hold)")
    return _error(path, number, "a blank line")


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _error(path: Path, number: int, what: str) -> dict:
    return {ERROR: f"{path}:{number}: {what}"}


def _undecodable(path: Path, number: int, *values) -> dict | None:
    """An error record if any of ``values`` holds bytes that were not UTF-8 (read as lone surrogates), else None."""
    for value in values:
        if isinstance(value, str):
            bad = next((i for i, ch in enumerate(value) if "\udc80" <= ch <= "\udcff"), None)
            if bad is not None:
                byte = ord(value[bad]) - 0xDC00
                return _error(path, number, f"not UTF-8 text (the byte 0x{byte:02x} at character {bad + 1})")
    return None


# ---- CSV records -----------------------------------------------------------------------------------------------------

class _Pushback:
    """An iterator of (number, line) that takes lines back, to read them again."""

    def __init__(self, items: Iterator):
        self._items, self._back = items, []

    def __iter__(self):
        return self

    def __next__(self):
        return self._back.pop() if self._back else next(self._items)

    def push(self, items: list) -> None:
        self._back.extend(reversed(items))


def _csv_record(path: Path, lines: _Pushback, first: tuple[int, str]) -> tuple[list[str], str | None, list]:
    """One CSV record from its first line on: (fields, None, the lines it took), or (fields so far, why it does not
    parse, the lines it took)."""
    taken = [first]
    number, line = first
    fields: list[str] = []
    parts: list[str] = []  # the quoted field being read
    pos, size, quoted = 0, len(line), False
    while True:
        if quoted:
            close = line.find('"', pos)
            if close < 0:  # the field goes on on the next line
                parts.append(line[pos:])
                following = next(lines, None)
                if following is None:
                    return fields, f"{path}:{first[0]}: a quote opened on this line is never closed", taken
                taken.append(following)
                number, line = following
                size += 0 if line is None else len(line)
                if line is None or size > MAX_CHARS:
                    return fields, (f"{path}:{first[0]}: a quoted field of more than {MAX_CHARS:,} characters from "
                                    "this line on (an unbalanced quote?)"), taken
                pos = 0
                continue
            if line.startswith('"', close + 1):  # "" inside a quoted field: one quote
                parts.append(line[pos:close + 1])
                pos = close + 2
                continue
            parts.append(line[pos:close])
            fields.append("".join(parts))
            parts, quoted, pos = [], False, close + 1
            rest = _strip(line[pos:])
            if not rest:
                return fields, None, taken
            if rest[0] != ",":
                where = "" if number == first[0] else f", a quoted field from this line closed on line {number}"
                return fields, (f"{path}:{first[0]}: text after the closing quote of field {len(fields)} "
                                f"({rest[:20]!r}{where}): an unbalanced or unescaped quote?"), taken
            pos += 1
        elif line.startswith('"', pos):
            quoted, pos = True, pos + 1
        else:
            end = len(_strip(line))
            comma = line.find(",", pos, end)
            if comma < 0:
                fields.append(line[pos:end])
                return fields, None, taken
            fields.append(line[pos:comma])
            pos = comma + 1
