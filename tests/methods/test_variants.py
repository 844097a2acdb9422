"""The experimental one-pass variants (normx/variants.py, docs/variants.md): each checked against the same quantity
computed by hand from LogAt on every class and the ℓ2 norms, on tiny classifiers; what they refuse; how the
experimental flag keeps them out of the default lists."""

from __future__ import annotations

import locations
import numpy as np
import pytest
import tiny
import torch

import normx
from normx.errors import InvalidInputError, UnknownMethodError, UnsupportedModelError
from normx.methods import get_method

VARIANTS = ["logat_margin", "normx_margin", "normx_prob", "normx_selfnorm", "normx_window"]


@pytest.fixture(scope="module")
def classifier():
    return tiny.build("BertForSequenceClassification")  # three classes


def _by_hand(model, tokenizer, text):
    """Per layer: the head's logits for every class on every token [layers, C, T], the prediction's column, the
    input norms [T] and each layer's norms [layers, T]."""
    every = normx.explain(model, tokenizer, text, method="logat", target="all", layer="all")
    label = normx.explain(model, tokenizer, text, method="logat").labels[0]
    column = every.labels.index(label)
    norms = normx.explain(model, tokenizer, text, method="l2norm", layer="all").scores[0]  # [layers, T]
    logits = np.transpose(every.scores, (1, 0, 2)).astype(np.float64)  # [layers, C, T]
    return logits, column, norms[0], norms


def test_margin_and_prob_are_the_log_odds_and_probability_of_the_label(classifier):
    model, tokenizer = classifier
    text = tiny.TEXTS[1]
    logits, column, input_norm, _ = _by_hand(model, tokenizer, text)
    others = np.delete(logits, column, axis=1)  # [layers, C-1, T]
    margin = logits[:, column] - np.log(np.exp(others).sum(axis=1))
    prob = np.exp(logits[:, column]) / np.exp(logits).sum(axis=1)
    expected = {"logat_margin": margin, "normx_margin": input_norm * margin, "normx_prob": input_norm * prob}
    for method, want in expected.items():
        got = normx.explain(model, tokenizer, text, method=method, layer="all")
        assert got.labels == [normx.explain(model, tokenizer, text).labels[0]]
        np.testing.assert_allclose(got.scores[0], want, rtol=1e-4, atol=1e-5, err_msg=method)


def test_margin_of_two_classes_is_the_target_minus_the_other():
    model, tokenizer = tiny.build("LlamaForSequenceClassification-eos-pad", num_labels=2)
    text = tiny.TEXTS[0]
    e = normx.explain(model, tokenizer, text, method="logat_margin")
    other = 1 - model.config.label2id[e.labels[0]]
    contrast = normx.explain(model, tokenizer, text, method="logat", foil=other)
    np.testing.assert_allclose(e.scores, contrast.scores, rtol=1e-5, atol=1e-6)


def test_selfnorm_and_window_from_logat_and_the_layer_norms(classifier):
    model, tokenizer = classifier
    text = tiny.TEXTS[2]
    logits, column, input_norm, norms = _by_hand(model, tokenizer, text)
    logat = logits[:, column]  # [layers, T]
    got = normx.explain(model, tokenizer, text, method="normx_selfnorm", layer="all").scores[0]
    np.testing.assert_allclose(got, norms * logat, rtol=1e-4, atol=1e-5)
    for window in (1, 2, 3):
        got = normx.explain(model, tokenizer, text, method="normx_window", layer="all", window=window).scores[0]
        want = [input_norm * logat[max(0, layer - window + 1):layer + 1].mean(0) for layer in range(len(logat))]
        np.testing.assert_allclose(got, np.array(want), rtol=1e-4, atol=1e-5, err_msg=f"window {window}")
    # asking for the last layer alone still reads the layers before it (Method.reads_layers)
    last = normx.explain(model, tokenizer, text, method="normx_window", window=3)
    assert last.layers == [tiny.LAYERS]
    np.testing.assert_allclose(last.scores[0, 0], input_norm * logat[-3:].mean(0), rtol=1e-4, atol=1e-5)
    assert get_method("normx_window").capture([2], 2, {"window": 2}) == [1, 2]


def test_window_on_a_regression_head_averages_the_distances():
    model, tokenizer = tiny.build("BertForSequenceClassification", num_labels=1)
    text = tiny.TEXTS[0]
    logat = normx.explain(model, tokenizer, text, method="logat", layer="all").scores[0]
    norm = normx.explain(model, tokenizer, text, method="l2norm").scores[0, 0]
    got = normx.explain(model, tokenizer, text, method="normx_window", window=2).scores[0, 0]
    np.testing.assert_allclose(got, norm * logat[-2:].mean(0), rtol=1e-4, atol=1e-5)


def test_what_the_variants_refuse(classifier):
    model, tokenizer = classifier
    with pytest.raises(InvalidInputError, match="take no foil"):
        normx.explain(model, tokenizer, tiny.TEXTS[0], method="normx_margin", foil=0)
    with pytest.raises(InvalidInputError, match="window must be at least 1"):
        normx.explain(model, tokenizer, tiny.TEXTS[0], method="normx_window", window=0)
    regression, tok = tiny.build("BertForSequenceClassification", num_labels=1)
    with pytest.raises(UnsupportedModelError, match="regression head"):
        normx.explain(regression, tok, tiny.TEXTS[0], method="normx_prob")
    assert "regression head" in get_method("normx_margin").unsupported(regression)
    assert get_method("normx_window").unsupported(regression) is None
    lm, tok = tiny.build("GPT2LMHeadModel")
    assert "classifier head" in get_method("normx_margin").unsupported(lm)
    assert get_method("normx_selfnorm").unsupported(lm) is None


def test_experimental_methods_are_usable_by_name_but_not_offered(capsys):
    from normx.cli.main import main

    assert not set(VARIANTS) & set(normx.list_methods())
    assert set(VARIANTS) <= set(normx.list_methods(experimental=True))
    with pytest.raises(UnknownMethodError, match="normx_margin"):
        get_method("normx_margins")
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    listed, experimental = out.split("experimental (")
    assert "normxlogit" in listed and "normx_margin" not in listed
    assert all(name in experimental for name in VARIANTS)


def test_variants_follow_a_bf16_model():
    model, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    model.to(torch.bfloat16)
    for method in VARIANTS:
        e = normx.explain(model, tokenizer, tiny.TEXTS[0], method=method)
        assert e.settings["dtype"] == "bfloat16" and np.isfinite(e.scores).all()


def test_choosing_settings_reads_the_training_split(tmp_path):
    from normx.evaluation.faithfulness.examples import load_examples

    file = tmp_path / "mine.tsv"
    file.write_text("text\tlabel\nfine\t1\n")
    with pytest.raises(InvalidInputError, match="applies to a GLUE task"):
        load_examples(str(file), split="train")
    shared = locations.SHARED
    if not (shared / "mnli").is_dir():
        pytest.skip("the shared data folder is not here")
    train, dev = load_examples("mnli", str(shared), split="train"), load_examples("mnli", str(shared))
    assert len(train) == 6870 and len(dev) == 2945
    assert not {(e.text, e.pair) for e in train} & {(e.text, e.pair) for e in dev}
