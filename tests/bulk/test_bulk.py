"""normx attribute / attribute_dataset: streamed corpora into Parquet shards; every row equals normx.explain on it;
nothing lost or written twice across a killed and restarted run; torchrun's two processes write what one does; a
model offloaded with a device_map gives the plain model's scores."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tiny
import torch

import normx
from normx.bulk import attribute as bulk
from normx.errors import InvalidInputError

pq = pytest.importorskip("pyarrow.parquet", reason="normx attribute writes Parquet: pip install 'normx[attribute]'")

WORDS = "the film was a gripping story and the plot was dull but the music is good not bad at all".split()


def corpus(n: int = 23, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 30))) for _ in range(n)]


def write_tsv(path: Path, texts: list[str], pairs: list[str] | None = None) -> Path:
    header = "sentence\tlabel" if pairs is None else "sentence1\tsentence2\tscore"
    lines = [f"{t}\t1" if pairs is None else f"{t}\t{p}\t2.5" for t, p in zip(texts, pairs or texts)]
    path.write_text(header + "\n" + "\n".join(lines) + "\n")
    return path


def read(folder: Path) -> list[dict]:
    return [row for f in sorted(folder.glob("shard-*.parquet")) for row in pq.read_table(f).to_pylist()]


@contextlib.contextmanager
def killed_after_the_first_shard():
    """The run inside is killed (KeyboardInterrupt) when it is about to write its second shard."""
    real, written = bulk._write_atomically, []

    def dies_after_the_first(parquet, records, file):
        if written:
            raise KeyboardInterrupt("killed")
        written.append(file)
        real(parquet, records, file)

    bulk._write_atomically = dies_after_the_first
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        bulk._write_atomically = real


@pytest.fixture(scope="module")
def model():
    return tiny.build("BertForSequenceClassification")


def test_every_row_equals_explain_on_it(model, tmp_path):
    texts = corpus()
    data = write_tsv(tmp_path / "data.tsv", texts)
    run = normx.attribute_dataset(*model, data, tmp_path / "out", shard_size=7, max_tokens=64, progress=False,
                                  layer="all")
    rows = read(tmp_path / "out")
    assert [r["id"] for r in rows] == list(range(len(texts))) and run.rows == len(texts) and run.shards == 4
    for row, text in zip(rows, texts):
        e = normx.explain(*model, text, layer="all")
        assert row["text"] == text and row["tokens"] == e.tokens and row["prediction"] == e.prediction
        np.testing.assert_allclose(row["scores"], e.score, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(row["scores_by_label_layer"], e.scores, rtol=1e-5, atol=1e-5)
        assert row["layers"] == e.layers and [p["label"] for p in row["probabilities"]] == list(e.probabilities)
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["complete"] and manifest["rows"] == len(texts) and manifest["shards"] == 4
    assert manifest["settings"]["method"] == "normxlogit" and manifest["normx"] == normx.__version__


def test_length_buckets_stay_in_the_token_budget():
    lengths = [5, 40, 7, 7, 33, 2, 64, 100, 9]
    got = bulk.batches(lengths, max_tokens=64)
    assert sorted(i for b in got for i in b) == list(range(len(lengths)))
    for batch in got:
        assert len(batch) == 1 or max(lengths[i] for i in batch) * len(batch) <= 64
    assert [lengths[i] for i in got[0]] == [2, 5, 7, 7, 9]  # shortest first, together
    assert bulk.batches(lengths, max_tokens=64, batch_size=4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]  # fixed, in order


def test_a_killed_run_redoes_only_unfinished_shards(model, tmp_path):
    texts = corpus(20, seed=1)
    data, out = write_tsv(tmp_path / "data.tsv", texts), tmp_path / "out"
    with killed_after_the_first_shard():
        normx.attribute_dataset(*model, data, out, shard_size=6, progress=False)
    first = out / "shard-00000.parquet"
    stamp = first.stat().st_mtime_ns
    assert sorted(p.name for p in out.glob("shard-*")) == ["shard-00000.parquet"]
    assert not list(out.glob(".shard-*"))  # no half-written file left behind
    run = normx.attribute_dataset(*model, data, out, shard_size=6, progress=False)
    assert run.skipped == [0] and run.written == [1, 2, 3] and first.stat().st_mtime_ns == stamp
    assert [r["id"] for r in read(out)] == list(range(20))  # every id exactly once
    again = normx.attribute_dataset(*model, data, out, shard_size=6, progress=False)
    assert again.written == [] and again.skipped == [0, 1, 2, 3]  # a finished run adds nothing
    with pytest.raises(InvalidInputError, match=r"other settings: method was 'normxlogit', now 'logat'"):
        normx.attribute_dataset(*model, data, out, shard_size=6, progress=False, method="logat")


def test_a_folder_of_another_model_is_not_resumed(tmp_path):
    """Two models of one class and one name (as two presets on one base are) differ in their weights: a resume with
    the other is refused, naming both; the identity is in the manifest and the report."""
    texts = corpus(8, seed=4)
    data, out = write_tsv(tmp_path / "data.tsv", texts), tmp_path / "out"
    first, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    other, _ = tiny.build("BertForSequenceClassification", fresh=True)
    with torch.no_grad():  # another fine-tune of the same base: one head weight differs
        other.classifier.weight[0, 0] += 0.5
    first.normx_name = other.normx_name = "my-model"
    normx.attribute_dataset(first, tokenizer, data, out, shard_size=4, progress=False)
    identity = json.loads((out / "_manifest.json").read_text())["settings"]["model"]
    assert identity["name"] == "my-model" and identity["class"] == "BertForSequenceClassification"
    assert identity["adapter"] is None and len(identity["weights"]) == 24
    with pytest.raises(InvalidInputError, match=r"its model is my-model \(.*weights (\w+).*this run's is my-model") \
            as raised:
        normx.attribute_dataset(other, tokenizer, data, out, shard_size=4, progress=False)
    assert identity["weights"][:8] in str(raised.value)
    again = normx.attribute_dataset(first, tokenizer, data, out, shard_size=4, progress=False)
    assert again.skipped == [0, 1] and again.written == []


def test_pairs_jsonl_parquet_and_fixed_batches(tmp_path):
    model, tokenizer = tiny.build("BertForSequenceClassification")
    premises, hypotheses = corpus(9, seed=2), corpus(9, seed=3)
    jsonl = tmp_path / "mnli.jsonl"
    jsonl.write_text("\n".join(json.dumps({"premise": p, "hypothesis": h, "label": "neutral"})
                               for p, h in zip(premises, hypotheses)))
    normx.attribute_dataset(model, tokenizer, jsonl, tmp_path / "a", batch_size=4, progress=False)
    rows = read(tmp_path / "a")
    assert [(r["text"], r["text_pair"]) for r in rows] == list(zip(premises, hypotheses))
    e = normx.explain(model, tokenizer, premises[4], text_pair=hypotheses[4])
    np.testing.assert_allclose(rows[4]["scores"], e.score, rtol=1e-5, atol=1e-5)
    parquet_in = tmp_path / "in.parquet"  # Parquet in, columns named on the command line
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist([{"body": t, "n": i} for i, t in enumerate(premises)]), parquet_in)
    normx.attribute_dataset(model, tokenizer, parquet_in, tmp_path / "b", text_column="body", limit=5,
                            progress=False)
    assert [r["text"] for r in read(tmp_path / "b")] == premises[:5]
    with pytest.raises(InvalidInputError, match=r"no column 'nope'; the columns are \['body', 'n'\]"):
        normx.attribute_dataset(model, tokenizer, parquet_in, tmp_path / "c", text_column="nope", progress=False)


def test_torchrun_two_processes_write_what_one_writes(tmp_path):
    model, tokenizer = tiny.build("BertForSequenceClassification")
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    data = write_tsv(tmp_path / "data.tsv", corpus(30, seed=4))
    args = ["attribute", "--model", str(folder), "--data", str(data), "--shard-size", "4", "--no-progress"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    one = subprocess.run([sys.executable, "-m", "normx.cli.main", *args, "--out", str(tmp_path / "one")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "normx.cli.main", *args, "--out", str(tmp_path / "two")], env=env, capture_output=True,
                         text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "rank 0 of 2" in two.stderr
    single, double = read(tmp_path / "one"), read(tmp_path / "two")
    assert [r["id"] for r in double] == list(range(30))
    for a, b in zip(single, double):
        assert a["tokens"] == b["tokens"] and a["prediction"] == b["prediction"]
        np.testing.assert_allclose(a["scores"], b["scores"], rtol=1e-6, atol=1e-6)
    manifest = json.loads((tmp_path / "two" / "_manifest.json").read_text())
    assert manifest["complete"] and manifest["world_size"] == 2 and manifest["rows"] == 30


def test_a_model_offloaded_by_device_map_gives_the_same_scores(tmp_path):
    pytest.importorskip("accelerate", reason="device_map needs accelerate")
    model, tokenizer = tiny.build("BertForSequenceClassification")
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    device_map = {"bert.embeddings": "cpu", "bert.encoder.layer.0": "cpu", "bert.encoder.layer.1": "disk",
                  "bert.pooler": "disk", "classifier": "cpu"}
    offloaded, _ = normx.load_model(tmp_path / "model", device_map=device_map, offload_folder=str(tmp_path / "off"))
    assert offloaded.hf_device_map["bert.encoder.layer.1"] == "disk"
    for method in ("normxlogit", "gradient_x_input"):
        plain = normx.explain(model, tokenizer, tiny.TEXTS, method=method, layer="all" if method != "gradient_x_input"
                              else None)
        moved = normx.explain(offloaded, tokenizer, tiny.TEXTS, method=method,
                              layer="all" if method != "gradient_x_input" else None)
        for a, b in zip(plain, moved):
            np.testing.assert_allclose(a.scores, b.scores, rtol=1e-6, atol=1e-6)


def test_default_columns_of_the_glue_files(tmp_path):
    from normx.data.rows import iter_rows

    qnli = tmp_path / "qnli.tsv"
    qnli.write_text("index\tquestion\tsentence\tlabel\n0\tWho?\tHe did.\tentailment\n")
    sst2 = tmp_path / "sst2.tsv"
    sst2.write_text("sentence\tlabel\na film\t1\n")
    stsb = tmp_path / "stsb.tsv"
    stsb.write_text("genre\tsentence1\tsentence2\tscore\nnews\tA\tB\t3.0\n")
    assert [(r.text, r.text_pair) for r in iter_rows(qnli)] == [("Who?", "He did.")]
    assert [(r.text, r.text_pair) for r in iter_rows(sst2)] == [("a film", None)]
    assert [(r.text, r.text_pair) for r in iter_rows(stsb)] == [("A", "B")]
    assert [(r.text, r.text_pair) for r in iter_rows(qnli, pair_column="")] == [("Who?", None)]


@pytest.mark.slow
def test_minilm_sst2_on_sst2_dev_one_and_two_processes_killed_and_offloaded(tmp_path):
    """The real preset on the real dev set: two torchrun processes write what one does; a run killed after its first
    shard and restarted ends with every id once; the model offloaded to CPU + disk gives the same scores."""
    from locations import SHARED

    data = Path(SHARED) / "sst2" / "dev.tsv"
    if not data.is_file():
        pytest.skip("the shared data folder is not here")
    args = ["attribute", "--model", "minilm-sst2", "--data", str(data), "--shard-size", "200", "--no-progress"]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    for name, prefix in (("one", [sys.executable, "-m", "normx.cli.main"]),
                         ("two", [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                  "2", "-m", "normx.cli.main"])):
        done = subprocess.run([*prefix, *args, "--out", str(tmp_path / name)], env=env, capture_output=True,
                              text=True, timeout=1200)
        assert done.returncode == 0, done.stderr[-3000:]
    one, two = read(tmp_path / "one"), read(tmp_path / "two")
    assert [r["id"] for r in one] == [r["id"] for r in two] == list(range(872))
    for a, b in zip(one, two):  # float32 sums in another order (1 thread per process under torchrun, 2 here)
        assert a["tokens"] == b["tokens"] and np.allclose(a["scores"], b["scores"], rtol=1e-4, atol=1e-4)

    model, tokenizer = normx.load_model("minilm-sst2")
    with killed_after_the_first_shard():
        normx.attribute_dataset(model, tokenizer, data, tmp_path / "resumed", shard_size=200, progress=False)
    run = normx.attribute_dataset(model, tokenizer, data, tmp_path / "resumed", shard_size=200, progress=False)
    assert run.skipped == [0] and run.written == [1, 2, 3, 4]
    resumed = read(tmp_path / "resumed")
    assert [r["id"] for r in resumed] == list(range(872))
    assert all(np.allclose(a["scores"], b["scores"], rtol=1e-4, atol=1e-4) for a, b in zip(one, resumed))

    folder = tmp_path / "merged"  # the preset as one plain model folder, then offloaded
    model.merge_and_unload().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    plain, _ = normx.load_model(folder)
    layers = len(plain.bert.encoder.layer)
    device_map = {"bert.embeddings": "cpu", **{f"bert.encoder.layer.{i}": "cpu" if i < layers // 2 else "disk"
                                                for i in range(layers)}, "bert.pooler": "disk", "classifier": "cpu"}
    offloaded, _ = normx.load_model(folder, device_map=device_map, offload_folder=str(tmp_path / "offload"))
    texts = [r["text"] for r in one[:64]]
    for a, b in zip(normx.explain(plain, tokenizer, texts), normx.explain(offloaded, tokenizer, texts)):
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5, atol=1e-5)


def test_hub_dataset_ids_stream_through_datasets(monkeypatch):
    """Online, ``NAME[:CONFIG][@SPLIT]`` streams a hub dataset; offline the real call cannot run, so a stand-in
    ``datasets`` module checks what normx asks of it."""
    import types

    from normx.data.rows import iter_rows

    calls = []

    def load_dataset(name, config=None, split=None, streaming=False):
        calls.append((name, config, split, streaming))
        return iter([{"question": "Who?", "sentence": "He did.", "label": 0}])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    rows = list(iter_rows("nyu-mll/glue:qnli@validation"))
    assert calls == [("nyu-mll/glue", "qnli", "validation", True)]
    assert [(r.id, r.text, r.text_pair) for r in rows] == [(0, "Who?", "He did.")]
    list(iter_rows("someone/corpus"))
    assert calls[-1] == ("someone/corpus", None, "train", True)


# ---- bad rows do not stop a run; the folder reads as a Parquet dataset --------------------------------------------

def test_bad_rows_are_written_with_their_reason_and_the_run_goes_on(model, tmp_path):
    data = tmp_path / "data.jsonl"
    lines = [json.dumps({"text": "a gripping film"}).encode(), json.dumps({"text": ""}).encode(),
             b'{"text": "caf\xe9 au lait"}', b"{not json", json.dumps({"text": "\u200b \u200b"}).encode(),
             json.dumps({"other": "no text"}).encode(), json.dumps({"text": "a dull plot"}).encode()]
    data.write_bytes(b"\n".join(lines) + b"\n")
    run = normx.attribute_dataset(*model, data, tmp_path / "out", shard_size=4, progress=False)
    rows = read(tmp_path / "out")
    assert [r["id"] for r in rows] == list(range(7)) and run.errors == 5 and "5 rows could not be explained" in \
        run.summary()
    good = {0: "a gripping film", 6: "a dull plot"}
    for row in rows:
        if row["id"] in good:
            assert row["error"] is None and row["tokens"] == normx.explain(*model, good[row["id"]]).tokens
        else:
            assert row["error"] and row["tokens"] == [] and row["scores"] == [] and row["prediction"] is None
    errors = {r["id"]: r["error"] for r in rows}
    assert "empty" in errors[1] and "row 1" in errors[1]
    assert errors[2] == f"{data}:3: not UTF-8 text (the byte 0xe9 at character 14)"
    assert errors[3].startswith(f"{data}:4: not valid JSON")
    assert "empty" in errors[4] and errors[5] == f"{data}:6: no text in column 'text'"
    assert json.loads((tmp_path / "out" / "_manifest.json").read_text())["errors"] == 5


def test_a_tsv_with_undecodable_bytes_names_the_line(model, tmp_path):
    data = tmp_path / "data.tsv"
    data.write_bytes(b"sentence\tlabel\na fine film\t1\nbad \xff byte\t0\n")
    with pytest.raises(InvalidInputError, match=r"data.tsv:3: not UTF-8 text \(the byte 0xff at character 5\)"):
        list(normx.data.rows.iter_rows(data))
    normx.attribute_dataset(*model, data, tmp_path / "out", progress=False)
    assert [r["error"] for r in read(tmp_path / "out")] == [None, f"{data}:3: not UTF-8 text (the byte 0xff at "
                                                                   "character 5)"]


def test_the_folder_reads_as_a_parquet_dataset(model, tmp_path):
    """README: pandas.read_parquet(DIR), pyarrow.dataset and datasets.load_dataset("parquet", ...) read the shards
    (the manifest's leading underscore keeps it out of their way)."""
    import pandas as pd
    import pyarrow.dataset as ds

    texts = corpus(9)
    normx.attribute_dataset(*model, write_tsv(tmp_path / "data.tsv", texts), tmp_path / "out", shard_size=4,
                            progress=False)
    folder = tmp_path / "out"
    frame = pd.read_parquet(folder)
    assert sorted(frame["id"]) == list(range(9)) and list(frame.sort_values("id")["text"]) == texts
    assert ds.dataset(folder).count_rows() == 9
    datasets = pytest.importorskip("datasets", reason="pip install 'normx[hub]'")
    loaded = datasets.load_dataset("parquet", data_files=f"{folder}/shard-*.parquet", split="train")
    assert sorted(loaded["id"]) == list(range(9))


def test_a_folder_with_the_old_manifest_name_is_resumed(model, tmp_path):
    data = write_tsv(tmp_path / "data.tsv", corpus(6))
    folder = tmp_path / "out"
    normx.attribute_dataset(*model, data, folder, shard_size=4, progress=False)
    (folder / "_manifest.json").rename(folder / "manifest.json")
    run = normx.attribute_dataset(*model, data, folder, shard_size=4, progress=False)
    assert run.skipped == [0, 1] and (folder / "_manifest.json").exists() and not (folder / "manifest.json").exists()
