import minilm
import numpy as np
import pytest

import normx
from normx.errors import InvalidInputError
from normx.explanations.result import Explanation
from normx.explanations.words import word_spans


def _synthetic():
    # "unbelievably good ." tokenised as [CLS] un ##believ ##ably good . [SEP]
    text = "unbelievably good ."
    tokens = ["[CLS]", "un", "##believ", "##ably", "good", ".", "[SEP]"]
    offsets = [(0, 0), (0, 2), (2, 8), (8, 12), (13, 17), (18, 19), (0, 0)]
    special = [True, False, False, False, False, False, True]
    segments = [-1, 0, 0, 0, 0, 0, -1]
    scores = np.array([[[0.5, 1.0, -3.0, 2.0, 4.0, -1.0, 0.25]]], dtype=np.float32)
    return Explanation(text=text, text_pair=None, tokens=tokens, offsets=offsets, segments=segments,
                       special=special, scores=scores, labels=["positive"], layers=[6], prediction="positive",
                       probabilities={"positive": 1.0}, method="normxlogit", settings={})


def test_word_spans_split_punctuation_and_clitics():
    text = "It's a gripping, beautifully-acted film."
    assert [text[a:b] for a, b in word_spans(text)] == [
        "It", "'s", "a", "gripping", ",", "beautifully-acted", "film", "."]


@pytest.mark.parametrize("how, expected", [
    ("sum", 0.0), ("mean", 0.0), ("max", 2.0), ("absmax", -3.0),
])
def test_aggregations_hand_computed(how, expected):
    words = _synthetic().words(how)
    assert words.tokens == ["[CLS]", "unbelievably", "good", ".", "[SEP]"]
    assert words.special == [True, False, False, False, True]
    assert words.groups == [[0], [1, 2, 3], [4], [5], [6]]
    assert words.score[1] == pytest.approx(expected)
    # single-token words and special tokens keep their score
    assert words.score.tolist()[2:] == [4.0, -1.0, 0.25]
    assert words.score[0] == 0.5
    assert words.unit == "word" and words.settings["word_aggregation"] == how


def test_word_view_errors():
    words = _synthetic().words()
    with pytest.raises(InvalidInputError, match="already at word level"):
        words.words()
    with pytest.raises(InvalidInputError, match="not allowed"):
        _synthetic().words("median")


def test_real_tokenizer_words_cover_every_token_once():
    model, tokenizer = minilm.classifier()
    text = "An unbelievably self-indulgent film, isn't it?"
    e = normx.explain(model, tokenizer, text)
    w = e.words("sum")
    covered = sorted(i for g in w.groups for i in g)
    assert covered == list(range(len(e.tokens)))
    assert [t for t, s in zip(w.tokens, w.special) if not s] == [text[a:b] for a, b in word_spans(text)]
    np.testing.assert_allclose(w.score.sum(), e.score.sum(), rtol=1e-5)
    assert w.tokens[0] == "[CLS]" and w.special[0] and w.special[-1]


def test_pair_words_keep_segments():
    model, tokenizer = minilm.classifier()
    e = normx.explain(model, tokenizer, "A man plays.", text_pair="Someone is playing.")
    w = e.words()
    assert [t for t, s in zip(w.tokens, w.segments) if s == 0] == ["A", "man", "plays", "."]
    assert [t for t, s in zip(w.tokens, w.segments) if s == 1] == ["Someone", "is", "playing", "."]
    assert sum(w.special) == 3  # [CLS] and two [SEP]


def test_typed_fields_follow_every_view():
    import tiny

    import normx

    model, tokenizer = tiny.build("BertForSequenceClassification")
    e = normx.explain(model, tokenizer, "the film was a gripping story")
    assert (e.kind, e.regression, e.family, e.pooled) == ("sequence_classification", False, "bert", 0)
    assert e.tokens[e.pooled] == "[CLS]" and not e.vocabulary
    assert e.words().pooled == 0 and e.words().tokens[0] == "[CLS]"
    assert e.without_special().pooled is None  # the pooled [CLS] is a special token
    decoder, decoder_tokenizer = tiny.build("LlamaForCausalLM")
    d = normx.explain(decoder, decoder_tokenizer, "the film was a gripping story")
    assert d.kind == "causal_lm" and d.vocabulary and d.pooled == len(d.tokens) - 1
    assert d.without_special().pooled == len(d.without_special().tokens) - 1
    assert {"kind", "regression", "family", "pooled"} <= set(e.to_dict()) and "kind" not in e.settings
