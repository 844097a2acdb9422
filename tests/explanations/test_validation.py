"""Bad input gets a clear normx error that says what was given and what is allowed."""

import json
import warnings

import minilm
import numpy as np
import pytest
import torch
import transformers

import normx
from normx import errors


@pytest.fixture(scope="module")
def mt():
    return minilm.classifier()


def test_empty_and_whitespace_texts(mt):
    for bad in ("", "   \n\t"):
        with pytest.raises(errors.EmptyTextError, match="empty or has only white space"):
            normx.explain(*mt, bad)
    with pytest.raises(errors.EmptyTextError, match=r"texts\[1\]"):
        normx.explain(*mt, ["fine", " "])
    with pytest.raises(errors.InvalidInputError, match="empty list"):
        normx.explain(*mt, [])
    with pytest.raises(errors.InvalidInputError, match="must be a string"):
        normx.explain(*mt, ["ok", 3])


def test_unknown_method_lists_alternatives(mt):
    with pytest.raises(errors.UnknownMethodError) as info:
        normx.explain(*mt, "text", method="shap")
    message = str(info.value)
    assert "'shap'" in message and all(name in message for name in ("normxlogit", "logat", "l2norm"))
    assert isinstance(info.value, KeyError)


def test_layers(mt):
    e = normx.explain(*mt, "text", layer="all")
    assert e.layers == list(range(7)) and e.scores.shape[1] == 7
    assert normx.explain(*mt, "text", layer=-1).layers == [6]
    assert normx.explain(*mt, "text", layer=-7).layers == [0]
    assert normx.explain(*mt, "text", layer=[3, 1, 3]).layers == [1, 3]
    assert normx.explain(*mt, "text", method="l2norm").layers == [0]
    for bad in (7, -8, "top", 2.5, []):
        with pytest.raises(errors.LayerOutOfRangeError):
            normx.explain(*mt, "text", layer=bad)
    with pytest.raises(errors.LayerOutOfRangeError, match="6 layers"):
        normx.explain(*mt, "text", layer=12)


def test_layer_scores_are_one_pass_consistent(mt):
    every = normx.explain(*mt, "a gripping film", layer="all")
    for layer in (0, 3, 6):
        one = normx.explain(*mt, "a gripping film", layer=layer)
        np.testing.assert_allclose(one.score, every.token_scores(layer=layer), atol=1e-6)


def test_targets(mt):
    e = normx.explain(*mt, "text", target="all")
    assert e.labels == ["negative", "positive"]
    assert normx.explain(*mt, "text", target="POSITIVE").labels == ["positive"]
    assert normx.explain(*mt, "text", target=0).labels == ["negative"]
    assert normx.explain(*mt, "text", target=[1, "negative"]).labels == ["positive", "negative"]
    for bad in ("neutral", 2, -3, 1.0, True, []):
        with pytest.raises(errors.UnknownTargetError) as info:
            normx.explain(*mt, "text", target=bad)
        assert isinstance(info.value, ValueError)
    with pytest.raises(errors.UnknownTargetError, match="negative"):
        normx.explain(*mt, "text", foil="neutral")


def test_contrastive_is_difference(mt):
    both = normx.explain(*mt, "a gripping film", target="all", layer="all")
    contrast = normx.explain(*mt, "a gripping film", target="positive", foil="negative", layer="all")
    np.testing.assert_allclose(contrast.scores[0], both.scores[1] - both.scores[0], atol=1e-5)


def test_pairs(mt):
    with pytest.raises(errors.InvalidInputError, match="one pair each"):
        normx.explain(*mt, ["a", "b"], text_pair=["c"])
    e = normx.explain(*mt, "A man plays.", text_pair="Someone plays.")
    assert e.text_pair == "Someone plays." and set(e.segments) == {-1, 0, 1}


def test_pair_rejected_for_single_text_model():
    model, tokenizer = minilm.classifier()
    model.config.normx_inputs = "single"
    try:
        with pytest.raises(errors.PairNotSupportedError, match="single texts"):
            normx.explain(model, tokenizer, "a", text_pair="b")
    finally:
        del model.config.normx_inputs


def test_truncation(mt):
    long = " ".join(["word"] * 600)
    with pytest.raises(errors.InputTooLongError, match="more than the model's 512"):
        normx.explain(*mt, long, truncation="error")
    with pytest.warns(errors.InputWarning, match="truncated to 512"):  # said where Python users look, too
        e = normx.explain(*mt, long)
    assert len(e.tokens) == 512 and e.tokens[-1] == "[SEP]"
    assert e.warnings and "truncated to 512" in e.warnings[0]
    assert len(normx.explain(*mt, long, max_length=40).tokens) == 40
    with pytest.raises(errors.InvalidInputError, match="truncation"):
        normx.explain(*mt, "text", truncation="cut")


def test_unknown_pieces_of_text_are_reported(mt):
    with pytest.warns(errors.InputWarning, match=r"2 piece\(s\) .* became \[UNK\]: '🙂', '🎉'"):
        e = normx.explain(*mt, "a gripping film 🙂 🎉")
    assert e.tokens.count("[UNK]") == 2 and "[UNK]" in e.warnings[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert normx.explain(*mt, "a gripping film").warnings == []  # nothing to say: no warning


def test_other_options(mt):
    with pytest.raises(errors.InvalidInputError, match="embedding"):
        normx.explain(*mt, "text", embedding="raw")
    with pytest.raises(errors.InvalidInputError, match="batch_size"):
        normx.explain(*mt, "text", batch_size=0)


def test_word_embedding_norm(mt):
    model, tokenizer = mt
    text = "a gripping film"
    e = normx.explain(model, tokenizer, text, embedding="word")
    logat = normx.explain(model, tokenizer, text, method="logat")
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    norms = model.get_input_embeddings()(ids)[0].norm(dim=-1).detach().numpy()
    np.testing.assert_allclose(e.score, norms * logat.score, rtol=1e-5, atol=1e-6)
    assert e.settings["embedding"] == "word"


def test_unsupported_model_lists_supported():
    model = transformers.BertModel.from_pretrained(minilm.base_path())
    _, tokenizer = minilm.classifier()
    with pytest.raises(errors.UnsupportedModelError) as info:
        normx.explain(model, tokenizer, "text")
    message = str(info.value)
    assert "BertModel" in message and "BertForSequenceClassification" in message
    assert "register_adapter" in message


def test_to_dict_is_plain_json(mt):
    e = normx.explain(*mt, "a gripping film", target="all", layer=[0, 6])
    data = json.loads(json.dumps(e.to_dict()))
    assert data["tokens"] == e.tokens and len(data["scores"]) == len(e.tokens)
    assert set(data["probabilities"]) == {"negative", "positive"}
    assert data["scores_by_label"]["positive"]["0"] == pytest.approx(e.token_scores("positive", 0).tolist())
    assert data["prediction"] in ("negative", "positive")


def test_train_mode_is_restored(mt):
    model, tokenizer = mt
    model.train()
    try:
        a = normx.explain(model, tokenizer, "a gripping film").score
        b = normx.explain(model, tokenizer, "a gripping film").score
        np.testing.assert_array_equal(a, b)  # dropout was off
        assert model.training and model.bert.encoder.training
    finally:
        model.eval()
