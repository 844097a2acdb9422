"""studies/generation/peers.py's parts: the peers' rows are the columns their libraries compute for each step
(inseq's attention is normx's attention; inseq's input x gradient with a logit target is normx's gradient_x_input,
on exactly normx's ids; Captum's per-step rows are its one call's); the results file is keyed by method (an entry
added or replaced leaves the others, entries on other steps are refused) and the table's paired differences are the
per-step ones. Scoring supplied rows with normx's own protocol is tested with the protocol
(tests/evaluation/test_generation_faithfulness.py)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import tiny

import normx
from studies.generation import peer_results, peer_rows

PROMPTS = ["the film was a gripping story of", "a dull movie with a predictable plot and"]


def generations(model, tok, method: str = "normxlogit", steps: int = 3):
    first = normx.explain_generation(model, tok, PROMPTS, max_new_tokens=steps)
    continuations = [g.token_ids[g.prompt_length:] for g in first]
    return normx.explain_generation(model, tok, PROMPTS, method=method, target=continuations), continuations


def test_inseq_rows_are_the_steps_columns():
    pytest.importorskip("inseq")
    model, tok = tiny.build("LlamaForCausalLM", fresh=True)
    tok = copy.deepcopy(tok)  # inseq sets the padding side to left: never on the cached tokenizer other tests share
    attention, _ = generations(model, tok, "attention")
    gradient, _ = generations(model, tok, "gradient_x_input")
    for method in ("attention", "input_x_gradient"):
        wrapped = peer_rows.inseq_model(model, tok, method)
        for g, ours_attention, ours_gradient in zip(attention, attention, gradient):
            options = {"attributed_fn": "logit"} if method == "input_x_gradient" else {}
            attribution, seen, _ = peer_rows.inseq_attribute(wrapped, model, tok, g.token_ids, g.prompt_length, method,
                                                         **options)
            assert seen == list(g.token_ids)  # the ids normx generated, even where their text re-tokenises otherwise
            if method == "attention":  # inseq's default aggregation: normx's attention reading
                for mine, theirs in zip(ours_attention.rows(), peer_rows.inseq_rows(attribution, g.prompt_length, 3)):
                    np.testing.assert_allclose(theirs, mine, rtol=1e-5, atol=1e-6)
            else:  # the logit target, L1 over the embedding: normx's gradient_x_input
                theirs_rows = peer_rows.inseq_rows(attribution, g.prompt_length, 3, raw_l1=True)
                for mine, theirs in zip(ours_gradient.rows(), theirs_rows):
                    np.testing.assert_allclose(theirs, mine, rtol=1e-4, atol=1e-6 * np.abs(mine).max())
                default = peer_rows.inseq_rows(attribution, g.prompt_length, 3)  # its own L2, each column sums to 1
                assert all(len(r) == g.prompt_length + t and abs(r.sum() - 1) < 1e-5 for t, r in enumerate(default))
    assert model.config._attn_implementation != "eager"  # inseq's attention ran eager and gave the setting back


def test_captum_per_step_rows_are_its_one_calls_columns():
    import torch

    model, tok = tiny.build("LlamaForCausalLM")
    g = generations(model, tok)[0][0]
    attribution = peer_rows.captum_attribution(model, tok)
    rows = peer_rows.captum_rows(attribution, tok, g.token_ids, g.prompt_length)
    assert [len(r) for r in rows] == [g.prompt_length + t for t in range(g.steps)]
    whole = attribution.attribute(peer_rows.captum_input(tok, g.token_ids[:g.prompt_length]),
                                  target=torch.tensor(g.token_ids[g.prompt_length:])).token_attr
    for t, row in enumerate(rows):
        np.testing.assert_allclose(row[:g.prompt_length], whole[t].numpy(), rtol=1e-5, atol=1e-7)


def test_results_are_keyed_by_method(tmp_path):
    path = tmp_path / "peers.json"
    setup = {"ids": [[1, 2, 3]]}
    peer_results.update_report(path, "faithfulness", "setup", setup, {"a": {"x": 1}, "b": {"x": 2}})
    peer_results.update_report(path, "faithfulness", "setup", setup, {"a": {"x": 3}})
    assert json.loads(path.read_text())["faithfulness"]["methods"] == {"a": {"x": 3}, "b": {"x": 2}}
    with pytest.raises(SystemExit, match="other setup"):
        peer_results.update_report(path, "faithfulness", "setup", {"ids": [[1, 2, 4]]}, {"c": {"x": 4}})
    peer_results.update_report(path, "cost", "sequences", {"64": 1}, {"a": {"64": {"ratio": 1}}}, merge=True)
    peer_results.update_report(path, "cost", "sequences", {"64": 1}, {"a": {"512": {"ratio": 2}}}, merge=True)
    report = json.loads(path.read_text())
    assert report["cost"]["methods"] == {"a": {"64": {"ratio": 1}, "512": {"ratio": 2}}}
    assert report["faithfulness"]["methods"]["b"] == {"x": 2}  # the other section untouched
    peer_results.update_report(path, "faithfulness", "setup", {"ids": [[1, 2, 4]]}, {"c": {"x": 4}}, fresh=True)
    assert json.loads(path.read_text())["faithfulness"]["methods"] == {"c": {"x": 4}}


def test_table_paired_differences_from_recency(tmp_path):
    rng = np.random.default_rng(0)
    def entry(values):
        values = {mode: list(v) for mode, v in values.items()}
        return {"aopc": {m: float(np.mean(v)) for m, v in values.items()}, "per_step": values, "steps": 5,
                "standard_error": {m: float(np.std(v, ddof=1) / np.sqrt(5)) for m, v in values.items()}}

    base = {mode: rng.random(5) for mode in peer_rows.MODES}
    shifted = {"comprehensiveness": base["comprehensiveness"] + [0.1, 0.2, 0.3, 0.4, 0.5],
               "sufficiency": base["sufficiency"] - 0.05}
    path = tmp_path / "peers.json"
    peer_results.update_report(path, "faithfulness", "setup", {},
                               {"recency": entry(base), "lxt_attnlrp": entry(shifted)})
    cost = {"ratio": 61.2, "seconds": 12.3, "peak_mib": 130.0, "forward_seconds": 0.2, "forward_peak_mib": 20.0,
            "cpu": "cpu", "cpus": 2, "threads": 1, "date": "2026-01-02 00:00 UTC"}
    peer_results.update_report(path, "cost", "sequences", {"64": {"tokens": 62, "prompt_tokens": 30}},
                        {"lxt_attnlrp": {"64": cost}})
    lines = peer_results.table(path).splitlines()
    assert "62 tok: × forward (s)" in lines[0] and "512 tok" not in lines[0]
    row = next(line for line in lines if line.startswith("| `lxt_attnlrp`"))
    se = np.std([0.1, 0.2, 0.3, 0.4, 0.5], ddof=1) / np.sqrt(5)
    assert f"+0.300 ± {se:.3f}" in row and "−0.050 ± 0.000" in row and "61.2 (12.3)" in row and "| 130 |" in row
    recency = next(line for line in lines if line.startswith("| `recency`"))
    assert recency.count("—") == 4  # no difference from itself, no cost measured
