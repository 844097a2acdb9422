"""The faithfulness evaluation: perturbation protocol, metrics with known answers, the pipeline and the CLI."""

import csv
import json
import math
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

import locations
import numpy as np
import pytest
import tiny
import torch

import normx
from normx.cli.main import main
from normx.core.inputs import encode
from normx.core.labels import LabelSpace
from normx.data.glue import Example
from normx.errors import InvalidInputError, NormxError, UnsupportedModelError
from normx.evaluation import faithfulness as faith
from normx.evaluation.faithfulness.perturbation import (
    K_VALUES,
    Item,
    Perturber,
    perturb,
    perturb_count,
    ranking,
    same_length_chunks,
)

CLS, SEP, MASK, PAD = 101, 102, 103, 0
EVIDENCE = 7  # the one token id the evidence model reads


class EvidenceModel(torch.nn.Module):
    """A fake classifier whose output depends only on how many (attended) evidence tokens the input has:
    logits = [0, WEIGHT * count + BIAS], so p(positive) = sigmoid(WEIGHT * count + BIAS). With ``regression`` the
    single output is WEIGHT * count + BIAS. It records every batch it is given."""

    WEIGHT, BIAS = 1.5, -1.0

    def __init__(self, regression: bool = False):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(self.WEIGHT))
        self.regression = regression
        self.batches = []

    def forward(self, input_ids, attention_mask, **extra):
        self.batches.append({"input_ids": input_ids.clone(), "attention_mask": attention_mask.clone(), **extra})
        count = ((input_ids == EVIDENCE) & attention_mask.bool()).sum(-1).float()
        score = self.scale * count + self.BIAS
        logits = score[:, None] if self.regression else torch.stack([torch.zeros_like(score), score], -1)
        return SimpleNamespace(logits=logits)


def evidence_items(rng, n_items=12):
    """Encoder-style inputs [CLS] w ... w [SEP] with a few evidence tokens at random places."""
    items = []
    for _ in range(n_items):
        length = int(rng.integers(6, 20))
        words = rng.integers(1000, 2000, size=length)
        words[rng.choice(length, size=int(rng.integers(1, 4)), replace=False)] = EVIDENCE
        ids = (CLS, *map(int, words), SEP)
        items.append(Item(ids, (True,) + (False,) * length + (True,), 0))
    return items


def oracle_scores(item):
    """Evidence tokens first; [CLS] gets the highest score of all, so only the protocol keeps it unperturbed."""
    ids = np.asarray(item.ids)
    return np.where(ids == CLS, 10.0, np.where(ids == EVIDENCE, 1.0, 0.0)) + np.linspace(0, 1e-3, len(ids))


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def expected_probability(item, k, mode, oracle=True):
    """p(positive | perturbed) by hand: the oracle removes evidence first (comprehensiveness) or keeps it
    (sufficiency); ``int(n * k)`` tokens counted over all n tokens, capped at the n - 1 rankable ones."""
    n, evidence = len(item.ids), item.ids.count(EVIDENCE)
    count = min(int(n * k), n - 1)
    left = max(evidence - count, 0) if mode == "comprehensiveness" else min(evidence, count)
    return sigmoid(EvidenceModel.WEIGHT * left + EvidenceModel.BIAS)


def random_scores(items, seed):
    rng = np.random.default_rng(seed)
    return [rng.random(len(item.ids)) for item in items]


def curves_for(model, items, scores, **kwargs):
    runner = Perturber(model, "mask", MASK, **kwargs)
    original = runner.logits(items)
    perturbed = runner.perturbed_logits(items, scores)
    return original, {mode: faith.classification_curves(original, logits, None)["confidence_drop"]
                      for mode, logits in perturbed.items()}


# ---- metrics with known answers -------------------------------------------------------------------------------------

def test_aopc_is_the_mean_over_10_to_90_percent():
    assert faith.aopc(list(K_VALUES)) == pytest.approx(0.5)  # mean of 0.1 .. 0.9
    curve = [1000.0] + [0.25] * 9 + [-1000.0]  # K = 0 and K = 100 do not count
    assert faith.aopc(curve) == pytest.approx(0.25)
    with pytest.raises(InvalidInputError):
        faith.aopc([0.1, 0.2])
    per_example = np.array([[9.0] + [a] * 9 + [-9.0] for a in (0.1, 0.2, 0.6)])  # per-example AOPCs 0.1, 0.2, 0.6
    assert faith.standard_error(per_example) == pytest.approx(np.std([0.1, 0.2, 0.6], ddof=1) / math.sqrt(3))
    assert math.isnan(faith.standard_error(per_example[:1]))


def test_oracle_ranking_gives_the_hand_computed_maximal_comprehensiveness_and_beats_random():
    rng = np.random.default_rng(0)
    items = evidence_items(rng)
    model = EvidenceModel()
    original, oracle = curves_for(model, items, [oracle_scores(i) for i in items])
    p0 = np.array([sigmoid(EvidenceModel.WEIGHT * i.ids.count(EVIDENCE) + EvidenceModel.BIAS) for i in items])
    assert faith.softmax(original)[:, 1] == pytest.approx(p0, abs=1e-6)
    for mode in ("comprehensiveness", "sufficiency"):
        expected = [np.mean(p0 - [expected_probability(i, k, mode) for i in items]) for k in K_VALUES]
        assert oracle[mode] == pytest.approx(expected, abs=1e-6)
    assert oracle["comprehensiveness"][0] == 0 and oracle["sufficiency"][-1] == 0
    for seed in range(5):  # no ranking removes evidence faster than the oracle, at any K
        _, other = curves_for(model, items, random_scores(items, seed))
        assert np.all(oracle["comprehensiveness"] >= other["comprehensiveness"] - 1e-9)
        assert np.all(oracle["sufficiency"] <= other["sufficiency"] + 1e-9)
        assert faith.aopc(oracle["comprehensiveness"]) > faith.aopc(other["comprehensiveness"]) + 0.05
        assert faith.aopc(oracle["sufficiency"]) < faith.aopc(other["sufficiency"]) - 0.05


def test_sufficiency_of_the_reversed_oracle_is_the_worst():
    items = evidence_items(np.random.default_rng(1))
    model = EvidenceModel()
    _, oracle = curves_for(model, items, [oracle_scores(i) for i in items])
    reverse = [-oracle_scores(i) for i in items]
    _, worst = curves_for(model, items, reverse)
    assert faith.aopc(worst["sufficiency"]) > faith.aopc(oracle["sufficiency"]) + 0.1
    assert faith.aopc(worst["comprehensiveness"]) < faith.aopc(oracle["comprehensiveness"]) - 0.1


def test_accuracy_curve_against_gold_labels():
    items = evidence_items(np.random.default_rng(2))
    model = EvidenceModel()
    runner = Perturber(model, "mask", MASK)
    original = runner.logits(items)
    perturbed = runner.perturbed_logits(items, [oracle_scores(i) for i in items])
    gold = np.ones(len(items), dtype=int)
    curves = faith.classification_curves(original, perturbed["comprehensiveness"], gold)
    by_hand = [np.mean([expected_probability(i, k, "comprehensiveness") > 0.5 for i in items]) for k in K_VALUES]
    assert curves["accuracy"] == pytest.approx(by_hand)
    assert curves["accuracy"][-1] == 0  # no evidence left: everything predicted negative


def test_regression_pearson_with_gold_scores():
    items = evidence_items(np.random.default_rng(3))
    model = EvidenceModel(regression=True)
    runner = Perturber(model, "mask", MASK)
    perturbed = runner.perturbed_logits(items, [oracle_scores(i) for i in items])
    gold = np.array([i.ids.count(EVIDENCE) + 0.01 * j for j, i in enumerate(items)])
    curves = faith.regression_curves(perturbed["comprehensiveness"], gold)["pearson"]
    for k, value in zip(K_VALUES, curves):
        n = [len(i.ids) for i in items]
        left = [max(i.ids.count(EVIDENCE) - min(int(m * k), m - 1), 0) for i, m in zip(items, n)]
        predictions = EvidenceModel.WEIGHT * np.array(left, dtype=float) + EvidenceModel.BIAS
        if np.ptp(predictions) == 0:
            assert math.isnan(value)  # all evidence removed: constant predictions have no correlation
        else:
            assert value == pytest.approx(np.corrcoef(predictions, gold)[0, 1], abs=1e-6)
    assert curves[0] > 0.9


# ---- the perturbation protocol ---------------------------------------------------------------------------------------

def test_ranking_excludes_the_pooled_token_and_orders_by_signed_score():
    item = Item((CLS, 11, 12, 13, SEP), (True, False, False, False, True), 0)
    scores = np.array([9.0, -1.0, 2.0, 2.0, np.nan])
    assert ranking(scores, item).tolist() == [2, 3, 1, 4]  # ties keep text order, NaN last, [CLS] never
    assert ranking(scores, item, "exclude").tolist() == [2, 3, 1]
    decoder = Item((1, 11, 12, 13), (True, False, False, False), 3)  # pooled at the last token
    assert 3 not in ranking(np.array([0.0, 1.0, 2.0, 9.0]), decoder).tolist()
    with pytest.raises(InvalidInputError):
        ranking(np.zeros(3), item)


def test_counts_follow_the_authors_rounding():
    item = Item(tuple(range(12)), (), 0)
    order = ranking(np.arange(12.0), item)
    assert [perturb_count(item, order, k) for k in K_VALUES] == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
    assert [perturb_count(item, order, k, "include") for k in (0.3, 0.7)] == [int(12 * 0.3), int(12 * 0.7)]


def test_cls_is_never_masked_and_sep_only_when_special_tokens_are_included():
    items = evidence_items(np.random.default_rng(4), 4)
    for special, sep_masked in (("include", True), ("exclude", False)):
        model = EvidenceModel()
        runner = Perturber(model, "mask", MASK, special_tokens=special)
        runner.perturbed_logits(items, [oracle_scores(i) for i in items])
        assert all((b["input_ids"][:, 0] == CLS).all() for b in model.batches)
        full = perturb(items[0], ranking(oracle_scores(items[0]), items[0], special), 1.0, "comprehensiveness",
                       "mask", MASK, special)
        assert full.ids[0] == CLS and (full.ids[-1] == MASK) == sep_masked
        assert set(full.ids[1:-1]) == {MASK}


def test_masking_keeps_length_and_attention_mask():
    items = evidence_items(np.random.default_rng(5), 6)
    model = EvidenceModel()
    runner = Perturber(model, "mask", MASK)
    runner.perturbed_logits(items, random_scores(items, 0))
    lengths = {len(i.ids) for i in items}
    for batch in model.batches:
        assert batch["attention_mask"].all()  # never padded: every row is the model's plain call on its tokens
        assert batch["input_ids"].shape[1] in lengths
    assert any((b["input_ids"] == MASK).any() for b in model.batches)


def test_deletion_removes_tokens_keeps_the_pooled_one_and_positions_restart():
    item = Item((1, 21, 22, EVIDENCE, 23, 24, 25, 30), (True,) + (False,) * 7, 7, {"token_type_ids": (0,) * 8})
    order = ranking(np.array([0.5, 0.1, 0.2, 0.9, 0.3, 0.4, 0.0, 5.0]), item)
    comp = perturb(item, order, 0.3, "comprehensiveness", "delete")  # int(8 * 0.3) = 2: evidence and <s> go
    assert comp.ids == (21, 22, 23, 24, 25, 30) and comp.pooled == 5 and comp.extra["token_type_ids"] == (0,) * 6
    suff = perturb(item, order, 0.3, "sufficiency", "delete")  # keep the top 2, and the pooled token
    assert suff.ids == (1, EVIDENCE, 30) and suff.pooled == 2
    model = EvidenceModel()
    runner = Perturber(model, "delete", None)
    runner.logits([item, comp, suff])
    shapes = sorted(tuple(b["input_ids"].shape) for b in model.batches[-3:])
    assert shapes == [(1, 3), (1, 6), (1, 8)]  # one unpadded batch per length: nothing but the tokens is passed
    assert all(set(b) == {"input_ids", "attention_mask", "token_type_ids"} and b["attention_mask"].all()
               for b in model.batches[-3:])
    assert model.batches[-3]["input_ids"][0, -1] == 30  # the pooled (last) token stays last


def test_same_length_chunks():
    assert same_length_chunks([3, 5, 3, 5, 5, 2], 2) == [[5], [0, 2], [1, 3], [4]]
    assert same_length_chunks([], 4) == []


def test_models_without_a_mask_token_get_deletion():
    model, tokenizer = tiny.build("LlamaForSequenceClassification")
    assert tokenizer.mask_token_id is None
    report = faith.evaluate(model, tokenizer, tiny.TEXTS, ["normxlogit"], progress=False)
    assert report.settings["perturbation"] == "delete"
    with pytest.raises(InvalidInputError, match="mask token"):
        faith.evaluate(model, tokenizer, tiny.TEXTS, ["normxlogit"], perturbation="mask", progress=False)


def test_decoder_original_logits_match_explain():
    """The batched forward (left or right padding, position ids) gives the model's own prediction."""
    model, tokenizer = tiny.build("LlamaForSequenceClassification")
    report = faith.evaluate(model, tokenizer, tiny.TEXTS, ["normxlogit"], progress=False)
    explanations = normx.explain(model, tokenizer, tiny.TEXTS)
    confidence = np.mean([max(e.probabilities.values()) for e in explanations])
    assert report.original["mean_confidence"] == pytest.approx(confidence, abs=1e-5)


def test_pairs_keep_their_segment_structure():
    tokenizer = tiny.wordpiece_tokenizer()
    encoded = encode(tokenizer, tiny.TEXTS, tiny.PAIRS, 64, "warn")
    for enc in encoded:
        item = Item(tuple(enc.ids), tuple(enc.special), 0, {k: tuple(v) for k, v in enc.extra.items()})
        types = np.asarray(item.extra["token_type_ids"])
        assert types.max() == 1
        order = ranking(np.random.default_rng(0).random(len(item.ids)), item)
        for k in K_VALUES:
            for mode in ("comprehensiveness", "sufficiency"):
                masked = perturb(item, order, k, mode, "mask", tokenizer.mask_token_id)
                assert masked.extra == item.extra
                deleted = perturb(item, order, k, mode, "delete")
                kept = [i for i in range(len(item.ids)) if i not in set(order[:perturb_count(item, order, k)])] \
                    if mode == "comprehensiveness" else \
                    sorted([0, *order[:perturb_count(item, order, k)].tolist()])
                assert list(deleted.ids) == [item.ids[i] for i in kept]
                assert list(deleted.extra["token_type_ids"]) == types[kept].tolist()
                assert np.all(np.diff(deleted.extra["token_type_ids"]) >= 0)  # segment A, then segment B


# ---- the pipeline ----------------------------------------------------------------------------------------------------

def test_perturbed_ids_align_with_the_explained_tokens():
    model, tokenizer = tiny.build("BertForSequenceClassification")
    texts = [*tiny.TEXTS, " ".join(["word"] * 40)]
    pairs = [*tiny.PAIRS, "short"]
    encoded = encode(tokenizer, texts, pairs, 16, "warn")  # the long one is truncated, as explain truncates it
    explanations = normx.explain(model, tokenizer, texts, text_pair=pairs, max_length=16)
    items = faith.run._aligned_items(encoded, explanations, None, "normxlogit")
    for item, exp in zip(items, explanations):
        assert tokenizer.convert_ids_to_tokens(list(item.ids)) == exp.tokens
        assert len(item.ids) == exp.scores.shape[-1] and item.pooled == 0
    shifted = [normx.explain(model, tokenizer, texts[1], text_pair=pairs[1])] * len(texts)
    with pytest.raises(NormxError, match="align"):
        faith.run._aligned_items(encoded, shifted, None, "normxlogit")


def test_evaluate_every_method_on_a_tiny_classifier():
    model, tokenizer = tiny.build("BertForSequenceClassification")
    examples = [Example(t, p, label) for t, p, label in zip(tiny.TEXTS, tiny.PAIRS, (0, 2, 1))]
    report = faith.evaluate(model, tokenizer, examples, method_options={"integrated_gradients": {"n_steps": 4}},
                            progress=False, skip_unsupported=True)
    assert sorted(report.methods + list(report.skipped)) == normx.list_methods()
    assert {"normxlogit", "logat", "l2norm", "integrated_gradients", "random"} <= set(report.methods)
    assert report.settings["perturbation"] == "mask" and report.settings["examples"] == 3
    for method in report.methods:
        comp = report.curve(method, "comprehensiveness", "confidence_drop")
        suff = report.curve(method, "sufficiency", "confidence_drop")
        assert len(comp) == len(K_VALUES) and comp[0] == 0 and suff[-1] == 0
        accuracy = report.curve(method, "comprehensiveness", "accuracy")
        assert accuracy[0] == pytest.approx(report.original["accuracy"])
        assert report.results[method].logits["sufficiency"].shape == (3, len(K_VALUES), 3)
    # K = 100 % comprehensiveness and K = 0 sufficiency perturb every rankable token, whatever the ranking
    ends = {method: (report.curve(method, "comprehensiveness")[-1], report.curve(method, "sufficiency")[0])
            for method in report.methods}
    assert len({tuple(np.round(v, 6)) for v in ends.values()}) == 1


def test_methods_that_cannot_explain_the_model_fail_fast_or_are_skipped(monkeypatch):
    from normx import methods

    def refuse(ctx):
        raise AssertionError("never run: the method says what it supports")

    def llama_only(adapter):
        return None if adapter.family == "llama" else "only for Llama"

    monkeypatch.setitem(methods.registry._METHODS, "llama_only", methods.Method("llama_only", refuse, "test",
                                                                       supports=llama_only))
    model, tokenizer = tiny.build("BertForSequenceClassification")
    calls = []
    monkeypatch.setattr(Perturber, "perturbed_logits", lambda self, *a, **k: calls.append(a) or {})
    with pytest.raises(UnsupportedModelError, match="Llama"):
        faith.evaluate(model, tokenizer, tiny.TEXTS, ["random", "llama_only"], progress=False)
    assert calls == []  # refused before any other method's work
    monkeypatch.undo()
    monkeypatch.setitem(methods.registry._METHODS, "llama_only", methods.Method("llama_only", refuse, "test",
                                                                       supports=llama_only))
    report = faith.evaluate(model, tokenizer, tiny.TEXTS, ["random", "llama_only"], progress=False,
                            skip_unsupported=True)
    assert report.methods == ["random"] and "Llama" in report.skipped["llama_only"]


def test_random_baseline_is_seeded():
    model, tokenizer = tiny.build("BertForSequenceClassification")

    def run(seed):
        report = faith.evaluate(model, tokenizer, tiny.TEXTS * 2, ["random"], progress=False,
                                method_options={"random": {"seed": seed}})
        return report.results["random"].logits["comprehensiveness"]

    assert np.array_equal(run(3), run(3))
    assert not np.array_equal(run(3), run(4))


def test_regression_model_is_scored_by_pearson():
    model, tokenizer = tiny.build("BertForSequenceClassification", num_labels=1)
    examples = [Example(t, p, s) for t, p, s in zip(tiny.TEXTS, tiny.PAIRS, (1.0, 4.5, 2.0))]
    report = faith.evaluate(model, tokenizer, examples, ["normxlogit", "random"], progress=False)
    assert report.regression and report.metrics == ["pearson"]
    outputs = [e.prediction for e in normx.explain(model, tokenizer, tiny.TEXTS, text_pair=tiny.PAIRS)]
    assert report.original["pearson"] == pytest.approx(np.corrcoef(outputs, [1.0, 4.5, 2.0])[0, 1], abs=1e-5)
    assert report.curve("normxlogit", "comprehensiveness", "pearson")[0] == pytest.approx(report.original["pearson"])
    with pytest.raises(InvalidInputError, match="label"):
        faith.evaluate(model, tokenizer, tiny.TEXTS, ["random"], progress=False)


def test_gold_labels_map_task_indices_through_names():
    model, tokenizer = tiny.build("BertForSequenceClassification")  # labels negative, neutral, positive
    labels = LabelSpace("sequence_classification", model.config, tokenizer)
    examples = [Example("a", None, 0), Example("b", None, 1)]
    assert faith.gold_labels(examples, labels, "sst2").tolist() == [0, 2]  # SST-2: 0 negative, 1 positive
    assert faith.gold_labels(examples, labels).tolist() == [0, 1]  # no task: class indices
    named = [Example("a", None, "Positive"), Example("b", None, "2")]
    assert faith.gold_labels(named, labels).tolist() == [2, 2]
    with pytest.raises(InvalidInputError, match="labels"):
        faith.gold_labels([Example("a", None, "joy")], labels)
    assert faith.gold_labels([Example("a", None, None)], labels) is None


def test_user_files(tmp_path):
    tsv = tmp_path / "data.tsv"
    tsv.write_text('text\ttext_pair\tlabel\nit "works"\tyes\tpositive\nanother\tsecond\t0\n')
    examples = faith.load_examples(str(tsv))
    assert [(e.text, e.pair, e.label) for e in examples] == [('it "works"', "yes", "positive"),
                                                             ("another", "second", "0")]
    unlabelled = tmp_path / "plain.tsv"
    unlabelled.write_text("text\nno label\nnone here either\n")
    assert [e.label for e in faith.load_examples(str(unlabelled))] == [None, None]  # no labels at all: fine
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text(json.dumps({"text": "one", "label": 1}) + "\n\n" + json.dumps({"text": "two", "label": 0}))
    assert [(e.text, e.label) for e in faith.load_examples(str(jsonl), limit=1)] == [("one", 1)]
    for bad, message in (("nothing.tsv", "neither"), (str(tmp_path / "x.csv"), "suffix")):
        if bad.endswith(".csv"):
            Path(bad).write_text("text\nx\n")
        with pytest.raises(InvalidInputError, match=message):
            faith.load_examples(bad)
    with pytest.raises(InvalidInputError, match="limit"):
        faith.load_examples(str(jsonl), limit=0)


def test_invalid_arguments_are_explicit_errors():
    model, tokenizer = tiny.build("BertForSequenceClassification")
    for kwargs, message in ((dict(methods=["nope"]), "nope"), (dict(special_tokens="all"), "special_tokens"),
                            (dict(perturbation="blur"), "perturbation"), (dict(ks=[0, 1]), "strictly"),
                            (dict(method_options={"logat": {}}), "method_options"),
                            (dict(batch_size=0), "batch_size")):
        with pytest.raises(NormxError, match=message):
            faith.evaluate(model, tokenizer, tiny.TEXTS, **{"methods": ["random"], "progress": False, **kwargs})
    lm, lm_tokenizer = tiny.build("BertForMaskedLM")
    with pytest.raises(NormxError, match="classification"):
        faith.evaluate(lm, lm_tokenizer, ["the [MASK] film"], ["random"], progress=False)


# ---- command line ------------------------------------------------------------------------------------------------

def test_cli_writes_every_output(tmp_path, capsys):
    model, tokenizer = tiny.build("BertForSequenceClassification")
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    data = tmp_path / "data.tsv"
    rows = ["text\tlabel"] + [f"{t}\t{label}" for t, label in zip(tiny.TEXTS, ("negative", "positive", "neutral"))]
    data.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    assert main(["evaluate", "faithfulness", "--model", str(folder), "--data", str(data), "--methods",
                 "normxlogit,l2norm", "random", "--seed", "2", "--limit", "2", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "normxlogit" in printed and "AOPC" in printed
    for name in ("summary.json", "curves.csv", "summary.csv", "comprehensiveness.png", "sufficiency.png"):
        assert (out / name).stat().st_size > 0
    assert (out / "comprehensiveness.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["examples"] == 2 and "--seed 2" in summary["settings"]["command"]
    assert list(summary["methods"]) == ["normxlogit", "l2norm", "random"]
    assert summary["methods"]["random"]["options"] == {"seed": 2}
    aopc = summary["methods"]["normxlogit"]["aopc"]["comprehensiveness"]["confidence_drop"]
    curve = summary["methods"]["normxlogit"]["curves"]["comprehensiveness"]["confidence_drop"]
    assert aopc == pytest.approx(np.mean(curve[1:10]))
    assert summary["methods"]["normxlogit"]["aopc_standard_error"]["sufficiency"]["accuracy"] >= 0
    reread = faith.FaithfulnessReport.from_dict(summary)
    assert reread.to_dict() == summary and reread.aopc("normxlogit") == pytest.approx(aopc)
    with open(out / "curves.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 3 * 2 * 2 * len(K_VALUES)
    with open(out / "summary.csv") as handle:
        assert len(list(csv.DictReader(handle))) == 3 * 2 * 2


def test_cli_errors_are_messages(tmp_path, capsys):
    assert main(["evaluate", "faithfulness", "--model", "minilm-sst2", "--data", "nope.tsv", "--out",
                 str(tmp_path)]) == 2
    assert "neither a task" in capsys.readouterr().err
    assert main(["evaluate", "faithfulness", "--model", "minilm-sst2", "--data", "sst2", "--methods", "logat",
                 "--n-steps", "5", "--out", str(tmp_path)]) == 2
    assert "--n-steps" in capsys.readouterr().err


# ---- real model (slow) ----------------------------------------------------------------------------------------------

ROOT = locations.ROOT
SHARED = locations.SHARED
STORED = ROOT / "docs" / "results" / "minilm-sst2-small" / "summary.json"


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / "sst2").is_dir(), reason="the shared GLUE data folder is not here")
def test_minilm_sst2_reproduces_the_stored_summary(tmp_path, monkeypatch, capsys):
    """Re-run the command recorded in docs/results/minilm-sst2-small and compare every curve."""
    stored = json.loads(STORED.read_text())
    args = shlex.split(stored["settings"]["command"])
    assert args[:3] == ["normx", "evaluate", "faithfulness"]
    args[args.index("--out") + 1] = str(tmp_path)
    monkeypatch.setenv("NORMX_DATA", str(SHARED))
    assert main([*args[1:], "--no-progress", "--no-plots"]) == 0
    fresh = json.loads((tmp_path / "summary.json").read_text())
    assert fresh["settings"]["examples"] == stored["settings"]["examples"]
    assert fresh["original"] == pytest.approx(stored["original"], abs=1e-4)
    assert list(fresh["methods"]) == list(stored["methods"])
    one_example = 1.01 / stored["settings"]["examples"]  # a borderline prediction flipping on another machine
    for method, result in stored["methods"].items():
        for mode, curves in result["curves"].items():
            for metric, curve in curves.items():
                tolerance = max(0.01, one_example) if metric == "accuracy" else 0.01
                assert fresh["methods"][method]["curves"][mode][metric] == pytest.approx(curve, abs=tolerance), \
                    (method, mode, metric)
                assert fresh["methods"][method]["aopc"][mode][metric] == pytest.approx(
                    result["aopc"][mode][metric], abs=tolerance / 2)


def test_without_matplotlib_the_figures_are_skipped_with_a_warning(tmp_path, monkeypatch):
    model, tokenizer = tiny.build("BertForSequenceClassification")
    report = faith.evaluate(model, tokenizer, tiny.TEXTS, ["random"], progress=False)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "matplotlib" else object())
    with pytest.warns(UserWarning, match=r"matplotlib is not installed: the figures \(PNG\) are skipped"):
        written = report.write(tmp_path)
    assert sorted(f.name for f in written) == ["curves.csv", "summary.csv", "summary.json"]


def test_partial_aopc_is_the_mean_over_k_10_to_40():
    from normx.evaluation.faithfulness.metrics import PARTIAL

    curve = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]  # K = 0, 10, ..., 100 %
    assert faith.aopc(curve) == pytest.approx(5.0)  # K = 10 ... 90 %
    assert faith.aopc(curve, within=PARTIAL) == pytest.approx(2.5)  # K = 10 ... 40 %
    model, tokenizer = tiny.build("BertForSequenceClassification")
    report = faith.evaluate(model, tokenizer, tiny.TEXTS, ["random"], progress=False)
    row = next(r for r in report.summary_rows() if r["mode"] == "comprehensiveness")
    assert row["aopc_10_40"] == pytest.approx(np.mean(report.curve("random", "comprehensiveness")[1:5]))


def test_random_per_type_gives_every_occurrence_the_same_score():
    model, tokenizer = tiny.build("BertForSequenceClassification")
    e = normx.explain(model, tokenizer, "the film the story", text_pair="the film was good", method="random_types")
    by_token = {}
    for token, score in zip(e.tokens, e.score):
        by_token.setdefault(token, set()).add(round(float(score), 7))
    assert all(len(scores) == 1 for scores in by_token.values())  # "the", "film", [SEP]: one score each
    assert len({s for scores in by_token.values() for s in scores}) == len(by_token)
    again = normx.explain(model, tokenizer, "the film the story", text_pair="the film was good", method="random_types")
    np.testing.assert_array_equal(e.scores, again.scores)  # seeded
    other = normx.explain(model, tokenizer, "the film the story", text_pair="the film was good",
                          method="random_types", seed=1)
    assert not np.allclose(e.scores, other.scores)


def test_regression_ranking_closest_negates_only_the_distance_methods(monkeypatch):
    model, tokenizer = tiny.build("BertForSequenceClassification", num_labels=1)
    examples = [normx.data.glue.Example(t, p, 2.5 + i) for i, (t, p) in enumerate(zip(tiny.TEXTS, tiny.PAIRS))]
    seen = {}
    real = Perturber.perturbed_logits

    def spy(self, items, scores, desc=""):
        seen.setdefault(desc, []).append([np.asarray(s) for s in scores])
        return real(self, items, scores, desc)

    monkeypatch.setattr(Perturber, "perturbed_logits", spy)
    for order in ("farthest", "closest"):
        report = faith.evaluate(model, tokenizer, examples, ["logat", "l2norm"], progress=False,
                                regression_ranking=order)
        assert report.settings["regression_ranking"] == order
    logat, l2 = seen["perturbed inputs logat"], seen["perturbed inputs l2norm"]
    assert all(np.allclose(a, -b) for a, b in zip(*logat))  # LogAt: a distance, ranked the other way round
    assert all(np.allclose(a, b) for a, b in zip(*l2))  # the ℓ2 norm is no distance: unchanged
    with pytest.raises(InvalidInputError, match="regression_ranking"):
        faith.evaluate(model, tokenizer, examples, ["logat"], progress=False, regression_ranking="nearest")


def test_paired_difference_of_two_methods_from_the_per_example_aopcs():
    model, tokenizer = tiny.build("BertForSequenceClassification")
    examples = [Example(t, p, label) for t, p, label in zip(tiny.TEXTS, tiny.PAIRS, (0, 2, 1))] * 2
    report = faith.evaluate(model, tokenizer, examples, ["normxlogit", "random"], progress=False)
    # per-example AOPCs by hand from the perturbed logits: the probability drop of the unperturbed prediction
    original = normx.explain(model, tokenizer, [e.text for e in examples], text_pair=[e.pair for e in examples])
    rows = {}
    for method in ("normxlogit", "random"):
        logits = report.results[method].logits["comprehensiveness"]  # [N, K, C]
        probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        unperturbed = np.array([list(o.probabilities.values()) for o in original])  # [N, C] in class order
        predicted = unperturbed.argmax(-1)
        start = unperturbed[np.arange(len(examples)), predicted]
        drops = start[:, None] - probs[np.arange(len(examples)), :, predicted]
        rows[method] = drops[:, 1:-1].mean(1)
        np.testing.assert_allclose(report.results[method].examples["comprehensiveness"]["confidence_drop"],
                                   rows[method], atol=1e-5)
    mean, error = report.difference("normxlogit", "random")
    diff = rows["normxlogit"] - rows["random"]
    assert mean == pytest.approx(diff.mean(), abs=1e-5)
    assert mean == pytest.approx(report.aopc("normxlogit") - report.aopc("random"), abs=1e-9)
    assert error == pytest.approx(diff.std(ddof=1) / np.sqrt(len(diff)), abs=1e-5)
    back = faith.FaithfulnessReport.from_dict(report.to_dict())  # stored in summary.json, read back
    assert back.difference("normxlogit", "random") == pytest.approx((mean, error))
    with pytest.raises(InvalidInputError, match="no method 'decompx'"):
        report.difference("normxlogit", "decompx")
    regression, tok = tiny.build("BertForSequenceClassification", num_labels=1)
    scored = faith.evaluate(regression, tok, [Example(t, p, s) for t, p, s in zip(tiny.TEXTS, tiny.PAIRS, (1, 4, 2))],
                            ["normxlogit", "random"], progress=False)
    with pytest.raises(InvalidInputError, match="Pearson r is not a per-example mean"):
        scored.difference("normxlogit", "random")


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "LlamaForSequenceClassification"])
def test_supplied_scores_are_scored_as_the_methods_own(name):
    """A ranking computed elsewhere (faith.SuppliedScores) is scored by the same protocol: normxlogit's own scores,
    given as a list or returned by a function of the examples and the predicted labels, give exactly its curves,
    also with no registered method run (the pooled token then comes from the model's adapter); other scores other
    curves."""
    model, tokenizer = tiny.build(name)
    own = normx.explain(model, tokenizer, tiny.TEXTS, "normxlogit")
    scores = [e.token_scores() for e in own]
    asked = []

    def computed(examples, predicted):
        asked.append((examples, predicted))
        return scores

    report = faith.evaluate(model, tokenizer, tiny.TEXTS, ["normxlogit", faith.SuppliedScores("given", scores),
                                                          faith.SuppliedScores("computed", computed)],
                            progress=False)
    assert list(report.results) == ["normxlogit", "given", "computed"]
    assert [e.text for e in asked[0][0]] == list(tiny.TEXTS) and asked[0][1] == [e.labels[0] for e in own]
    for label in ("given", "computed"):
        for mode, curves in report.results["normxlogit"].curves.items():
            assert report.results[label].curves[mode] == curves
    alone = faith.evaluate(model, tokenizer, tiny.TEXTS, [faith.SuppliedScores("given", scores)], progress=False)
    assert alone.results["given"].curves == report.results["normxlogit"].curves
    flipped = faith.evaluate(model, tokenizer, tiny.TEXTS, [faith.SuppliedScores("flipped", [-s for s in scores])],
                             progress=False)
    assert flipped.results["flipped"].curves != report.results["normxlogit"].curves


def test_supplied_scores_of_the_wrong_shape_count_or_name_are_refused():
    model, tokenizer = tiny.build("BertForSequenceClassification")
    scores = [e.token_scores() for e in normx.explain(model, tokenizer, tiny.TEXTS, "normxlogit")]

    def run(*methods):
        return faith.evaluate(model, tokenizer, tiny.TEXTS, list(methods), progress=False)

    with pytest.raises(InvalidInputError, match="one score per token"):
        run(faith.SuppliedScores("short", [s[:-1] for s in scores]))
    with pytest.raises(InvalidInputError, match="scores for 1 examples"):
        run(faith.SuppliedScores("few", scores[:1]))
    with pytest.raises(InvalidInputError, match="NaN"):
        run(faith.SuppliedScores("nan", [np.full_like(s, np.nan) for s in scores]))
    with pytest.raises(InvalidInputError, match="each name once"):
        run("normxlogit", faith.SuppliedScores("normxlogit", scores))
    with pytest.raises(InvalidInputError, match="each name once"):
        run(faith.SuppliedScores("a", scores), faith.SuppliedScores("a", scores))
