"""bench/report.py on a hand-written pytest-benchmark JSON: per-instance times, ratios, goals and the README block."""

from __future__ import annotations

import json

import pytest
import report


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
