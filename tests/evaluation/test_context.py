"""Context attribution's evaluation: the scores in closed form on a model-free linear "model", and ``normx evaluate
context`` end to end on a tiny causal LM (its leave-one-out top-1 drop is its own top score, read back through the
same ablation engine)."""

from __future__ import annotations

import json

import locations
import numpy as np
import pytest
import tiny

from normx.cli.main import main
from normx.errors import InvalidInputError
from normx.evaluation.context import metrics
from normx.evaluation.context.readings import score_context
from normx.evaluation.context.report import ContextReport
from normx.evaluation.context.run import label_options

SHARED = locations.SHARED


def linear(weights):
    """A fake model: the response's log-probability under a mask is the sum of the kept sources' weights."""
    weights = np.asarray(weights, np.float64)

    def outcome(keeps):
        log_p = np.asarray(keeps, np.float64) @ weights
        return log_p, log_p - np.log(-np.expm1(np.minimum(log_p, -1e-12)))

    return outcome


def test_lds_is_one_for_the_true_weights_and_near_zero_for_random_scores():
    rng = np.random.default_rng(0)
    w = rng.normal(size=10)
    masks = metrics.lds_masks(10, 64, seed=1)
    assert masks.shape == (64, 10) and 0.4 < masks.mean() < 0.6
    actual = masks @ w
    assert metrics.lds(w, masks, actual) == pytest.approx(1.0)
    assert metrics.lds(3 * w, masks, actual) == pytest.approx(1.0)  # the scale does not matter
    assert metrics.lds(w + 2, masks, actual) < 0.95  # a shift does: it adds 2 per kept source
    assert metrics.lds(-w, masks, actual) == pytest.approx(-1.0)
    randoms = [metrics.lds(rng.normal(size=10), masks, actual) for _ in range(200)]
    assert abs(np.mean(randoms)) < 0.05 and np.std(randoms) > 0.1
    assert metrics.lds(np.ones(10), masks, actual) == pytest.approx(np.nan_to_num(
        metrics.spearman(masks.sum(1), actual)))  # a constant reading predicts the number of sources kept


def test_spearman_matches_scipy_with_ties():
    from scipy.stats import spearmanr

    a, b = np.array([1, 2, 2, 3, 5, 4.0]), np.array([2, 1, 4, 3, 3, 6.0])
    assert metrics.spearman(a, b) == pytest.approx(spearmanr(a, b).statistic)
    assert metrics.spearman(np.ones(4), np.arange(4)) == 0.0


def test_drops_and_evidence_in_closed_form():
    w = np.array([0.5, 4.0, -1.0, 2.0, 1.0])
    readings = {"truth": (w.copy(), 1.0), "reversed": (-w, 2.0), "flat": (np.zeros(5), None)}
    record = score_context(linear(w), 5, [1], readings, masks=16, seed=0)
    truth, reversed_, flat = (record["readings"][k] for k in ("truth", "reversed", "flat"))
    assert record["full_log_p"] == pytest.approx(w.sum())
    assert truth["lds"] == pytest.approx(1.0) and reversed_["lds"] == pytest.approx(-1.0)
    assert truth["drop@1"] == pytest.approx(4.0) and truth["drop@3"] == pytest.approx(4.0 + 2.0 + 1.0)
    assert reversed_["drop@1"] == pytest.approx(-1.0) and reversed_["drop@3"] == pytest.approx(-1.0 + 0.5 + 1.0)
    assert flat["drop@1"] == pytest.approx(0.5)  # ties: the earlier source first
    assert (truth["evidence@1"], reversed_["evidence@1"], reversed_["evidence@3"]) == (1.0, 0.0, 0.0)
    assert flat["evidence@3"] == 1.0 and flat["evidence@1"] == 0.0
    assert truth["logit_drop@1"] > 0
    # a second run with the first's LDS outcomes reuses them (no LDS mask is run again)
    seen = []

    def counting(keeps):
        seen.extend(map(tuple, keeps))
        return linear(w)(keeps)

    again = score_context(counting, 5, [1], {"truth": (w, 1.0)}, masks=16, seed=0, known=record)
    assert again["lds_log_p"] == record["lds_log_p"] and len(seen) <= 3


def test_the_report_table_means_and_costs():
    records = [{"forward_seconds": 2.0, "readings": {"a": {"lds": 0.5, "drop@1": 1.0, "drop@3": 2.0, "evidence@1": 1.0,
                                                           "evidence@3": 1.0, "seconds": 4.0}}},
               {"forward_seconds": 1.0, "readings": {"a": {"lds": 0.7, "drop@1": 3.0, "drop@3": 2.0, "evidence@1": 0.0,
                                                           "evidence@3": 1.0, "seconds": 4.0}}}]
    summary = ContextReport(["a"], records, {"masks": 4}).summary()["a"]
    assert summary["lds"][0] == pytest.approx(0.6) and summary["lds"][1] == pytest.approx(0.1)
    assert summary["cost"][0] == pytest.approx(3.0) and summary["evidence@1"][0] == 0.5
    assert "| a | 0.600 ± 0.100 | 2.000 ± 1.000 | 2.000 ± 0.000 | 0.50 | 1.00 | 3.0 | 2 |" in \
        ContextReport(["a"], records, {}).table()


def test_labels():
    assert label_options("contextcite@32") == {"method": "contextcite", "n_ablations": 32}
    assert label_options("gradient_x_input@response") == {"method": "gradient_x_input", "scope": "response"}
    assert label_options("budgeted@fast") == {"method": "budgeted", "budget": "fast"}
    assert label_options("budgeted@12") == {"method": "budgeted", "budget": 12.0}
    with pytest.raises(InvalidInputError, match="budget"):
        label_options("budgeted@cheap")
    with pytest.raises(InvalidInputError, match="no n_ablations"):
        label_options("normxlogit@8")
    with pytest.raises(InvalidInputError, match="a label is"):
        label_options("normxlogit@x")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny Qwen2 causal LM with a chat template, taking prompts of a few hundred tokens."""
    return tiny.chat_qwen2_folder(tmp_path_factory.mktemp("qwen2-chat"))


@pytest.mark.skipif(not (SHARED / "qnli").is_dir(), reason="the shared GLUE data folder is not here")
def test_the_command_end_to_end_and_again_from_its_records(folder, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["evaluate", "context", "--model", folder, "--data", str(SHARED), "--kinds", "qa,instruction",
            "--length", "120", "--limit", "2", "--methods", "normxlogit,leave_one_out,contextcite@8,random,position",
            "--masks", "6", "--max-new-tokens", "3", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    for name in ("normxlogit", "leave_one_out", "contextcite@8", "random", "position"):
        assert f"| {name} |" in table
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["contexts"] == 2 and "--methods normxlogit,leave_one_out" in report["settings"]["command"]
    assert (out / "table.md").read_text().startswith("| reading | LDS ↑")
    for record in report["records"]:
        assert [record["kind"] for record in report["records"]] == ["qa", "instruction"]
        loo = record["readings"]["leave_one_out"]
        assert len(loo["scores"]) == record["sources"] >= 2 and len(record["lds_log_p"]) == 6
        # leave-one-out's top score is the drop when its top source is removed: the same engine reads both
        assert loo["drop@1"] == pytest.approx(max(loo["scores"]), abs=1e-3)
        assert record["readings"]["contextcite@8"]["seconds"] > 0 and record["readings"]["random"]["seconds"] is None
        assert record["readings"]["normxlogit"]["forward_seconds"] > 0  # its own plain forward, run just before
    lines = (out / "contexts.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert main(argv) == 0  # again: every context read from its record, nothing appended
    assert (out / "contexts.jsonl").read_text().splitlines() == lines
    assert json.loads((out / "report.json").read_text())["summary"] == report["summary"]
    assert "--device" not in report["settings"]["command"]
    assert main([*argv, "--device", "cpu"]) == 0  # the device the model ran on is part of the command
    assert json.loads((out / "report.json").read_text())["settings"]["command"].endswith(f"--device cpu --out {out}")
    capsys.readouterr()
    assert main([*argv, "--methods", "nosuch"]) == 2  # the last --methods counts
    assert "nosuch" in capsys.readouterr().err


class _Example:
    """The fields evaluate_context reads of a context example."""

    def __init__(self, i):
        self.id, self.kind, self.length, self.evidence = f"x{i}", "qa", 40, (0,)
        self.sources = ["The film was good.", "It rained all day.", "Paris is in France."]
        self.query = "Was the film good?"


def _records(monkeypatch, model, tokenizer, out, weights=None, kill_after=None):
    """evaluate_context on two contexts with calibrated_attention from ``weights``; ``kill_after``: stop writing
    after that many bytes of the records file (a kill mid-write)."""
    from normx.evaluation.context import readings, run

    def read(model, tokenizer, prepared, method, options):
        return readings.read_method(model, tokenizer, prepared, method, options)

    monkeypatch.setattr(run, "read_method", read)
    return run.evaluate_context(model, tokenizer, [_Example(0), _Example(1)], ["calibrated_attention", "random"],
                                method_options={"calibrated_attention": {"weights": str(weights)}}, masks=4,
                                max_new_tokens=2, out=out, progress=False)


def test_records_are_whole_after_a_kill_and_never_reused_under_other_weights(tmp_path, monkeypatch):
    from normx.evaluation.context import run
    from normx.methods.calibrated import weights as stored
    from normx.methods.calibrated.readings import shape
    from normx.models import get_adapter
    from normx.models.identity import model_identity

    model, tokenizer = tiny.build("LlamaForCausalLM")
    blocks, heads = shape(model, get_adapter(model))
    files = []
    for value in (1.0, -1.0):
        record = stored.make_record("calibrated_attention", model_identity(model), ["attention"],
                                    {"attention": np.full((blocks, heads), value)}, (blocks, heads), 1.0, "logprob",
                                    0.5, {"contexts": 2})
        files.append(stored.write(record, tmp_path / f"w{value}.json"))
    monkeypatch.setattr(run, "prepare", lambda model, tok, example, n, ids=None: _prepared(model, tok, example, ids))
    out = tmp_path / "run"
    first = _records(monkeypatch, model, tokenizer, out, files[0])
    file = out / run.RECORDS
    lines = file.read_text(encoding="utf-8").splitlines()
    file.write_text(lines[0] + "\n" + lines[1][:50], encoding="utf-8")  # killed while writing the second record
    again = _records(monkeypatch, model, tokenizer, out, files[0])  # the second context again, the first reused
    assert [r["readings"]["calibrated_attention"]["scores"] for r in again.records] == \
        [r["readings"]["calibrated_attention"]["scores"] for r in first.records]
    kept = file.read_text(encoding="utf-8").splitlines()
    assert len(kept) == 2 and all(json.loads(line) for line in kept)  # whole lines only, the cut one gone
    monkeypatch.setattr(run, "read_method", lambda *a: pytest.fail("a reading was recomputed"))
    run.evaluate_context(model, tokenizer, [_Example(0), _Example(1)], ["calibrated_attention", "random"],
                         method_options={"calibrated_attention": {"weights": str(files[0])}}, masks=4,
                         max_new_tokens=2, out=out, progress=False)  # everything from the records now
    other = _records(monkeypatch, model, tokenizer, out, files[1])  # other weights: read again, not reused
    for old, new in zip(first.records, other.records):
        assert np.allclose(new["readings"]["calibrated_attention"]["scores"],
                           [-s for s in old["readings"]["calibrated_attention"]["scores"]])
        assert new["readings"]["random"]["scores"] == old["readings"]["random"]["scores"]
    assert other.settings["methods"]["calibrated_attention"]["weights_sha256"] == stored.read(files[1])["sha256"]
    assert not list(out.glob(".*.tmp"))


def _prepared(model, tokenizer, example, response_ids):
    from normx.evaluation.context.readings import Prepared

    prompt = " ".join(example.sources) + "\n\n" + example.query
    ids = tokenizer(prompt)["input_ids"]
    spans, at = [], 1
    for source in example.sources:
        n = len(tokenizer(" " + source, add_special_tokens=False)["input_ids"])
        spans.append((at, min(at + n, len(ids) - 1)))
        at += n
    response = list(response_ids or [5, 6])
    return Prepared(example, prompt, ids + response, len(ids), spans, "", chat=False)


@pytest.mark.parametrize(("argv", "message"), [
    (["--masks", "0"], "--masks must be at least 2"),
    (["--model", "minilm-sst2"], "is a sequence-classification model"),
])
def test_evaluate_context_refuses_before_the_model_loads(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("normx.zoo.loading.load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    base = ["evaluate", "context", "--model", "smollm2", "--data", str(SHARED), "--limit", "1",
            "--out", str(tmp_path / "run")]
    assert main([*base, *argv]) == 2
    assert message in capsys.readouterr().err


def test_an_answer_of_no_tokens_is_refused_not_indexed():
    """A model that ends its answer at once leaves no outcome to remove sources from: said, before any pass."""
    from normx.evaluation.context.readings import Prepared, response_outcomes

    model, tokenizer = tiny.build("LlamaForCausalLM")
    ids = tokenizer("One two. Three four.")["input_ids"]
    prepared = Prepared(None, "One two. Three four.", ids, len(ids), [(1, 3), (3, len(ids))], "", chat=False)
    with pytest.raises(InvalidInputError, match="no tokens"):
        response_outcomes(model, tokenizer, prepared, np.ones((2, 2), bool))
