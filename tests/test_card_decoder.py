"""studies/timing/card_decoder.py (the 7B-class decoder's run on a lent card) in its dry run: the same architecture,
tiny, on the CPU; every case recorded with its time and ratio, and a case the budget cannot finish skipped."""

from __future__ import annotations

import json

from studies.timing import card_decoder


def test_the_dry_run_records_every_case(tmp_path):
    out = tmp_path / "card.json"
    methods = ["forward", "normxlogit", "calibrated_attention"]
    assert card_decoder.main(["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--lengths", "96", "160",
                              "--methods", *methods, "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert [(case["tokens"], case["method"]) for case in record["cases"]] == [(n, m) for n in (96, 160)
                                                                             for m in methods]
    assert all(case["status"] == "ran" and case["seconds"] > 0 for case in record["cases"])
    assert [case["ratio_to_forward"] for case in record["cases"] if case["method"] == "forward"] == [1.0, 1.0]
    assert record["model"]["architecture"] == "MistralForCausalLM" and record["model"]["dtype"] == "float32"
    assert record["device"]["name"] == "cpu" and record["command"].endswith(str(out))


def test_a_case_past_the_budget_is_skipped(tmp_path):
    out = tmp_path / "card.json"
    assert card_decoder.main(["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--lengths", "96",
                              "--methods", "forward", "contextcite@32", "--budget", "0", "--out", str(out)]) == 0
    cases = json.loads(out.read_text())["cases"]
    assert cases[0]["status"] == "ran" and cases[1]["status"] == "skipped" and "left" in cases[1]["why"]
