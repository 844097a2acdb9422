"""BLiMP evidence alignment: metrics on synthetic cases with known answers, evidence rules on hand-checked pairs
from every paradigm, pair preparation for masked / causal LMs, and `normx evaluate blimp` end to end on tiny
models (fast) and on SmolLM2 (slow)."""

import csv
import json
import math

import locations
import numpy as np
import pytest
import tiny
from blimp_data import HAND_CHECKED
from blimp_data import write_data as _write_data

import normx
from normx.data import blimp as ev
from normx.errors import InvalidInputError, UnknownMethodError
from normx.evaluation import blimp
from normx.evaluation.blimp.alignment import average_precision, dot_product

SHARED = locations.SHARED
needs_data = pytest.mark.skipif(not (SHARED / "blimp").is_dir(), reason="the shared BLiMP data folder is not here")


# ---- metrics -------------------------------------------------------------------------------------------------------

def test_all_mass_at_the_evidence_gives_dp_1_and_ap_1():
    scores = [0.0, 0.0, 1000.0, 0.0]
    assert dot_product(scores, [2]) == pytest.approx(1.0)
    assert average_precision(scores, [2]) == 1.0


def test_evidence_ranked_last_gives_ap_1_over_n():
    scores = [5.0, 4.0, 3.0, 2.0, 1.0]
    assert average_precision(scores, [4]) == pytest.approx(1 / 5)
    assert average_precision(scores, [2]) == pytest.approx(1 / 3)


def test_dot_product_is_the_softmax_mass_at_the_evidence():
    scores = np.array([1.0, 2.0, 0.5, -1.0])
    softmax = np.exp(scores) / np.exp(scores).sum()
    assert dot_product(scores, [1]) == pytest.approx(softmax[1])
    assert dot_product(scores, [0, 3]) == pytest.approx(softmax[0] + softmax[3])
    assert dot_product(np.zeros(8), [3]) == pytest.approx(1 / 8)  # uniform scores: |E| / n


def test_target_position_is_excluded():
    # the target carries the largest score; without it the evidence is first and holds all the mass
    scores = [0.0, 50.0, 1000.0, 0.0]
    assert average_precision(scores, [1]) == pytest.approx(1 / 2)
    assert average_precision(scores, [1], exclude=[2]) == 1.0
    assert dot_product(scores, [1]) == pytest.approx(0.0, abs=1e-12)
    assert dot_product(scores, [1], exclude=[2]) == pytest.approx(1.0)
    # softmax over the 3 remaining tokens: e^1 / (e^0 + e^1 + e^0)
    assert dot_product([0.0, 1.0, 9.0, 0.0], [1], exclude=[2]) == pytest.approx(math.e / (2 + math.e))


def test_average_precision_with_several_evidence_tokens():
    # ranking 0 > 1 > 2 > 3; evidence at ranks 2 and 4: (1/2 + 2/4) / 2
    assert average_precision([4.0, 3.0, 2.0, 1.0], [1, 3]) == pytest.approx(0.5)
    assert average_precision([4.0, 3.0, 2.0, 1.0], [0, 1]) == 1.0


def test_ties_give_the_expected_ap_over_their_orders():
    # all equal: the evidence is equally likely at every rank -> mean of 1/r
    assert average_precision(np.zeros(4), [0]) == pytest.approx(np.mean(1 / np.arange(1, 5)))
    assert average_precision(np.zeros(4), [3]) == average_precision(np.zeros(4), [0])  # position does not matter
    # one higher token, then the evidence tied with one other: rank 2 or 3
    assert average_precision([9.0, 1.0, 1.0], [2]) == pytest.approx((1 / 2 + 1 / 3) / 2)
    # two evidence tokens tied with one other: orders EEx, ExE, xEE -> APs 1, (1 + 2/3)/2, (1/2 + 2/3)/2
    expected = np.mean([1.0, (1 + 2 / 3) / 2, (1 / 2 + 2 / 3) / 2])
    assert average_precision([1.0, 1.0, 1.0], [0, 2]) == pytest.approx(expected)


def test_metrics_per_layer():
    scores = np.array([[0.0, 9.0, 1.0], [9.0, 0.0, 1.0]])
    assert average_precision(scores, [1]) == pytest.approx([1.0, 1 / 3])
    dp = dot_product(scores, [1])
    assert dp.shape == (2,) and dp[0] > 0.99 and dp[1] < 0.01


def test_metric_input_errors():
    with pytest.raises(InvalidInputError, match="no evidence"):
        dot_product([1.0, 2.0], [])
    with pytest.raises(InvalidInputError, match="outside"):
        average_precision([1.0, 2.0], [5])
    with pytest.raises(InvalidInputError, match="also excluded"):
        dot_product([1.0, 2.0], [1], exclude=[1])
    with pytest.raises(InvalidInputError, match="NaN"):
        average_precision([1.0, float("nan")], [0])


# ---- evidence rules ------------------------------------------------------------------------------------------------

def _row(good, bad, pair_id="0"):
    return {"sentence_good": good, "sentence_bad": bad, "pairID": pair_id}


@pytest.mark.parametrize("key", sorted(HAND_CHECKED))
def test_evidence_rules_on_hand_checked_pairs(key):
    paradigm = ev.get_paradigm(key)
    for good, bad, target, foil, evidence in HAND_CHECKED[key]:
        pair = ev.extract_pair(_row(good, bad), paradigm)
        assert isinstance(pair, ev.Pair), (good, pair)
        assert (pair.good, pair.bad, pair.evidence) == (target, foil, (evidence,)), good
        start, end = pair.evidence_spans[0]
        assert good[start:end] == evidence
        assert good[slice(*pair.target_span)] == target and bad[slice(*pair.bad_span)] == foil
        if paradigm.after:  # the _2 files: the evidence follows the target
            assert pair.evidence_spans[0][0] >= pair.target_span[1]
        else:
            assert pair.evidence_spans[0][1] <= pair.target_span[0]  # the evidence precedes the target
        assert pair.prefix == good[:pair.target_span[0]].rstrip()


def test_pairs_the_rules_do_not_cover_are_counted():
    paradigm = ev.get_paradigm("rpsv")
    rows = [_row("Paula references Robert.", "Paula reference Robert."),
            _row("Paula references Robert.", "Paula references Robert today."),  # word counts differ
            _row("Paula references Robert.", "Paul reference Robert."),  # two words differ
            _row("Paula went to references.", "Paula went to reference.")]  # "Paula went to" is no subject NP
    result = ev.extract(rows, paradigm)
    assert result.total == 4 and len(result.pairs) == 1
    assert result.skipped == {"the sentences differ in word count": 1, "the sentences differ in 2 words, not one": 1,
                              "no evidence word found by the rules": 1}
    with pytest.raises(InvalidInputError, match=r"supported: ana \(anaphor_number_agreement\), dna"):
        ev.get_paradigm("npi")


@needs_data
def test_rules_cover_every_pair_of_the_real_files():
    for key, paradigm in ev.PARADIGMS.items():
        result = ev.extract(ev.load_rows(paradigm, SHARED), paradigm)
        assert result.total == 1000 and len(result.pairs) == 1000, (key, result.skipped)


def test_missing_data(tmp_path):
    with pytest.raises(InvalidInputError, match="missing"):
        ev.load_rows(ev.get_paradigm("ana"), tmp_path)
    with pytest.raises(InvalidInputError, match="does not exist"):
        ev.load_rows(ev.get_paradigm("ana"), tmp_path / "nope")


# ---- preparing pairs for a model ------------------------------------------------------------------------------------

def _pairs(key, count=None):
    paradigm = ev.get_paradigm(key)
    pairs = [ev.extract_pair(_row(g, b), paradigm) for g, b, *_ in HAND_CHECKED[key]]
    return pairs[:count]


def test_masked_items_replace_the_target_with_the_mask():
    _, tokenizer = tiny.build("BertForMaskedLM")
    items, skipped, _ = blimp.prepare(_pairs("dnaa"), tokenizer, "masked_lm")
    assert not skipped and len(items) == 3
    item = items[1]
    assert item.text == "All banks distract these out in the open [MASK]."
    assert tokenizer.convert_ids_to_tokens([item.target_id, item.foil_id]) == ["adults", "adult"]
    assert item.text[slice(*item.evidence_spans[0])] == "these"
    explanation = normx.explain(*tiny.build("BertForMaskedLM"), item.text, method="l2norm")
    evidence_at, exclude = blimp.positions(explanation, item, tokenizer.mask_token)
    assert explanation.tokens[evidence_at[0]] == "these" and explanation.tokens[exclude[0]] == "[MASK]"


def test_masked_items_shift_evidence_after_the_target():
    _, tokenizer = tiny.build("BertForMaskedLM")
    pair = ev.Pair("x", "0", "The cats hate every person.", "The cats hates every person.", (9, 13), (9, 14), "hate",
                   "hates", ("person",), ((20, 26),))
    item = blimp.prepare([pair], tokenizer, "masked_lm")[0][0]
    assert item.text == "The cats [MASK] every person."
    assert item.text[slice(*item.evidence_spans[0])] == "person"
    # a causal LM cannot see evidence after the target
    items, skipped, _ = blimp.prepare([pair], tokenizer, "causal_lm")
    assert not items and skipped == {"the evidence does not precede the target": 1}


def test_causal_items_read_the_prefix_and_predict_the_first_token():
    _, tokenizer = tiny.build("LlamaForCausalLM")
    items, skipped, _ = blimp.prepare(_pairs("ana"), tokenizer, "causal_lm")
    assert len(items) + sum(skipped.values()) == len(HAND_CHECKED["ana"])
    item = items[0]
    assert item.text == "Susan revealed"
    full = tokenizer("Susan revealed herself.")["input_ids"]
    prefix = tokenizer("Susan revealed")["input_ids"]
    assert full[:len(prefix)] == prefix and item.target_id == full[len(prefix)]  # the next token after the prefix
    assert item.target_id != item.foil_id


def test_pairs_whose_words_start_with_the_same_token_are_skipped():
    _, tokenizer = tiny.build("BertForMaskedLM")
    good = "A lot of skateboards stun that cashier."  # dna 854
    pair = ev.extract_pair(_row(good, "A lot of skateboards stun that cashiers."), ev.get_paradigm("dna"))
    assert tokenizer.tokenize("cashier") == ["cash", "##ier"] and tokenizer.tokenize("cashiers") == ["cash", "##iers"]
    items, skipped, examples = blimp.prepare([pair], tokenizer, "masked_lm")
    assert not items and skipped == {"good and bad words start with the same token": 1}
    assert examples["good and bad words start with the same token"] == good


# ---- the experiment on tiny models ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write_data(tmp_path_factory.mktemp("blimp-data"))


def test_curves_match_metrics_recomputed_from_explain(data):
    model, tokenizer = tiny.build("BertForMaskedLM")
    result = blimp.evaluate_blimp(model, tokenizer, ["ana", "dnaa"], ["logat", "l2norm"], data=data,
                                  progress=False)
    assert result.setting == "masked" and result.layers == [0, 1, 2]
    assert set(result.curves["dp"]) == {"ana", "dnaa", "all"}
    # recompute LogAt(foil) AP for ana from explain by hand
    items, _, _ = blimp.prepare(_pairs("ana"), tokenizer, "masked_lm")
    aps = []
    for item in items:
        explanation = normx.explain(model, tokenizer, item.text, method="logat", target=item.foil_id, layer="all")
        evidence_at, exclude = blimp.positions(explanation, item, tokenizer.mask_token)
        aps.append(average_precision(explanation.scores[0], evidence_at, exclude))
    curve = result.curves["ap"]["ana"]["logat_foil"]
    assert curve["n"] == len(items)
    np.testing.assert_allclose(curve["mean"], np.mean(aps, axis=0), rtol=1e-5)
    pooled = result.curves["dp"]["all"]["l2norm"]
    assert pooled["n"] == result.curves["dp"]["ana"]["l2norm"]["n"] + result.curves["dp"]["dnaa"]["l2norm"]["n"]


def test_methods_that_do_not_fit_the_model_are_not_applicable(data, monkeypatch):
    from normx import methods

    def never(ctx):
        raise AssertionError("never run: the method says what it supports")

    monkeypatch.setitem(methods.registry._METHODS, "nothing", methods.Method(
        "nothing", never, "test", supports=lambda adapter: "this test method supports no model"))
    model, tokenizer = tiny.build("GPT2LMHeadModel")
    result = blimp.evaluate_blimp(model, tokenizer, ["ana"], ["nothing", "random"], data=data, progress=False)
    assert result.setting == "causal" and result.coverage["ana"]["evaluated"] > 0
    assert result.methods["nothing"]["status"] == "not applicable"
    assert "supports no model" in result.methods["nothing"]["reason"]
    assert "nothing" not in result.curves["dp"]["ana"]
    assert result.methods["random"] == {"status": "ok", "layered": False}
    curve = result.curves["ap"]["ana"]["random"]["mean"]
    assert len(curve) == len(result.layers) == 3 and len(set(curve)) == 1  # no layers: one flat value


def test_input_errors(data):
    model, tokenizer = tiny.build("BertForMaskedLM")
    with pytest.raises(UnknownMethodError, match="available methods"):
        blimp.evaluate_blimp(model, tokenizer, ["ana"], ["nope"], data=data, progress=False)
    with pytest.raises(InvalidInputError, match="unknown BLiMP paradigm"):
        blimp.evaluate_blimp(model, tokenizer, ["npi"], data=data, progress=False)
    with pytest.raises(InvalidInputError, match="limit"):
        blimp.evaluate_blimp(model, tokenizer, ["ana"], data=data, limit=0, progress=False)
    classifier, tok = tiny.build("BertForSequenceClassification")
    with pytest.raises(InvalidInputError, match="language-model head"):
        blimp.evaluate_blimp(classifier, tok, ["ana"], data=data, progress=False)


def test_split_pairs_cuts_a_seeded_train_part_and_a_disjoint_dev_rest():
    pairs = list(range(50))  # any sequence: the cut is by position, seeded, and keeps file order
    train, dev = blimp.split_pairs(pairs, "train"), blimp.split_pairs(pairs, "dev")
    assert len(train) == 35 and len(dev) == 15
    assert sorted(train + dev) == pairs and train == sorted(train) and dev == sorted(dev)
    assert blimp.split_pairs(pairs, "train") == train and blimp.split_pairs(pairs, "all") == pairs
    assert train != pairs[:35]  # shuffled, not the first 70 %


def test_evaluate_on_the_held_out_split(data):
    model, tokenizer = tiny.build("BertForMaskedLM")
    result = blimp.evaluate_blimp(model, tokenizer, ["ana"], ["l2norm"], data=data, split="dev", progress=False)
    held_out = blimp.split_pairs(_pairs("ana"), "dev")
    assert result.coverage["ana"]["split"] == "dev" and result.settings["split"] == "dev"
    assert result.coverage["ana"]["sampled"] == len(held_out) == 2  # 6 hand-checked ana pairs: 4 train, 2 dev
    with pytest.raises(InvalidInputError, match="unknown split 'test'"):
        blimp.evaluate_blimp(model, tokenizer, ["ana"], data=data, split="test", progress=False)


def test_cli_writes_every_output(data, tmp_path):
    from normx.cli.main import main

    model, tokenizer = tiny.build("RobertaForMaskedLM", fresh=True)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out = tmp_path / "out"
    args = ["evaluate", "blimp", "--model", str(folder), "--data", str(data), "--paradigms", "ana", "rpsv",
            "--methods", "logat", "normxlogit", "--limit", "2", "--out", str(out), "--no-progress"]
    assert main(args) == 0
    names = {p.name for p in out.iterdir()}
    assert names == {"blimp.json", "curves.csv", "summary.csv", "coverage.csv", "dp.png", "ap.png", "dp_softmax.png"}
    result = blimp.BlimpReport.from_dict(json.loads((out / "blimp.json").read_text()))  # reads back
    assert result.model == "RobertaForMaskedLM" and result.settings["limit"] == 2
    assert result.coverage["ana"]["sampled"] == 2 and result.coverage["ana"]["covered_by_rules"] == 6
    with open(out / "curves.csv") as handle:
        rows = list(csv.DictReader(handle))
    curves = {(r["paradigm"], r["curve"], r["metric"]) for r in rows}
    assert ("all", "normxlogit", "ap") in curves and ("ana", "logat_foil", "dp") in curves
    assert {r["layer"] for r in rows} == {"0", "1", "2"}
    assert (out / "dp.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["evaluate", "blimp", "--model", str(folder), "--data", str(data), "--paradigms", "npi",
                 "--out", str(out)]) == 2


# ---- real model (slow) ----------------------------------------------------------------------------------------------

@pytest.mark.slow
@needs_data
def test_smollm2_causal_setting_on_a_few_pairs(tmp_path):
    model, tokenizer = normx.load_model("smollm2")
    result = blimp.evaluate_blimp(model, tokenizer, ["ana", "darn"], ["logat", "normxlogit", "l2norm"],
                                  data=SHARED, limit=4, progress=False)
    assert result.setting == "causal" and result.layers == list(range(31))
    for key in ("ana", "darn"):
        assert result.coverage[key]["evaluated"] == 4
        for metric in ("dp", "ap"):
            for curve in ("logat_target", "logat_foil", "normxlogit", "l2norm"):
                values = result.curves[metric][key][curve]["mean"]
                assert len(values) == 31 and all(0.0 <= v <= 1.0 for v in values)
    written = result.write(tmp_path)
    assert all(p.is_file() for p in written)


def test_dot_product_normalises_shares_by_their_sum_as_the_authors_do():
    from normx.evaluation.blimp.alignment import dot_product

    shares = [0.5, 0.3, 0.2, 0.0]  # a mixing-map row: already a distribution
    assert dot_product(shares, [1], normalise="sum") == pytest.approx(0.3)
    assert dot_product(shares, [1], exclude=[0], normalise="sum") == pytest.approx(0.6)  # renormalised
    softmax = np.exp(shares) / np.exp(shares).sum()
    assert dot_product(shares, [1]) == pytest.approx(softmax[1])  # the softmax flattens shares towards uniform
    assert dot_product([0.0, 0.0, 0.0], [2], normalise="sum") == pytest.approx(1 / 3)
    with pytest.raises(InvalidInputError, match="non-negative"):
        dot_product([1.0, -1.0], [0], normalise="sum")


def test_blimp_dp_uses_each_methods_normalisation(data):
    model, tokenizer = tiny.build("BertForMaskedLM")
    result = blimp.evaluate_blimp(model, tokenizer, ["ana"], ["globenc", "normxlogit"], data=data, progress=False)
    dp, softmax = result.curves["dp"]["ana"], result.curves["dp_softmax"]["ana"]
    assert dp["normxlogit"]["mean"] == pytest.approx(softmax["normxlogit"]["mean"])  # not shares: a softmax both times
    assert dp["globenc"]["mean"] != pytest.approx(softmax["globenc"]["mean"])  # shares: divided by their sum


def test_paradigms_by_short_name_or_blimp_uid():
    from normx.data import blimp as ev

    assert ev.get_paradigm("dna") is ev.get_paradigm("determiner_noun_agreement_1")
    assert ev.get_paradigm("determiner_noun_agreement_with_adjective_1.jsonl").key == "dnaa"
    assert ev.get_paradigm("determiner_noun_agreement_with_adj_1").key == "dnaa"  # the hub's config name
    assert ev.get_paradigm("determiner_noun_agreement_2").key == "dna_2"  # the paper's dna: the determiner changes
    with pytest.raises(InvalidInputError, match=r"unknown BLiMP paradigm 'npi_licensor'.*dna "
                                                r"\(determiner_noun_agreement_1\)"):
        ev.get_paradigm("npi_licensor")


def test_the_2_files_take_the_noun_after_the_determiner_as_evidence():
    from normx.data import blimp as ev

    rows = [{"sentence_good": "Tracy passed these art galleries.", "sentence_bad": "Tracy passed this art galleries.",
             "pairID": "1"},
            {"sentence_good": "Donna might hire this serious actress.",
             "sentence_bad": "Donna might hire these serious actress.", "pairID": "2"}]
    first = ev.extract_pair(rows[0], ev.get_paradigm("dna_2"))
    second = ev.extract_pair(rows[1], ev.get_paradigm("dnaa_2"))
    assert (first.good, first.bad, first.evidence) == ("these", "this", ("galleries",))
    assert (second.good, second.bad, second.evidence) == ("this", "these", ("actress",))


# ---- evidence settings and special tokens ----------------------------------------------------------------------------

def test_ana_evidence_phrase_is_the_subject_noun_phrase():
    row = {"sentence_good": "A lot of granddaughters watched themselves.",
           "sentence_bad": "A lot of granddaughters watched herself.", "pairID": "1"}
    pair = ev.extract_pair(row, ev.get_paradigm("ana"))
    words = [pair.sentence[a:b] for a, b in pair.spans("phrase")]
    assert words == ["A", "lot", "of", "granddaughters"]
    assert [pair.sentence[a:b] for a, b in pair.spans("word")] == ["granddaughters"] == list(pair.evidence)
    assert pair.spans("first") == pair.spans("word")
    darn = ev.extract_pair({"sentence_good": "A niece of most senators hasn't disagreed with Julia.",
                            "sentence_bad": "A niece of most senators haven't disagreed with Julia."},
                           ev.get_paradigm("darn"))
    assert darn.spans("phrase") == darn.spans("word")  # outside ana the phrase is the evidence word
    with pytest.raises(InvalidInputError, match="unknown evidence setting 'all'"):
        pair.spans("all")


def _pieces_explanation(tokenizer, text):
    """What :func:`blimp.positions` reads from an explanation (tokens, offsets, special), from the tokenizer."""
    from types import SimpleNamespace

    enc = tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    return SimpleNamespace(tokens=tokenizer.convert_ids_to_tokens(enc["input_ids"]),
                           offsets=[tuple(o) for o in enc["offset_mapping"]],
                           special=[bool(s) for s in enc["special_tokens_mask"]])


def test_evidence_settings_pick_first_piece_word_or_phrase_tokens():
    from transformers import AutoTokenizer

    from normx.zoo.presets import minilm_dir

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    row = {"sentence_good": "Many granddaughters hurt themselves.",
           "sentence_bad": "Many granddaughters hurt herself.", "pairID": "1"}
    pair = ev.extract_pair(row, ev.get_paradigm("ana"))
    found = {}
    for setting in ev.EVIDENCE:
        (item,), _, _ = blimp.prepare([pair], tokenizer, "masked_lm", setting)
        explanation = _pieces_explanation(tokenizer, item.text)
        at, exclude = blimp.positions(explanation, item, tokenizer.mask_token, setting)
        found[setting] = [explanation.tokens[i] for i in at]
        assert [explanation.tokens[i] for i in exclude] == ["[MASK]"]
    assert found == {"first": ["granddaughter"], "word": ["granddaughter", "##s"],
                     "phrase": ["many", "granddaughter", "##s"]}
    at, exclude = blimp.positions(explanation, item, tokenizer.mask_token, "word", "exclude")
    assert sorted(explanation.tokens[i] for i in exclude) == ["[CLS]", "[MASK]", "[SEP]"]
    # every pair has its pieces counted: the plural marker that decides the number is evidence too
    assert average_precision(np.arange(len(explanation.tokens), dtype=float), at, exclude) < 1.0


def test_evidence_and_special_token_settings_in_the_experiment(data):
    model, tokenizer = tiny.build("BertForMaskedLM")
    runs = {(e, s): blimp.evaluate_blimp(model, tokenizer, ["ana"], ["l2norm"], data=data, evidence=e,
                                         special_tokens=s, progress=False)
            for e, s in [("phrase", "include"), ("first", "include"), ("phrase", "exclude")]}
    for (e, s), run in runs.items():
        assert (run.settings["evidence"], run.settings["special_tokens"]) == (e, s)
    ap = {key: run.curves["ap"]["ana"]["l2norm"]["mean"] for key, run in runs.items()}
    assert ap[("phrase", "include")] != ap[("first", "include")]  # "These patients", "A lot of senators"
    assert ap[("phrase", "include")] != ap[("phrase", "exclude")]
    # recomputed by hand without special tokens
    items, _, _ = blimp.prepare(_pairs("ana"), tokenizer, "masked_lm", "phrase")
    aps = []
    for item in items:
        explanation = normx.explain(model, tokenizer, item.text, method="l2norm", layer="all")
        at, exclude = blimp.positions(explanation, item, tokenizer.mask_token, "phrase", "exclude")
        keep = [i for i in range(len(explanation.tokens)) if i not in exclude]
        assert not any(explanation.special[i] for i in keep)
        aps.append(average_precision(explanation.scores[0], at, exclude))
    np.testing.assert_allclose(ap[("phrase", "exclude")], np.mean(aps, axis=0), rtol=1e-5)
    with pytest.raises(InvalidInputError, match="unknown evidence setting 'noun'; use one of phrase, word, first"):
        blimp.evaluate_blimp(model, tokenizer, ["ana"], data=data, evidence="noun", progress=False)
    with pytest.raises(InvalidInputError, match="unknown special_tokens setting 'drop'"):
        blimp.evaluate_blimp(model, tokenizer, ["ana"], data=data, special_tokens="drop", progress=False)


def test_default_paradigms_are_the_papers_five():
    assert [ev.get_paradigm(k).uid for k in ev.DEFAULT_PARADIGMS] == [
        "anaphor_number_agreement", "determiner_noun_agreement_2", "determiner_noun_agreement_with_adj_2",
        "distractor_agreement_relational_noun", "regular_plural_subject_verb_agreement_1"]
