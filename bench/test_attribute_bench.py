"""Throughput of ``normx attribute``: texts/s and tokens/s on SST-2 dev (short single sentences) and QNLI dev pairs
(longer, mixed lengths), length buckets under a token budget vs fixed batches in file order, 1 vs 2 processes.

Timed (``nox -s bench`` / ``--benchmark-enable``): the ``minilm-sst2`` / ``minilm-qnli`` presets on the shared data
(``$NORMX_DATA``; skipped without it), one round each (a run takes seconds to minutes). Default test run: a tiny
model on a synthetic mixed-length corpus, as a smoke test. Both check that the modes give the same rows.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import normx

pq = pytest.importorskip("pyarrow.parquet", reason="normx attribute writes Parquet: pip install 'normx[attribute]'")

SETS = {"sst2": ("minilm-sst2", "sst2/dev.tsv", None), "qnli": ("minilm-qnli", "qnli/dev.tsv", 1000)}
FIXED_BATCH, BUDGET = 32, None  # None: the device's default token budget


def timed(request) -> bool:
    return bool(request.config.getoption("benchmark_enable", False))


def shared_data() -> Path | None:
    folder = Path(os.environ.get("NORMX_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    return folder if (folder / "sst2" / "dev.tsv").is_file() else None


def smoke_corpus(folder: Path) -> Path:
    rng = random.Random(0)
    words = "the film was a gripping story and the plot was dull but the music is good".split()
    rows = [" ".join(rng.choice(words) for _ in range(rng.choice([3, 5, 40, 60]))) for _ in range(24)]
    file = folder / "mixed.tsv"
    file.write_text("sentence\tlabel\n" + "".join(f"{r}\t1\n" for r in rows))
    return file


def rows_of(folder: Path) -> list[dict]:
    return [r for f in sorted(folder.glob("shard-*.parquet")) for r in pq.read_table(f).to_pylist()]


@pytest.fixture(scope="module")
def inputs(request, tmp_path_factory):
    """(name, model, tokenizer, data file, limit) per data set."""
    if not timed(request):
        from workloads import load

        model, tokenizer = load("tiny-bert")
        return [("smoke", model, tokenizer, smoke_corpus(tmp_path_factory.mktemp("smoke")), None)]
    data = shared_data()
    if data is None:
        pytest.skip("the shared data folder is not here ($NORMX_DATA)")
    out = []
    for name, (preset, file, limit) in SETS.items():
        model, tokenizer = normx.load_model(preset)
        warm = tmp_path_factory.mktemp(f"warm-{name}")
        normx.attribute_dataset(model, tokenizer, data / file, warm, limit=64, progress=False)  # first-call costs
        out.append((name, model, tokenizer, data / file, limit))
    return out


@pytest.mark.parametrize("mode", ["buckets", "fixed"])
def test_attribute_throughput(benchmark, inputs, mode, tmp_path, request):
    figures = {}
    for name, model, tokenizer, data, limit in inputs:
        kwargs = {"max_tokens": BUDGET} if mode == "buckets" else {"batch_size": FIXED_BATCH}
        out = tmp_path / name

        def run(out=out, model=model, tokenizer=tokenizer, data=data, limit=limit, kwargs=kwargs):
            return normx.attribute_dataset(model, tokenizer, data, out, limit=limit, progress=False, **kwargs)

        result = benchmark.pedantic(run, rounds=1, iterations=1) if name == inputs[0][0] else run()
        figures[name] = {"rows": result.rows, "tokens": result.tokens, "seconds": round(result.seconds, 2),
                         "texts_per_s": round(result.rows / result.seconds, 1),
                         "tokens_per_s": round(result.tokens / result.seconds)}
        rows = rows_of(out)
        assert [r["id"] for r in rows] == list(range(result.rows))
        check = rows[:: max(1, len(rows) // 8)]
        for row in check:  # the same as explain on the row alone
            e = normx.explain(model, tokenizer, row["text"], text_pair=row["text_pair"])
            np.testing.assert_allclose(row["scores"], e.score, rtol=1e-4, atol=1e-4)
    benchmark.extra_info.update({"mode": mode, **{f"{k}.{n}": v for k, f in figures.items() for n, v in f.items()}})
    print(mode, figures)


def test_one_vs_two_processes(request, tmp_path):
    """Wall time of the whole command, one process (2 torch threads) vs torchrun with 2 (1 thread each)."""
    if not timed(request):
        pytest.skip("timed runs only (--benchmark-enable)")
    data = shared_data()
    if data is None:
        pytest.skip("the shared data folder is not here ($NORMX_DATA)")
    args = ["attribute", "--model", "minilm-sst2", "--data", str(data / "sst2" / "dev.tsv"), "--shard-size", "200",
            "--no-progress"]
    seconds = {}
    for label, prefix, threads in (("1 process", [sys.executable, "-m", "normx.cli.main"], "2"),
                                   ("2 processes", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                    "--nproc-per-node", "2", "-m", "normx.cli.main"], "1")):
        env = dict(os.environ, OMP_NUM_THREADS=threads)
        start = time.perf_counter()
        done = subprocess.run([*prefix, *args, "--out", str(tmp_path / label.replace(" ", "-"))], env=env,
                              capture_output=True, text=True, timeout=1200)
        seconds[label] = round(time.perf_counter() - start, 1)
        assert done.returncode == 0, done.stderr[-2000:]
    one, two = rows_of(tmp_path / "1-process"), rows_of(tmp_path / "2-processes")
    assert [r["id"] for r in one] == [r["id"] for r in two] == list(range(872))
    print("processes", seconds)
