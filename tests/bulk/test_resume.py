"""Corpus runs over awkward files and resumed runs: a 200,000-character CSV field is a row explained to the model's
limit with its warning (naming the row), every line of the file gets a row, a resume against changed data is refused
naming the difference while the same file under another spelling goes on, a trial run's limit grows into the full
run keeping its rows, and the command line refuses an incompatible resume before it loads the model."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import tiny

import normx
from normx.cli.main import main
from normx.errors import InputWarning, InvalidInputError

pq = pytest.importorskip("pyarrow.parquet", reason="normx attribute writes Parquet: pip install 'normx[attribute]'")

TEXTS = ["a gripping film", "the plot was dull", "not bad at all", "the music is good", "dull dull dull", "a film",
         "a good story", "the end was fine", "bad acting", "good acting", "a long dull film", "the best film"]


@pytest.fixture(scope="module")
def model():
    return tiny.build("BertForSequenceClassification")


def read(folder: Path) -> list[dict]:
    return [row for f in sorted(folder.glob("shard-*.parquet")) for row in pq.read_table(f).to_pylist()]


def write_tsv(path: Path, texts: list[str]) -> Path:
    path.write_text("sentence\tlabel\n" + "".join(f"{t}\t1\n" for t in texts))
    return path


def settings(folder: Path) -> dict:
    return json.loads((folder / "_manifest.json").read_text())


def test_a_200000_character_csv_field_is_explained_to_the_models_limit(model, tmp_path):
    data = tmp_path / "long.csv"
    long = "a gripping film " * 12_500  # 200,000 characters
    data.write_text(f'text,label\nfirst film,1\n"{long}",0\na dull plot,1\n')
    with pytest.warns(InputWarning, match=r"^row 1 has \d+ tokens, more than the model's 64: truncated to 64"):
        run = normx.attribute_dataset(*model, data, tmp_path / "out", progress=False)
    rows = read(tmp_path / "out")
    assert [r["id"] for r in rows] == [0, 1, 2] and run.errors == 0 and run.warned == 1
    assert len(rows[1]["text"]) == 200_000 and len(rows[1]["tokens"]) == 64
    assert rows[1]["warnings"][0].startswith("row 1 has ") and "input 0" not in rows[1]["warnings"][0]
    with pytest.warns(InputWarning):
        assert rows[1]["tokens"] == normx.explain(*model, long).tokens  # truncated as explain truncates it
    assert rows[2]["text"] == "a dull plot" and rows[2]["error"] is None
    assert "1 rows were explained with warnings" in run.summary()


def test_a_warning_names_the_row_not_its_place_in_the_batch(model, tmp_path):
    texts = ["short one", "short two", "dull " * 100, "short three"]
    data = write_tsv(tmp_path / "data.tsv", texts)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        normx.attribute_dataset(*model, data, tmp_path / "out", progress=False, batch_size=4)
    shown = [str(w.message) for w in caught if issubclass(w.category, InputWarning)]
    assert shown == ["row 2 has 102 tokens, more than the model's 64: truncated to 64 tokens"]
    assert [r["warnings"] for r in read(tmp_path / "out")] == [[], [], shown, []]


def test_every_line_of_a_file_is_a_row_of_the_run(model, tmp_path):
    data = tmp_path / "data.tsv"
    data.write_text("sentence\tlabel\na good film\t1\n\nhalf\tof it\t0\na dull plot\t0\n")
    run = normx.attribute_dataset(*model, data, tmp_path / "out", progress=False)
    rows = read(tmp_path / "out")
    assert [(r["id"], r["error"]) for r in rows] == [
        (0, None), (1, f"{data}:3: a blank line"),
        (2, f"{data}:4: 3 tab-separated fields where the header has 2 (a tab inside a text?)"), (3, None)]
    assert run.errors == 2 and settings(tmp_path / "out")["errors"] == 2


def test_a_resume_against_changed_data_is_refused_naming_the_difference(model, tmp_path, monkeypatch):
    data, out = write_tsv(tmp_path / "data.tsv", TEXTS[:8]), tmp_path / "out"
    normx.attribute_dataset(*model, data, out, shard_size=4, progress=False)
    recorded = settings(out)["settings"]["data"]
    assert recorded["bytes"] == data.stat().st_size and len(recorded["sha256"]) == 64
    (out / "shard-00001.parquet").unlink()
    monkeypatch.chdir(tmp_path)  # the same file, spelled another way: resumed
    run = normx.attribute_dataset(*model, "./data.tsv", "out", shard_size=4, progress=False)
    assert run.skipped == [0] and run.written == [1] and settings(out)["settings"]["source"] == "./data.tsv"
    (out / "shard-00001.parquet").unlink()
    size = data.stat().st_size
    write_tsv(data, TEXTS[:8][::-1])  # the same rows in another order, the same path: the same size
    with pytest.raises(InvalidInputError, match=rf"other settings: the data differ: ./data.tsv and data.tsv both have "
                                                rf"{size} bytes but other content \(sha256 \w{{12}}\.\.\. then"):
        normx.attribute_dataset(*model, data.name, out, shard_size=4, progress=False)
    write_tsv(data, TEXTS[4:12])  # other rows
    with pytest.raises(InvalidInputError, match=rf"the data differ: ./data.tsv had {size} bytes \(sha256 \w{{12}}"
                                                rf"\.\.\.\), data.tsv has {data.stat().st_size} bytes"):
        normx.attribute_dataset(*model, data.name, out, shard_size=4, progress=False)
    assert sorted(p.name for p in out.glob("shard-*")) == ["shard-00000.parquet"]  # nothing written


def test_a_trial_runs_limit_grows_into_the_full_run(model, tmp_path):
    data, out = write_tsv(tmp_path / "data.tsv", TEXTS), tmp_path / "out"
    trial = normx.attribute_dataset(*model, data, out, shard_size=4, limit=5, progress=False)
    assert trial.written == [0, 1] and [r["id"] for r in read(out)] == list(range(5))
    before = {r["id"]: r for r in read(out)}
    grown = normx.attribute_dataset(*model, data, out, shard_size=4, limit=10, progress=False)
    assert grown.skipped == [0] and grown.written == [1, 2] and grown.extended == [1] and grown.rows_explained == 5
    assert "completing shards a smaller --limit had left short" in grown.summary()
    rows = read(out)
    assert [r["id"] for r in rows] == list(range(10)) and rows[4] == before[4]  # the trial's row kept as it was
    assert settings(out)["settings"]["limit"] == 10 and settings(out)["complete"]
    full = normx.attribute_dataset(*model, data, out, shard_size=4, progress=False)
    assert full.written == [2] and full.extended == [2] and [r["id"] for r in read(out)] == list(range(12))
    for r in read(out):
        e = normx.explain(*model, TEXTS[r["id"]])
        assert r["text"] == TEXTS[r["id"]] and r["tokens"] == e.tokens and r["prediction"] == e.prediction
    manifest = settings(out)
    assert manifest["settings"]["limit"] is None and manifest["complete"] and manifest["rows"] == 12
    with pytest.raises(InvalidInputError, match=r"limit was none \(every row\), now 8: a resume may raise the limit "
                                                "or drop it"):
        normx.attribute_dataset(*model, data, out, shard_size=4, limit=8, progress=False)


def test_the_command_line_refuses_a_resume_before_it_loads_the_model(model, tmp_path, monkeypatch, capsys):
    data, out = write_tsv(tmp_path / "data.tsv", TEXTS[:6]), tmp_path / "out"
    normx.attribute_dataset(*model, data, out, shard_size=4, limit=4, progress=False)

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("normx.cli.options.load", no_model)
    args = ["attribute", "--model", "any-model", "--data", str(data), "--out", str(out), "--no-progress"]
    for extra, said in ((["--method", "logat", "--limit", "4"], "method was 'normxlogit', now 'logat'"),
                        (["--limit", "2"], "limit was 4, now 2"),
                        (["--shard-size", "3"], "shard_size was 4, now 3"),
                        (["--text-column", "nope"], "no column 'nope'")):
        assert main([*args, *extra]) == 2
        assert said in capsys.readouterr().err
    write_tsv(data, TEXTS[1:7])
    assert main(args) == 2 and "the data differ" in capsys.readouterr().err
    args[4] = str(tmp_path / "missing.tsv")
    assert main(args) == 2 and "no data file at" in capsys.readouterr().err


def test_show_names_a_missing_folder(tmp_path, capsys):
    assert main(["show", str(tmp_path / "nowhere")]) == 2
    assert f"normx: error: {tmp_path / 'nowhere'} does not exist" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["show", str(tmp_path / "file")]) == 2
    assert "is not a folder" in capsys.readouterr().err
