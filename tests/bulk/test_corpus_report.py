"""The corpus report's summary (normx.bulk.report): over words, their sub-word pieces joined by the word boundaries
of normx.explanations.words, without punctuation-only words; and its example views show white-space tokens."""

from __future__ import annotations

import json
import re

import pytest
import tiny
from headless import page_at

import normx
from normx.bulk.report import WordSummary, report_words, write_report

pytest.importorskip("pyarrow.parquet", reason="normx attribute writes Parquet: pip install 'normx[attribute]'")


def test_report_words_join_pieces_and_leave_out_punctuation():
    text = "unflinchingly, good."
    record = {"text": text, "text_pair": None, "label": "positive",
              "tokens": ["[CLS]", "un", "##fl", "##in", "##ching", "##ly", ",", "good", ".", "[SEP]"],
              "offsets": [(0, 0), (0, 2), (2, 4), (4, 6), (6, 11), (11, 13), (13, 14), (15, 19), (19, 20), (0, 0)],
              "segments": [0] * 10, "special": [True] + [False] * 8 + [True],
              "scores": [9.0, 1.0, 2.0, 3.0, 4.0, 5.0, 100.0, 0.5, 50.0, 9.0]}
    assert list(report_words(record)) == [("unflinchingly", 15.0), ("good", 0.5)]
    summary = WordSummary()
    summary.add(record)
    summary.add({**record, "error": "the text is empty"})
    result = summary.result()
    assert (result.rows, result.skipped) == (2, 1)
    assert [s.unit for s in result.top("positive")] == ["unflinchingly", "good"]


def test_the_report_summarises_words_and_shows_white_space_tokens(tmp_path):
    model, tokenizer = tiny.build("GPT2ForSequenceClassification")  # byte-level BPE: words in several pieces
    texts = ["the film\nwas good, really.", "a dull, dull plot...", "good; fine!"]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    normx.attribute_dataset(model, tokenizer, data, tmp_path / "out", progress=False)
    index = write_report(tmp_path / "out", tmp_path / "report")
    page = index.read_text()
    summary = page[page.index("What the corpus says"):page.index("<h2 style=\"font-size:16px\">Examples")]
    cells = re.findall(r"<tr><td>([^<]*)</td>", summary)
    assert len(tokenizer.tokenize(" film")) > 1 and "film" in cells and "dull" in cells  # its pieces joined
    assert all(any(ch.isalnum() for ch in c) for c in cells)  # no ".", ",", "..."
    with page_at(index.as_uri()) as (playwright, view):
        first = view.locator("#examples tbody tr").first.locator("td.text")
        playwright.expect(first.locator(".u").first).to_be_visible()
        units = first.locator(".u").all_inner_texts()
        assert "⏎" in units and not any(u and u.isspace() for u in units)
