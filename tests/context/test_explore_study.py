"""studies/context/explore.py (#46): ``collect`` keeps each context's training instance where
``training.kept_instances`` reads it back with the calibrate study's seeds (context i: seed i) and writes each
source's drop when it is hidden from every row after the context's end, which equals
``hidden_source_outcomes(first_row=the context's end)`` and a plain forward pass whose mask hides it from those rows;
a rerun resumes; ``report`` prints the cross-validated table from those files, and a damaged side line is a clear
error (exit 2)."""

from __future__ import annotations

import gzip
import json

import locations
import numpy as np
import pytest
import tiny

import normx
from normx._torch import torch
from normx.core.handle import model_handle
from normx.data.contexts import context_examples
from normx.evaluation.context.metrics import lds_masks
from normx.methods.calibrated import training
from normx.methods.calibrated.fit import spearman
from normx.methods.decoder.knockout import hidden_source_outcomes
from studies.context import explore, few, fidelity, learned, presence

SHARED = locations.SHARED
FAMILIES = "attention,norm,logit,tokens,source_knockout"
pytestmark = pytest.mark.skipif(not (SHARED / "qnli").is_dir(), reason="the shared GLUE data folder is not here")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny Qwen2 causal LM with a chat template."""
    return tiny.chat_qwen2_folder(tmp_path_factory.mktemp("qwen2-chat"))


def response_log_p(model, ids, prompt_length, hidden=(), first_row=None):
    """The response's log-probability from one plain pass whose mask hides ``hidden`` from rows first_row..T-2."""
    total = len(ids)
    allowed = torch.ones(total, total).tril().bool()
    if hidden:
        allowed[first_row:total - 1, list(hidden)] = False
    mask = torch.where(allowed, torch.zeros(()), torch.finfo(torch.float32).min)[None, None]
    tensor = torch.tensor([ids])
    with torch.no_grad():
        logits = model(input_ids=tensor, attention_mask=mask).logits[0, prompt_length - 1:-1].double()
    return float(torch.log_softmax(logits, -1).gather(1, tensor[0, prompt_length:, None]).sum())


def test_collect_keeps_instances_and_drops_and_report_prints_the_table(folder, tmp_path, capsys):
    out = tmp_path / "study"
    common = ["collect", "--model", folder, "--data", str(SHARED), "--out", str(out), "--first", "3", "--count", "2",
              "--length", "120", "--masks", "8", "--max-new-tokens", "3", "--families", FAMILIES, "--workers", "2"]
    for worker in ("0", "1"):
        assert explore.main([*common, "--worker", worker]) == 0
    assert "1 contexts of 1" in capsys.readouterr().out
    examples = context_examples(["qa", "claim"], "train", 120, 5, 0, SHARED)[3:]
    records = [json.loads(line) for k in (0, 1) for line in (out / f"side_{k}.jsonl").read_text().splitlines()]
    assert [(r["id"], r["seed"]) for r in records] == [(examples[0].id, 3), (examples[1].id, 4)]  # one block each
    # the calibrate study's convention: the i-th context's masks from seed first + i
    kept = training.kept_instances(out / "train", [e.id for e in examples], masks=8, seed=3,
                                   families=FAMILIES.split(","))
    assert [inst.id for inst in kept] == [e.id for e in examples]
    model, _ = normx.load_model(folder)
    for record, inst in zip(records, kept):
        ids, length, spans = record["ids"], record["prompt_length"], record["spans"]
        assert inst.masks.shape == (8, len(spans)) and len(record["drops"]) == len(spans)
        end = spans[-1][1]
        log_p, _ = hidden_source_outcomes(model_handle(model), ids, length, [list(range(a, b)) for a, b in spans],
                                          "test", first_row=end)
        np.testing.assert_allclose(record["drops"], (log_p[0] - log_p[1:]).sum(1).numpy(), rtol=1e-9, atol=1e-9)
        plain = response_log_p(model, ids, length)
        want = [plain - response_log_p(model, ids, length, range(a, b), end) for a, b in spans]
        np.testing.assert_allclose(record["drops"], want, rtol=1e-4, atol=1e-4)
        assert np.abs(want).max() > 1e-4  # the hiding changes something
    assert explore.main([*common, "--worker", "0"]) == 0  # a rerun resumes: nothing again
    assert "0 contexts of 1" in capsys.readouterr().out
    assert len((out / "side_0.jsonl").read_text().splitlines()) == 1

    assert explore.main(["report", "--out", str(out), "--masks", "8"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("2 contexts (claim 1, qa 1), 8 masks each")
    for row in ("| tokens+q0 | ", "| tokens+source_knockout+q0 | ", "| norm | head | ", "| LASSO | "):
        assert row in printed
    assert (out / "report.md").read_text() == printed
    assert explore.main(["report", "--out", str(out), "--masks", "8"]) == 0  # deterministic
    assert capsys.readouterr().out == printed
    # the packed form of a lent card's run (c{n}_ entries; side lines with q0, no seed): the same table
    part, lines = {}, []
    for n, (record, inst) in enumerate(zip(reversed(records), reversed(kept))):  # order comes from the seeds
        part.update({f"c{n}_id": inst.id, f"c{n}_key": training._key(8, record["seed"]), f"c{n}_masks": inst.masks,
                     f"c{n}_y": inst.y, **{f"c{n}_f_{f}": v for f, v in inst.features.items()}})
        lines.append(json.dumps({"id": record["id"], "index": n, "ids": record["ids"],
                                 "prompt_length": record["prompt_length"], "spans": record["spans"],
                                 "q0": record["drops"]}))
    np.savez(tmp_path / "part.npz", **part)
    with gzip.open(tmp_path / "side.jsonl.gz", "wt") as side:
        side.write("\n".join(lines) + "\n")
    assert explore.main(["report", "--out", str(tmp_path / "packed"), "--masks", "8", "--packed",
                         str(tmp_path / "part.npz"), "--side", str(tmp_path / "side.jsonl.gz")]) == 0
    assert capsys.readouterr().out == printed
    # studies/context/fidelity.py on the same packed run: re-read from the first source with the positions closed
    # up IS the removal the kept outcomes were measured with
    assert fidelity.main(["--packed", str(tmp_path / "part.npz"), "--side", str(tmp_path / "side.jsonl.gz"),
                          "--masks", "8", "--model", folder, "--count", "2", "--threads", "1"]) == 0
    table = capsys.readouterr().out
    assert table.startswith("2 contexts, 8 masks each")
    cells = {line.split(" (")[0][2:]: line.split(" | ")[1:] for line in table.splitlines() if line.startswith("| ")}
    assert cells["all"][1].strip(" |") == "1.000"
    assert all(-1 <= float(v.strip(" |")) <= 1 for row in ("response", "query") for v in cells[row])
    # studies/context/presence.py on the same packed run: each context's presence features, kept whole and reused
    # (the rerun names no loadable model), and the family sets' table
    keep = tmp_path / "presence.npz"
    args = ["--packed", str(tmp_path / "part.npz"), "--side", str(tmp_path / "side.jsonl.gz"), "--masks", "8",
            "--keep", str(keep), "--threads", "1"]
    assert presence.main([*args, "--model", folder]) == 0
    table = capsys.readouterr().out
    model, _ = normx.load_model(folder)
    for record in records:
        want = training.source_features(model, record["ids"], record["prompt_length"], record["spans"],
                                        ["presence"])["presence"][:, 0, 0]
        np.testing.assert_allclose(np.load(keep)[record["id"]], want, rtol=1e-6, atol=1e-9)
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| families")]
    assert len(rows) == len(presence.SETS) and all(-1 <= float(r.split(" | ")[1]) <= 1 for r in rows)
    assert presence.main([*args, "--model", str(tmp_path / "no-model-here")]) == 0
    assert capsys.readouterr().out.split("\n")[2:] == table.split("\n")[2:]  # (the first line times the run)
    # with --spread --probes: the response_norm sets, the shipped set with each probe, and the per-kind fit
    assert presence.main([*args, "--model", str(tmp_path / "no-model-here"), "--spread", "--probes"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "families" not in line]
    assert len(rows) == len(presence.SETS) + len(presence.NORM_SETS) + len(presence.PROBES) + 1
    assert all(-1 <= float(v) <= 1 for r in rows[:-1] for v in r.split(" | ")[1:4])
    assert rows[-1].startswith("| tokens + presence + response_norm, fitted within each kind | — | — | — |")  # 1 each
    features = presence.probes(records[0], np.arange(len(records[0]["spans"]), dtype=float))
    spans = np.array(records[0]["spans"])
    np.testing.assert_array_equal(features["after"][:, 0, 0], records[0]["prompt_length"] - spans[:, 1])
    np.testing.assert_array_equal(features["rank"][:, 0, 0], np.arange(len(spans))[::-1] / len(spans))
    # studies/context/learned.py on the same run and kept presence: its table, deterministic
    learned_args = ["--packed", str(tmp_path / "part.npz"), "--side", str(tmp_path / "side.jsonl.gz"), "--masks",
                    "8", "--keep", str(keep), "--threads", "1", "--epochs", "2"]
    assert learned.main(learned_args) == 0
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| ") and "estimator" not in line]
    assert len(rows) == 2 * len(learned.MODELS) and all(-1 <= float(r.split(" | ")[2]) <= 1 for r in rows)
    assert learned.main(learned_args) == 0
    assert capsys.readouterr().out == table
    assert learned.main([*learned_args[:-6], "--keep", str(tmp_path / "none.npz")]) == 2
    # studies/context/few.py: LASSO on K of the masks, the prior, the prior corrected by K; the correction closed form
    assert few.main(learned_args[:-4]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "reading" not in line]
    assert len(rows) == 1 + len(few.COUNTS) * (1 + len(few.PULLS))
    assert all(-1 <= float(r.split(" | ")[2]) <= 1 for r in rows)
    rng = np.random.default_rng(0)
    x, prior, delta = rng.integers(0, 2, (10, 4)).astype(float), rng.normal(size=4), np.array([1.0, 0.0, -1.0, 0.5])
    y = 0.5 + x @ (prior + delta)
    np.testing.assert_allclose(few.toward(x, y, prior, 1e-9), prior + delta, atol=1e-5)
    np.testing.assert_allclose(few.toward(x, y, prior, 1e9), prior, atol=1e-6)
    # --records: held-out records (two lines for one context: the second adds a reading), the prior's row by hand
    masks = lds_masks(4, 32, 0)
    outcome = masks @ np.array([2.0, -1.0, 0.5, 0.0]) + rng.normal(scale=0.3, size=32)
    lines = [{"id": "qa-heldout-0", "sources": 4, "lds_log_p": outcome.tolist(),
              "readings": {"calibrated_attention": {"scores": [1.0, -1.0, 0.0, 0.0]}}},
             {"id": "qa-heldout-0", "sources": 4, "lds_log_p": outcome.tolist(),
              "readings": {"contextcite@32": {"scores": [2.0, -1.0, 0.5, 0.0]}}}]
    (tmp_path / "records.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    assert few.main(["--records", str(tmp_path / "records.jsonl")]) == 0
    rows = {r.split(" | ")[0][2:]: float(r.split(" | ")[2]) for r in capsys.readouterr().out.splitlines()
            if r.startswith("| ") and "reading" not in r}
    want = np.mean([spearman(masks[t] @ [1.0, -1.0, 0.0, 0.0], outcome[t]) for t in np.array_split(np.arange(32), 4)])
    assert rows["prior"] == pytest.approx(want, abs=5e-4) and "contextcite@32 (its own 32 ablations)" in rows
    assert few.main(["--records", str(tmp_path / "records.jsonl"), "--prior", "nothing"]) == 2


def test_damaged_side_lines_are_errors_for_report_and_dropped_by_collect(tmp_path, capsys):
    side = tmp_path / "side_0.jsonl"
    good = {"id": "qa-train-120-0-1", "seed": 3, "ids": [1, 2, 3, 4, 5, 6], "prompt_length": 5,
            "spans": [[0, 2], [2, 3]], "drops": [0.5, -0.1]}
    side.write_text(json.dumps(good) + "\n" + json.dumps({**good, "drops": [1.0]}) + "\n")
    assert explore.main(["report", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("explore: error: ") and f"{side}:2" in err and "one finite number a span" in err
    side.write_text(json.dumps(good) + "\n" + json.dumps(good)[:20] + "\n")
    assert [r["id"] for r in explore.read_side(side, repair=True)] == [good["id"]]
    assert side.read_text() == json.dumps(good) + "\n"  # written again whole
    assert explore.main(["report", "--out", str(tmp_path)]) == 2  # no kept instance for it
    assert "the report needs 2 or more" in capsys.readouterr().err
    assert explore.main(["report", "--out", str(tmp_path), "--packed", str(side)]) == 2  # --packed without --side
    assert "--side" in capsys.readouterr().err
