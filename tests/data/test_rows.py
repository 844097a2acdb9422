"""Corpus files read row by row (normx.data.rows / normx.data.lines): every line of a TSV, CSV or JSONL file is a row,
so row ids follow the file's lines; blank and malformed lines are rows with an error naming file:line; no field size
limit below the line limit; a malformed CSV record costs its own line only."""

from __future__ import annotations

import csv
import io
import os

import pytest

from normx.data import lines
from normx.data.rows import fingerprint, iter_rows
from normx.errors import InvalidInputError


def rows(path, **kwargs) -> list[tuple]:
    return [(r.id, r.text, r.error) for r in iter_rows(path, errors="record", **kwargs)]


@pytest.mark.parametrize("suffix", [".tsv", ".csv", ".jsonl"])
def test_blank_lines_are_rows_and_ids_follow_the_lines(tmp_path, suffix):
    texts = ["a good film", "", "a dull plot", "", "", "the end"]
    path = tmp_path / f"data{suffix}"
    if suffix == ".jsonl":
        body = "\n".join(f'{{"text": "{t}"}}' if t else "" for t in texts) + "\n"
        first = 1  # the line of row 0
    else:
        sep = "\t" if suffix == ".tsv" else ","
        body = f"text{sep}label\n" + "\n".join(f"{t}{sep}1" if t else "" for t in texts) + "\n"
        first = 2
    path.write_text(body)
    got = rows(path)
    assert [i for i, _, _ in got] == list(range(len(texts)))
    for (i, text, error), want in zip(got, texts):
        if want:
            assert (text, error) == (want, None)
        else:
            assert error == f"{path}:{i + first}: a blank line"
    with pytest.raises(InvalidInputError, match=rf"{path.name}:{1 + first}: a blank line"):
        list(iter_rows(path))


def test_a_tab_inside_a_tsv_text_is_an_error_not_a_cut(tmp_path):
    path = tmp_path / "data.tsv"
    path.write_text("sentence\tlabel\nfine\t1\nhalf one\thalf two\t0\nshort\nlast\t1\n")
    assert rows(path) == [
        (0, "fine", None),
        (1, "", f"{path}:3: 3 tab-separated fields where the header has 2 (a tab inside a text?)"),
        (2, "", f"{path}:4: 1 tab-separated field where the header has 2"),
        (3, "last", None)]


def test_an_unbalanced_csv_quote_costs_its_own_line_only(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text('text,label\n"fine, quoted",1\n"unbalanced,1\nswallowed before,0\n"ok ""quoted"" word",1\n'
                    '"closed" then text,0\n"multi\nline",1\n"never closed,1\nafter it,0\n')
    got = rows(path)
    assert [(i, t) for i, t, e in got if e is None] == [
        (0, "fine, quoted"), (2, "swallowed before"), (3, 'ok "quoted" word'), (5, "multi\nline"), (7, "after it")]
    errors = {i: e for i, _, e in got if e is not None}
    assert errors[1].startswith(f"{path}:3: text after the closing quote of field 1") and "closed on line 5" in \
        errors[1] and "unbalanced" in errors[1]
    assert errors[4].startswith(f"{path}:6: text after the closing quote of field 1 (' then text,0')")
    assert errors[6] == f"{path}:9: a quote opened on this line is never closed"
    assert len(got) == 8


def test_csv_fields_read_as_the_csv_module_reads_good_files(tmp_path):
    """On well-formed CSV (quotes, doubled quotes, commas and line ends inside quotes, empty fields, CRLF) the rows are
    the csv module's."""
    records = [["a, b", 'say "hi"', ""], ["multi\nline", "x", "y"], ["", "", "z"], ["plain", "1", "2"]]
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\r\n").writerows([["text", "b", "c"], *records])
    path = tmp_path / "data.csv"
    path.write_bytes(buffer.getvalue().encode())
    assert [dict(r) for _, r in lines.csv(path)] == list(csv.DictReader(io.StringIO(buffer.getvalue(), newline="")))


def test_a_200000_character_csv_field_is_a_row(tmp_path):
    path = tmp_path / "long.csv"
    long = "word " * 40_000
    path.write_text(f'text,label\nfirst,1\n"{long}",0\n{long[:30]},1\nlast,1\n')
    got = rows(path)
    assert [(i, len(t), e) for i, t, e in got] == [(0, 5, None), (1, 200_000, None), (2, 30, None), (3, 4, None)]


def test_a_line_longer_than_the_limit_is_an_error_row_and_the_next_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(lines, "MAX_CHARS", 1000)
    tsv, csv_file, jsonl = tmp_path / "a.tsv", tmp_path / "a.csv", tmp_path / "a.jsonl"
    tsv.write_text("text\tlabel\n" + "x" * 5000 + "\t1\nnext\t0\n")
    csv_file.write_text('text,label\n"open\n' + ("y" * 600 + ",1\n") * 3 + 'last",1\n')
    jsonl.write_text('{"text": "' + "z" * 5000 + '"}\n{"text": "next"}\n')
    too_long = "a line of more than 1,000 characters (the most a line may hold)"
    assert rows(tsv) == [(0, "", f"{tsv}:2: {too_long}"), (1, "next", None)]
    assert rows(jsonl) == [(0, "", f"{jsonl}:1: {too_long}"), (1, "next", None)]
    got = rows(csv_file)  # the quoted field passes the limit: its first line fails, the others are rows again
    assert got[0][2] == f"{csv_file}:2: a quoted field of more than 1,000 characters from this line on (an " \
        "unbalanced quote?)"
    assert [t for _, t, e in got if e is None] == ["y" * 600] * 3 + ['last"'] and len(got) == 5


def test_the_fingerprint_is_the_content_not_the_path(tmp_path, monkeypatch):
    path = tmp_path / "data.tsv"
    path.write_text("text\tlabel\na\t1\n")
    monkeypatch.chdir(tmp_path)
    first = fingerprint(path)
    assert first == fingerprint("./data.tsv") == fingerprint("data.tsv")
    assert first["bytes"] == 15 and len(first["sha256"]) == 64
    path.write_text("text\tlabel\nb\t1\n")  # same size, other content, maybe within the same clock tick
    assert fingerprint(path)["sha256"] != first["sha256"]
    old = path.stat().st_mtime - 60  # a file that has settled is read once per process
    os.utime(path, (old, old))
    settled = fingerprint(path)
    with open(path, "r+b") as handle:  # changed in place, its time put back: the cached reading is kept
        handle.write(b"T")
    os.utime(path, (old, old))
    assert fingerprint(path) == settled
    assert fingerprint("someone/corpus") is None  # a hub id
