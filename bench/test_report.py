"""bench/report.py on a hand-written pytest-benchmark JSON: per-instance times, ratios, goals and the README block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import report
import report_lengths


def _entry(method, length, batch, median, level="batch", ratio=None, **extra):
    info = dict(model="m", method=method, L=length, batch=batch, level=level, device="cpu (x)", dtype="float32",
                timer="perf_counter", per_instance_s=median / batch, **extra)
    if ratio is not None:
        info["ratio_to_forward"] = ratio
    return {"name": f"test[{method}-{length}-{batch}]", "group": "g", "params": {}, "extra_info": info,
            "stats": {"median": median, "rounds": 3}}


def _data():
    benchmarks = [
        _entry("forward", 40, 4, 0.040, ratio=1.0),
        _entry("normxlogit", 40, 4, 0.041, ratio=1.02),
        _entry("normxlogit", 120, 4, 0.130, ratio=1.08),
        _entry("logat_all", 40, 4, 0.044, ratio=1.1),
        _entry("forward", 40, 20, 0.2, level="max_batch", max_batch=20, max_batch_cap=32, budget_bytes=2**28),
        _entry("normxlogit", 40, 19, 0.19, level="max_batch", max_batch=19, max_batch_cap=32, budget_bytes=2**28),
        {"name": "ig[normx]", "group": "ig, same forward", "params": {"implementation": "normx"}, "extra_info": {},
         "stats": {"median": 2.0, "rounds": 3}},
        {"name": "ig[captum]", "group": "ig, same forward", "params": {"implementation": "captum"},
         "extra_info": {}, "stats": {"median": 2.5, "rounds": 3}},
    ]
    return {"benchmarks": benchmarks, "datetime": "2026-01-01T00:00:00", "commit_info": {"id": "abc", "dirty": False}}


def test_tables_and_goals():
    text = report.render(_data(), "nox -s bench")
    assert "| normxlogit | 10.2 ms (1.020×) | 32.5 ms (1.080×) |" in text  # 0.041 s / 4, 0.130 s / 4
    assert "| logat_all | 11.0 ms (1.100×) | – |" in text
    assert "normxlogit ≤ 1.05× the plain forward (encoded batch): 1 of 2 cases met" in text
    assert "worst 1.080× (m, L=120, batch 4)" in text
    assert "logat_all ≤ 1.2× the plain forward (encoded batch): 1 of 1 cases met" in text
    assert "| normxlogit | 19 (0.95×) · 10.0 ms |" in text
    assert "normxlogit max batch ≥ 0.9× the forward's: 1 of 1 cases met; worst 0.95×" in text
    assert "| ig, same forward | 2.00 s | 2.50 s | 0.800× |" in text
    assert "ig, same forward: normx no slower than Captum: met (0.800×)" in text


def test_readme_block_is_replaced(tmp_path):
    source = tmp_path / "bench.json"
    source.write_text(json.dumps(_data()))
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{report.START}\nold table\n{report.END}\nafter\n")
    report.main([str(source), "-o", str(tmp_path / "RESULTS.md"), "--readme", str(readme)])
    content = readme.read_text()
    assert "old table" not in content and "before" in content and "after" in content
    assert "### Benchmark results" in content and "| normxlogit | 10.2 ms (1.020×) |" in content
    assert "## Benchmark results" in (tmp_path / "RESULTS.md").read_text()
    readme.write_text("no block")
    with pytest.raises(SystemExit, match="no <!-- bench:start -->"):
        report.main([str(source), "--readme", str(readme)])


def _generation(method, length, seconds, forward_seconds, peak, forward_peak, **extra):
    info = dict(level="generation", model="m", method=method, L=length, steps=32, batch=1, device="cpu (x)",
                dtype="float32", timer="process_time", threads=1, seconds=seconds, forward_seconds=forward_seconds,
                peak_bytes=peak, forward_peak_bytes=forward_peak, out_of_memory=False, **extra)
    if method != "forward":
        info["ratio_to_forward"] = sorted(s / f for s, f in zip(seconds, forward_seconds))[len(seconds) // 2]
    return {"name": f"gen[{method}-{length}]", "group": "g", "params": {}, "extra_info": info,
            "stats": {"median": 9.0, "rounds": 1}}


MIB = 1024**2


def _generation_data():
    search = dict(max_batch_cap=8, budget_bytes=4096 * MIB)
    long_figures = {m: {str(length): {"peak_bytes": peak * MIB, "forward_peak_bytes": length // 1024 * MIB}
                        for length, peak in zip((8192, 16384, 32768), peaks)}
                    for m, peaks in (("normxlogit", (5, 10, 21)), ("norm_attention", (8, 16, 30)))}
    benchmarks = [
        _generation("forward", 512, [2.0, 2.2, 2.4], [2.0, 2.2, 2.4], 100 * MIB, 100 * MIB, max_batch=8,
                    trials={"8": 800 * MIB}, batch_seconds={"8": 1.5}, **search),
        _generation("normxlogit", 512, [2.1, 2.3, 2.2], [2.0, 2.0, 2.0], 80 * MIB, 100 * MIB, max_batch=4,
                    trials={"4": 320 * MIB}, batch_seconds={"4": 1.9}, **search),
        _generation("attnlrp", 512, [90.0], [2.0], 2000 * MIB, 100 * MIB, search_skipped="a batch-1 round took 90 s"),
        _generation("forward", 2048, [10.0], [10.0], 400 * MIB, 400 * MIB),
        {"name": "long", "group": "g", "params": {}, "stats": {"median": 1.0, "rounds": 1},
         "extra_info": dict(level="long_context", model="tiny-long-llama", methods=["normxlogit", "norm_attention"],
                            lengths=[8192, 16384, 32768], steps=32, device="cpu (x)", dtype="float32",
                            timer="process_time", threads=1, figures=long_figures,
                            growth={"normxlogit": 2.1, "forward": 2.0, "norm_attention": 1.875})},
    ]
    return {"benchmarks": benchmarks, "datetime": "2026-01-01T00:00:00", "commit_info": {"id": "abc", "dirty": False}}


def test_generation_tables():
    text = report_lengths.render(_generation_data(), "nox -s bench")
    assert "| method | 512 tokens | 2,048 tokens |" in text
    assert "| forward | 2.20 s | 10.00 s |" in text  # the forward's own median
    assert "| normxlogit | 2.20 s (1.10×) | – |" in text  # median of the method; median of the round ratios
    assert "| normxlogit | 80 MiB (0.80×) | – |" in text and "| attnlrp | 2,000 MiB (20.00×) | – |" in text
    assert "max batch under 4,096 MiB" in text
    assert "| forward | 8 (cap) · 1.50 s | – |" in text and "| normxlogit | 4 (0.50×) · 1.90 s | – |" in text
    assert "| attnlrp | not searched | – |" in text and "attnlrp at 512: a batch-1 round took 90 s" in text
    assert "| forward | 8 MiB | 16 MiB | 32 MiB | 2.00× |" in text
    assert "| normxlogit | 5 MiB | 10 MiB | 21 MiB | 2.10× |" in text
    assert "| norm_attention | 8 MiB | 16 MiB | 30 MiB | 1.88× |" in text


def test_each_part_of_the_suite_replaces_its_own_block(tmp_path):
    readme, results = tmp_path / "README.md", tmp_path / "RESULTS.md"
    blocks = (f"{report.START}\nold classification\n{report.END}\n"
              f"{report_lengths.START}\nold generation\n{report_lengths.END}\n")
    readme.write_text(f"# x\n{blocks}after\n")
    generation, classification = tmp_path / "generation.json", tmp_path / "classification.json"
    generation.write_text(json.dumps(_generation_data()))
    classification.write_text(json.dumps(_data()))
    report.main([str(generation), "-o", str(results), "--readme", str(readme)])
    content = readme.read_text()
    assert "old classification" in content and "old generation" not in content and "### Generation across" in content
    assert "## Generation across lengths" in results.read_text() and "Benchmark results" not in results.read_text()
    report.main([str(classification), "-o", str(results), "--readme", str(readme)])
    content, written = readme.read_text(), results.read_text()
    assert "old classification" not in content and "### Benchmark results" in content and "after" in content
    assert "### Generation across" in content  # kept
    assert "## Benchmark results" in written and "## Generation across lengths" in written


def test_several_runs_make_one_report(tmp_path):
    first, second = _generation_data(), _data()
    second["commit_info"] = {"id": "def4567890abc", "dirty": True}
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, data in zip(paths, (first, second)):
        path.write_text(json.dumps(data))
    merged = report.load(*paths)
    assert len(merged["benchmarks"]) == len(first["benchmarks"]) + len(second["benchmarks"])
    assert merged["commit_info"] == {"id": "abc, def4567890", "dirty": True}
    assert "commit abc, def4567890 (dirty tree)" in report_lengths.render(merged)


def test_long_context_entries_of_one_model_make_one_table():
    data = _generation_data()
    long_entry = data["benchmarks"][-1]
    alone = json.loads(json.dumps(long_entry))  # the forward's own case, as the per-method run records it
    alone["extra_info"].update(methods=["forward"], growth={"forward": 2.0},
                               figures={"forward": {str(n): {"peak_bytes": n // 512 * MIB,
                                                             "forward_peak_bytes": n // 512 * MIB}
                                                    for n in (8192, 16384, 32768)}})
    data["benchmarks"].append(alone)
    text = report_lengths.render(data)
    assert text.count("**tiny-long-llama**") == 1
    assert "| forward | 16 MiB | 32 MiB | 64 MiB | 2.00× |" in text  # the forward's own case
    assert "| normxlogit | 5 MiB | 10 MiB | 21 MiB | 2.10× |" in text


def test_a_later_run_replaces_the_entries_of_its_cases(tmp_path):
    """A rerun of some cases, written beside the old JSON and read after it: its entries replace the old ones of the
    same (model, method, length) in every table; the other cases keep the first run's figures."""
    rerun = _generation("normxlogit", 512, [1.0, 1.2], [2.0, 2.0], 50 * MIB, 100 * MIB,
                        search_skipped="a batch-1 round took 1 s")
    alone = json.loads(json.dumps(_generation_data()["benchmarks"][-1]))
    alone["extra_info"].update(methods=["norm_attention"], growth={"norm_attention": 1.5, "forward": 9.0},
                               figures={"norm_attention": {str(n): {"peak_bytes": n // 1024 * MIB,
                                                                    "forward_peak_bytes": n // 1024 * MIB}
                                                           for n in (8192, 16384, 32768)}})
    later = {"benchmarks": [rerun, alone], "datetime": "2026-02-01T00:00:00",
             "commit_info": {"id": "fed4567890abc", "dirty": False}}
    paths = [tmp_path / "old.json", tmp_path / "rerun.json"]
    for path, data in zip(paths, (_generation_data(), later)):
        path.write_text(json.dumps(data))
    text = report_lengths.render(report.load(*paths))
    assert "| normxlogit | 1.10 s (0.60×) | – |" in text and "| normxlogit | 2.20 s" not in text
    assert "| normxlogit | 50 MiB (0.50×) | – |" in text and "| normxlogit | 80 MiB" not in text
    assert "| normxlogit | not searched | – |" in text and "normxlogit at 512: a batch-1 round took 1 s" in text
    assert "| forward | 2.20 s | 10.00 s |" in text and "| attnlrp | 2,000 MiB (20.00×) | – |" in text  # kept
    assert "| norm_attention | 8 MiB | 16 MiB | 32 MiB | 1.50× |" in text and "1.88×" not in text
    assert "| normxlogit | 5 MiB | 10 MiB | 21 MiB | 2.10× |" in text  # kept
    assert "commit abc, fed4567890" in text
    text = report_lengths.render(report.load(*reversed(paths)))  # the other order: the old run's figures win
    assert "| normxlogit | 2.20 s (1.10×) | – |" in text and "| normxlogit | 80 MiB (0.80×) | – |" in text
    assert "| norm_attention | 8 MiB | 16 MiB | 30 MiB | 1.88× |" in text


def test_a_block_keeps_a_run_apart(tmp_path):
    """--block: one device's runs under one heading in their own block of the output, each part dated by its own
    runs; the file's other blocks untouched; a second report replaces the block."""
    results = tmp_path / "RESULTS.md"
    results.write_text(f"{report.START}\ncpu tables\n{report.END}\n")
    suite, generation = _data(), _generation_data()
    for data in (suite, generation):
        for b in data["benchmarks"]:
            b["extra_info"]["device"] = "gpu (x)"
    generation["datetime"] = "2026-03-03T03:03:03"
    paths = [tmp_path / "suite.json", tmp_path / "generation.json"]
    for path, data in zip(paths, (suite, generation)):
        path.write_text(json.dumps(data))
    args = [*map(str, paths), "-o", str(results), "--block", "gpu-1", "--command", "run it", "--note", "first"]
    report.main(args)
    text = results.read_text()
    assert text.startswith(f"{report.START}\ncpu tables\n{report.END}\n")
    block = text.split("<!-- bench-gpu-1:start -->\n", 1)[1].split("<!-- bench-gpu-1:end -->", 1)[0]
    assert block.startswith("## Results on gpu (x)\n\nProduced by:\n\n```\nrun it\n```\n\nfirst\n")
    assert "### Benchmark results" in block and "#### Goals" in block and "| normxlogit | 10.2 ms (1.020×) |" in block
    assert "### Generation across lengths" in block and "| forward | 2.20 s | 10.00 s |" in block
    assert "Measured 2026-01-01T00:00:00 on gpu (x)" in block and "Measured 2026-03-03T03:03:03 on gpu (x)" in block
    report.main([*args[:-1], "second", "--title", "On a GPU"])
    text = results.read_text()
    assert text.count("<!-- bench-gpu-1:start -->") == 1 and "## On a GPU\n" in text
    assert "\nsecond\n" in text and "\nfirst\n" not in text and "cpu tables" in text
    for bad in (["--block", "lengths"], ["--block", "GPU 1"]):
        with pytest.raises(SystemExit, match="--block"):
            report.main([str(paths[0]), *bad])
    with pytest.raises(SystemExit):  # the README's blocks are not a device's
        report.main([str(paths[0]), "--block", "gpu", "--readme", str(results)])


H200 = Path(__file__).parent / "results" / "h200-2026-11-26"
H200_RUNS = ["bench-speed.json", "bench-ig-decompx.json", "bench-maxbatch-short.json", "bench-maxbatch-long.json",
             "generation-smollm2.json"]  # the order of the report command in its commands.txt


def test_the_h200_block_is_what_report_writes_from_its_files():
    """bench/RESULTS.md's GPU section is report.py's rendering of the committed JSON, command and note."""
    commands = (H200 / "commands.txt").read_text()
    assert " ".join(f"$R/{name}" for name in H200_RUNS) in commands
    start, end = report.block_markers("h200")
    written = (H200.parent.parent / "RESULTS.md").read_text().split(start + "\n", 1)[1].split(end, 1)[0]
    runs = [report.load(H200 / name) for name in H200_RUNS]
    want = report.render_block(runs, "On a GPU: NVIDIA H200", commands, (H200 / "note.md").read_text())
    assert written == want, "bench/RESULTS.md's h200 block is stale: rerun the report command in commands.txt"
    assert "46 PASS, 0 FAIL" in want and "on NVIDIA H200, dtype float32" in want
