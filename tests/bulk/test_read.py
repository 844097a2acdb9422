"""A folder written by normx attribute, read back: load_attributions gives each row's Explanation (equal to explain
on it, to its from_dict and its HTML view), the corpus summary equals a direct pandas computation over the shards,
and `normx show` writes a report whose examples and summary a browser shows."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import tiny
from headless import page_at

import normx
from normx.bulk.read import corpus_summary, load_attributions, units_of
from normx.cli.main import main

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow.parquet", reason="normx attribute writes Parquet: pip install 'normx[attribute]'")

TEXTS = ["a gripping film", "the plot was dull", "", "a gripping story and a dull plot", "not bad at all",
         "the music is good", "dull dull dull", "a film"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    model, tok = tiny.build("BertForSequenceClassification")
    path = tmp_path_factory.mktemp("corpus")
    data = path / "data.tsv"
    data.write_text("sentence\tlabel\n" + "\n".join(f"{t}\t1" for t in TEXTS) + "\n")
    normx.attribute_dataset(model, tok, data, path / "out", shard_size=3, progress=False)
    return path / "out", model, tok


def test_load_attributions_gives_each_rows_explanation(folder):
    out, model, tok = folder
    loaded = list(load_attributions(out))
    assert [e.text for e in loaded] == [t for t in TEXTS if t]  # the empty row is skipped
    for e in loaded:
        want = normx.explain(model, tok, e.text)
        assert (e.tokens, e.prediction, e.labels, e.special, e.pooled) == (want.tokens, want.prediction, want.labels,
                                                                           want.special, want.pooled)
        np.testing.assert_allclose(e.scores, want.scores, rtol=1e-5, atol=1e-6)
        assert normx.Explanation.from_dict(e.to_dict()) == e
        assert normx.Explanation.from_dict(e.to_dict()).to_html() == e.to_html()
        assert e.probabilities == pytest.approx(want.probabilities) and e.method == "normxlogit"
    with pytest.raises(normx.InvalidInputError, match="row 2 could not be explained"):
        list(load_attributions(out, errors="raise"))


@pytest.mark.parametrize("unit", ["token", "word"])
def test_the_summary_equals_pandas_over_the_shards(folder, unit):
    out, _, _ = folder
    summary = corpus_summary(out, unit)
    frame = pd.read_parquet(out)
    assert summary.rows == len(TEXTS) and summary.skipped == 1
    frame = frame[frame["error"].isna()]
    rows = []
    for record in frame.to_dict("records"):
        record = {k: (list(v) if hasattr(v, "tolist") else v) for k, v in record.items()}
        record["offsets"] = [list(o) for o in record["offsets"]]
        rows += [(str(record["label"]), name, value) for name, value in units_of(record, unit)]
    units = pd.DataFrame(rows, columns=["label", "unit", "score"])
    want = units.groupby(["label", "unit"])["score"].agg(["sum", "count"])
    got = {(label, s.unit): (s.total, s.count) for label in summary.labels for s in summary.stats[label].values()}
    assert set(got) == set(want.index)
    for key, (total, count) in got.items():
        assert total == pytest.approx(want.loc[key, "sum"], abs=1e-9) and count == want.loc[key, "count"]
    if unit == "word":
        assert not any(u.startswith("[") for label in summary.labels for u in summary.stats[label])  # no specials
        assert "dull" in {u for label in summary.labels for u in summary.stats[label]}
        top = summary.top(summary.labels[0], 3)
        assert [s.total for s in top] == sorted((s.total for s in summary.stats[summary.labels[0]].values()),
                                                reverse=True)[:3]


def test_normx_show_writes_a_report_a_browser_shows(folder, tmp_path, capsys):
    out, _, _ = folder
    assert main(["show", str(out), "--out", str(tmp_path / "report"), "--top", "5", "--min-count", "2"]) == 0
    index = Path(capsys.readouterr().out.strip())
    assert index == tmp_path / "report" / "index.html"
    page = index.read_text()
    assert "What the corpus says" in page and "words, largest total" in page and "words, largest mean" in page
    assert "tokens, largest" not in page  # the summary is over words (sub-word pieces joined)
    assert sorted(p.name for p in index.parent.glob("rows-*.js")) == ["rows-00000.js"]
    assert main(["show", str(out)]) == 0  # default: inside the folder, where Parquet readers do not look
    assert (out / "_report" / "index.html").is_file() and len(pd.read_parquet(out)) == len(TEXTS)
    capsys.readouterr()
    with page_at(index.as_uri()) as (playwright, view):
        rows = view.locator("#examples tbody tr")
        playwright.expect(rows).to_have_count(len(TEXTS))
        playwright.expect(view.locator("#examples .u").first).to_be_visible()  # highlighted spans drawn
        assert "empty" in rows.nth(2).inner_text()  # the bad row shows its reason
        def lengths():
            return [int(rows.nth(i).locator("td").nth(3).inner_text()) for i in range(len(TEXTS))]

        view.locator("th.sort[data-key='3']").click()  # by length: longest first, then shortest first
        assert lengths() == sorted(lengths(), reverse=True)
        view.locator("th.sort[data-key='3']").click()
        assert lengths() == sorted(lengths())
        shot = tmp_path / "report.png"
        view.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000


def test_show_of_a_folder_without_shards_is_an_error(tmp_path, capsys):
    assert main(["show", str(tmp_path)]) == 2
    assert "no shard-*.parquet files" in capsys.readouterr().err


def test_a_run_of_every_label_is_summarised_at_the_predicted_one(tmp_path):
    model, tok = tiny.build("BertForSequenceClassification")
    data = tmp_path / "data.tsv"
    data.write_text("sentence\tlabel\n" + "\n".join(f"{t}\t1" for t in TEXTS if t) + "\n")
    normx.attribute_dataset(model, tok, data, tmp_path / "out", target="all", progress=False)
    summary = corpus_summary(tmp_path / "out")
    want = {}
    for text in (t for t in TEXTS if t):
        e = normx.explain(model, tok, text)  # the predicted label's scores
        for token, score, special in zip(e.tokens, e.score, e.special):
            if not special:
                total, count = want.get((e.prediction, token), (0.0, 0))
                want[e.prediction, token] = (total + float(score), count + 1)
    got = {(label, s.unit): (s.total, s.count) for label in summary.labels for s in summary.stats[label].values()}
    assert set(got) == set(want)
    for key, (total, count) in want.items():
        assert got[key][0] == pytest.approx(total, rel=1e-5, abs=1e-5) and got[key][1] == count


@pytest.mark.slow
def test_the_sst2_dev_report_reaches_all_872_examples(tmp_path):
    from locations import SHARED

    data = Path(SHARED) / "sst2" / "dev.tsv"
    if not data.is_file():
        pytest.skip("the shared data folder is not here")
    chromium = Path(os.environ.get("NORMX_CHROMIUM", "/usr/bin/chromium"))
    playwright = pytest.importorskip("playwright.sync_api")
    if not chromium.is_file():
        pytest.skip("no Chromium")
    model, tok = normx.load_model("minilm-sst2")
    normx.attribute_dataset(model, tok, data, tmp_path / "sst2", progress=False)
    from normx.bulk.report import write_report

    index = write_report(tmp_path / "sst2")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=["--headless", "--no-sandbox"])
        try:
            view = browser.new_page()
            view.goto(index.as_uri())
            playwright.expect(view.locator("#pager")).to_contain_text("page 1 of 18 (872 examples)")
            assert "negative: words, largest mean" in view.inner_text("body")
            view.get_by_role("button", name="last").click()
            rows = view.locator("#examples tbody tr")
            playwright.expect(rows).to_have_count(872 - 17 * 50)
            playwright.expect(rows.last.locator(".u").first).to_be_visible()  # drawn from the last chunk
            assert rows.last.locator("td").first.inner_text() == "871"
        finally:
            browser.close()
