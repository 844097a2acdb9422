"""Every registered head-on-top adapter against the model itself and against hand-written references.

The references below never call normx: they take ``model(**enc, output_hidden_states=True)`` on one unpadded
text and apply each family's head written out by hand from the model's own modules. NormXLogit is
``||x_i^0|| * LogAt(x_i^l)``, LogAt is the head run on token i as if it were the pooled token (read at the label
column, minus the foil column if one is given), l2norm is ``||x_i^l||`` (raw block output, no final norm), and
for regression LogAt is ``|HoT(x_i^l) - HoT(x_pooled^l)|``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import tiny
import torch
import torch.nn.functional as F
import transformers
from peft_cases import PEFT_CASES, base_of, live, peft_model
from tiny import CASES, ID2LABEL, LAYERS, PAIRS, TEXTS, Case, build, texts_for

import normx
from normx.core.forward import Pass
from normx.errors import PairNotSupportedError, UnknownTargetError
from normx.models import get_adapter, unwrap_model
from normx.models.families import builtin_adapters

ATOL = 1e-5
RTOL = 1e-5  # scores reach ~30; float32 batching noise is ~1e-6 relative
PARITY_ATOL = 1e-4
METHODS = ("normxlogit", "logat", "l2norm")
CLASSIFIERS = [c for c in CASES if c.kind == "sequence_classification"]
LM_CASES = [c for c in CASES if c.kind != "sequence_classification"]


def ids(cases):
    return [c.id for c in cases]


# ---- the reference ---------------------------------------------------------------------------------------------------

def final_norm(base, cls: str):
    if cls.startswith("GPT2"):
        return live(base.transformer.ln_f)
    if cls.startswith(("Llama", "Mistral", "Qwen")):
        return live(base.model.norm)
    return None


def head_by_hand(base, cls: str, h: torch.Tensor) -> torch.Tensor:
    """The head-on-top of ``cls`` applied to every row of ``h`` [T, H] as if it were the pooled token -> [T, C]."""
    if cls == "BertForSequenceClassification":
        return live(base.classifier)(torch.tanh(live(base.bert.pooler).dense(h)))
    if cls in ("RobertaForSequenceClassification", "XLMRobertaForSequenceClassification"):
        head = live(base.classifier)
        return head.out_proj(torch.tanh(head.dense(h)))
    if cls == "ElectraForSequenceClassification":
        head = live(base.classifier)
        return head.out_proj(F.gelu(head.dense(h)))
    if cls == "DistilBertForSequenceClassification":
        return live(base.classifier)(torch.relu(live(base.pre_classifier)(h)))
    if cls == "DebertaV2ForSequenceClassification":
        return live(base.classifier)(F.gelu(live(base.pooler).dense(h)))
    if cls.endswith("ForSequenceClassification"):  # decoders: score on the final-normed state
        return live(base.score)(h)
    if cls == "BertForMaskedLM" or (cls == "DebertaV2ForMaskedLM" and base.config.legacy):
        predictions = live(base.cls).predictions
        t = predictions.transform
        return predictions.decoder(t.LayerNorm(F.gelu(t.dense(h))))
    if cls == "DebertaV2ForMaskedLM":
        head = live(base.lm_predictions).lm_head
        x = head.LayerNorm(F.gelu(head.dense(h)))
        return x @ base.deberta.embeddings.word_embeddings.weight.T + head.bias
    if cls in ("RobertaForMaskedLM", "XLMRobertaForMaskedLM"):
        head = live(base.lm_head)
        return head.decoder(head.layer_norm(F.gelu(head.dense(h))))
    if cls == "DistilBertForMaskedLM":
        x = live(base.vocab_layer_norm)(F.gelu(live(base.vocab_transform)(h)))
        return live(base.vocab_projector)(x)
    if cls == "ElectraForMaskedLM":
        g = live(base.generator_predictions)
        return live(base.generator_lm_head)(g.LayerNorm(F.gelu(g.dense(h))))
    if cls.endswith(("ForCausalLM", "LMHeadModel")):
        return live(base.lm_head)(h)
    raise KeyError(cls)


_UNSET = object()


@dataclass
class Ref:
    ids: list[int]
    hidden: list[torch.Tensor]  # raw x^l, [T, H] for l = 0..L
    head: list[torch.Tensor]  # HoT on every token at layer l, [T, C]
    pooled: int
    logits: torch.Tensor  # the model's own logits at the pooled position, [C]
    word_norm: torch.Tensor  # ||word embedding||, [T]


def hidden_states(model, enc) -> tuple:
    with torch.no_grad():
        out = model(**enc, output_hidden_states=True)
    return out, [h[0] for h in out.hidden_states]


def reference(model, tokenizer, case: Case, text: str, pair: str | None = None) -> Ref:
    base = base_of(model)
    enc = tokenizer(text, pair, return_tensors="pt")
    out, hidden = hidden_states(model, enc)
    norm = final_norm(base, case.cls)
    with torch.no_grad():
        if norm is not None:
            # transformers replaces a decoder's last hidden state by the final-norm output; get the raw one too
            before = base.config.__dict__.get("tie_last_hidden_states", _UNSET)
            base.config.tie_last_hidden_states = False
            try:
                _, raw = hidden_states(model, enc)
            finally:
                if before is _UNSET:
                    del base.config.tie_last_hidden_states
                else:
                    base.config.tie_last_hidden_states = before
            torch.testing.assert_close(norm(raw[-1]), hidden[-1], atol=1e-5, rtol=1e-5)
            for a, b in zip(raw[:-1], hidden[:-1]):
                torch.testing.assert_close(a, b, atol=0, rtol=0)
            hidden = raw
        heads = [head_by_hand(base, case.cls, h if norm is None else norm(h)).float() for h in hidden]
        word_norm = base.get_input_embeddings()(enc["input_ids"][0]).float().norm(dim=-1)
    ids_ = enc["input_ids"][0].tolist()
    if case.kind == "masked_lm":
        pooled = ids_.index(tokenizer.mask_token_id)
    elif case.decoder and case.kind == "sequence_classification" and base.config.pad_token_id is not None:
        # transformers' decoder classifiers pool the rightmost token that is not the pad token
        pooled = max(i for i, t in enumerate(ids_) if t != base.config.pad_token_id)
    elif case.decoder:
        pooled = len(ids_) - 1
    else:
        pooled = 0
    logits = out.logits[0] if case.kind == "sequence_classification" else out.logits[0, pooled]
    # the hand-written head at the pooled position must be the model's own output
    torch.testing.assert_close(heads[-1][pooled], logits.float(), atol=1e-5, rtol=1e-5)
    return Ref(ids_, [h.float() for h in hidden], heads, pooled, logits.float(), word_norm)


def expected(ref: Ref, method: str, layers: list[int], columns: list[int], foil: int | None = None,
             regression: bool = False, embedding: str = "layer") -> np.ndarray:
    x0 = ref.hidden[0].norm(dim=-1) if embedding == "layer" else ref.word_norm
    per_label = []
    for column in columns:
        rows = []
        for layer in layers:
            if method == "l2norm":
                rows.append(x0 if layer == 0 else ref.hidden[layer].norm(dim=-1))
                continue
            out = ref.head[layer]
            if regression:
                score = (out[:, 0] - out[ref.pooled, 0]).abs()
            else:
                score = out[:, column] - (out[:, foil] if foil is not None else 0.0)
            rows.append(x0 * score if method == "normxlogit" else score)
        per_label.append(torch.stack(rows))
    return torch.stack(per_label).numpy()


def assert_scores(explanation, want: np.ndarray, atol: float = ATOL):
    assert explanation.scores.shape == want.shape
    np.testing.assert_allclose(explanation.scores, want, atol=atol, rtol=RTOL)


def label_name(case: Case, tokenizer, column: int) -> str:
    if case.kind == "sequence_classification":
        return ID2LABEL[column]
    return tokenizer.convert_ids_to_tokens(column)


def column_of(case: Case, tokenizer, name: str) -> int:
    if case.kind == "sequence_classification":
        return {v: k for k, v in ID2LABEL.items()}[name]
    return tokenizer.convert_tokens_to_ids(name)


def target_specs(case: Case, tokenizer, ref: Ref):
    """(explain kwargs, expected target columns, expected foil column)."""
    order = ref.logits.argsort(descending=True).tolist()
    pred, second, last = order[0], order[1], order[-1]
    if case.kind == "sequence_classification":
        return [
            ({}, [pred], None),
            ({"target": "all"}, [0, 1, 2], None),
            ({"target": second}, [second], None),
            ({"target": ID2LABEL[last]}, [last], None),
            ({"target": [last, pred]}, [last, pred], None),
            ({"foil": ID2LABEL[second]}, [pred], second),
            ({"target": "all", "foil": pred}, [0, 1, 2], pred),
        ]
    return [
        ({}, [pred], None),
        ({"target": second}, [second], None),
        ({"target": tokenizer.convert_ids_to_tokens(last)}, [last], None),
        ({"target": [last, second, pred]}, [last, second, pred], None),
        ({"target": second, "foil": pred}, [second], pred),
    ]


def check_reference(model, tokenizer, case: Case, text: str, pair: str | None = None, methods=METHODS):
    ref = reference(model, tokenizer, case, text, pair)
    layers = list(range(LAYERS + 1))
    tokens = tokenizer.convert_ids_to_tokens(ref.ids)
    for kwargs, columns, foil in target_specs(case, tokenizer, ref):
        for method in methods:
            if method == "l2norm" and (foil is not None or len(kwargs) > 1):
                continue
            exp = normx.explain(model, tokenizer, text, text_pair=pair, method=method, layer="all", **kwargs)
            assert exp.tokens == tokens
            assert exp.layers == layers
            assert exp.labels == [label_name(case, tokenizer, c) for c in columns]
            assert_scores(exp, expected(ref, method, layers, columns, foil))
    return ref


def assert_informative(values: np.ndarray):
    """Scores that vary across tokens: a test comparing them can fail."""
    assert np.isfinite(values).all()
    assert np.ptp(values, axis=-1).min() > 1e-3


# ---- coverage -----------------------------------------------------------------------------------------------------

def test_every_registered_class_has_a_tiny_model():
    assert {c.cls for c in CASES} == set(builtin_adapters())
    assert set(builtin_adapters()) <= set(normx.supported_models())


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_adapter_matches_case(case):
    model, _ = build(case.id)
    adapter = get_adapter(model)
    assert adapter.kind == case.kind
    assert adapter.pooling == ("mask" if case.kind == "masked_lm" else "last" if case.decoder else "first")
    assert adapter.num_layers(model) == LAYERS
    if case.id.startswith("DebertaV2ForMaskedLM"):
        assert model.config.legacy is case.id.endswith("-legacy")


# ---- a. parity with the model's own logits -----------------------------------------------------------------------

def check_parity(model, tokenizer, case: Case, texts: list[str], pairs: list[str] | None = None):
    target = "all" if case.kind == "sequence_classification" else None
    explanations = normx.explain(model, tokenizer, texts, text_pair=pairs, method="logat", target=target,
                                 batch_size=len(texts))
    for i, (text, exp) in enumerate(zip(texts, explanations)):
        ref = reference(model, tokenizer, case, text, None if pairs is None else pairs[i])
        probs = ref.logits.softmax(-1)
        assert exp.prediction == label_name(case, tokenizer, int(ref.logits.argmax()))
        assert exp.pooled == ref.pooled
        if case.kind == "sequence_classification":
            assert set(exp.probabilities) == set(ID2LABEL.values())
        else:
            top = {tokenizer.convert_ids_to_tokens(j) for j in probs.topk(5).indices.tolist()}
            assert top <= set(exp.probabilities)
        for name, p in exp.probabilities.items():
            assert p == pytest.approx(float(probs[column_of(case, tokenizer, name)]), abs=1e-5)
        assert sum(exp.probabilities.values()) <= 1 + 1e-5


def check_pass_parity(model, tokenizer, case: Case, texts: list[str], padding_side: str = "right"):
    """``Pass.run().pooled_logits()`` on a padded batch == the model's logits at the pooled positions."""
    tokenizer_side = tokenizer.padding_side
    tokenizer.padding_side = padding_side
    try:
        enc = dict(tokenizer(texts, padding=True, return_tensors="pt"))
    finally:
        tokenizer.padding_side = tokenizer_side
    mask = enc["attention_mask"]
    if case.decoder:
        enc["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    base = unwrap_model(model)
    with torch.no_grad():
        logits = model(**enc).logits
        run = Pass(base, get_adapter(model), enc, [LAYERS], mask_token_id=tokenizer.mask_token_id).run()
        got = run.pooled_logits()
    rows = torch.arange(len(texts))
    if case.kind == "masked_lm":
        pooled = (enc["input_ids"] == tokenizer.mask_token_id).int().argmax(-1)
    elif case.decoder:
        pad = base.config.pad_token_id if case.kind == "sequence_classification" else None
        pooled = torch.tensor([max(j for j in range(mask.shape[1]) if mask[r, j] and enc["input_ids"][r, j] != pad)
                               for r in range(len(texts))])
    else:
        pooled = torch.tensor([min(j for j in range(mask.shape[1]) if mask[r, j]) for r in range(len(texts))])
    assert run.pooled.tolist() == pooled.tolist()
    want = logits if case.kind == "sequence_classification" else logits[rows, pooled]
    torch.testing.assert_close(got, want, atol=PARITY_ATOL, rtol=0)
    # and each row equals the unpadded single-text logits
    for r, text in enumerate(texts):
        single = reference(model, tokenizer, case, text).logits
        torch.testing.assert_close(got[r].float(), single, atol=PARITY_ATOL, rtol=0)


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_parity_with_model_logits(case):
    model, tokenizer = build(case.id)
    check_parity(model, tokenizer, case, texts_for(case, tokenizer))


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_pass_pooled_logits_parity(case):
    model, tokenizer = build(case.id)
    texts = texts_for(case, tokenizer)
    check_pass_parity(model, tokenizer, case, texts, "right")
    if case.decoder:
        check_pass_parity(model, tokenizer, case, texts, "left")


# ---- b. reference scores -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_scores_match_reference(case):
    model, tokenizer = build(case.id)
    for text in texts_for(case, tokenizer)[:2]:
        ref = check_reference(model, tokenizer, case, text)
        assert_informative(expected(ref, "normxlogit", [0, LAYERS], [int(ref.logits.argmax())]))


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_default_and_listed_layers(case):
    model, tokenizer = build(case.id)
    text = texts_for(case, tokenizer)[0]
    ref = reference(model, tokenizer, case, text)
    pred = [int(ref.logits.argmax())]
    for method in METHODS:
        default = [0] if method == "l2norm" else [LAYERS]
        exp = normx.explain(model, tokenizer, text, method=method)
        assert exp.layers == default
        assert_scores(exp, expected(ref, method, default, pred))
        exp = normx.explain(model, tokenizer, text, method=method, layer=[-1, 0, 1])
        assert exp.layers == [0, 1, LAYERS]
        assert_scores(exp, expected(ref, method, [0, 1, LAYERS], pred))
    # the three methods are different quantities
    a, b, c = (normx.explain(model, tokenizer, text, method=m, layer=LAYERS).scores for m in METHODS)
    assert not np.allclose(a, b, atol=1e-3) and not np.allclose(a, c, atol=1e-3)
    # the last layer differs from the intermediate one
    scores = normx.explain(model, tokenizer, text, method="logat", layer="all").scores
    assert not np.allclose(scores[0, 1], scores[0, 2], atol=1e-3)


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_word_embedding_norm(case):
    model, tokenizer = build(case.id)
    text = texts_for(case, tokenizer)[1]
    ref = reference(model, tokenizer, case, text)
    pred = [int(ref.logits.argmax())]
    for method in ("normxlogit", "l2norm"):
        exp = normx.explain(model, tokenizer, text, method=method, layer=[0, LAYERS], embedding="word")
        assert_scores(exp, expected(ref, method, [0, LAYERS], pred, embedding="word"))
    # the raw word embedding is not the embedding layer's output (except in Llama-style decoders)
    if not case.cls.startswith(("Llama", "Mistral", "Qwen")):
        assert not torch.allclose(ref.word_norm, ref.hidden[0].norm(dim=-1), atol=1e-3)


# ---- c. batch and padding invariance ----------------------------------------------------------------------------

@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_batch_and_padding_invariance(case, side, monkeypatch):
    model, tokenizer = build(case.id)
    monkeypatch.setattr(tokenizer, "padding_side", side)
    texts = texts_for(case, tokenizer)
    target = "all" if case.kind == "sequence_classification" else None
    for method in ("normxlogit", "l2norm"):
        kwargs = dict(method=method, target=target, layer="all")
        singles = [normx.explain(model, tokenizer, text, **kwargs) for text in texts]
        batched = normx.explain(model, tokenizer, texts, batch_size=3, **kwargs)
        reordered = normx.explain(model, tokenizer, texts[::-1], batch_size=2, **kwargs)[::-1]
        doubled = normx.explain(model, tokenizer, texts + texts[:1], batch_size=4, **kwargs)
        assert len({len(tokenizer(t)["input_ids"]) for t in texts}) == len(texts)  # padding really happens
        for i, single in enumerate(singles):
            for other in (batched[i], reordered[i], doubled[i]):
                assert other.tokens == single.tokens
                assert other.labels == single.labels
                assert other.prediction == single.prediction
                assert other.pooled == single.pooled
                np.testing.assert_allclose(other.scores, single.scores, atol=ATOL, rtol=RTOL)
                for name, p in single.probabilities.items():
                    assert other.probabilities[name] == pytest.approx(p, abs=1e-6)
        np.testing.assert_allclose(doubled[3].scores, singles[0].scores, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("case", [c for c in CASES if c.decoder], ids=ids([c for c in CASES if c.decoder]))
def test_decoder_left_padding_matches_reference(case, monkeypatch):
    model, tokenizer = build(case.id)
    monkeypatch.setattr(tokenizer, "padding_side", "left")
    texts = texts_for(case, tokenizer)
    explanations = normx.explain(model, tokenizer, texts, method="normxlogit", layer="all", batch_size=3)
    for text, exp in zip(texts, explanations):
        ref = reference(model, tokenizer, case, text)
        assert_scores(exp, expected(ref, "normxlogit", list(range(LAYERS + 1)), [int(ref.logits.argmax())]))


# ---- d. text pairs ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CLASSIFIERS, ids=ids(CLASSIFIERS))
def test_text_pairs_match_reference(case):
    model, tokenizer = build(case.id)
    explanations = normx.explain(model, tokenizer, TEXTS, text_pair=PAIRS, method="normxlogit", target="all",
                                 layer="all", batch_size=3)
    layers = list(range(LAYERS + 1))
    for text, pair, exp in zip(TEXTS, PAIRS, explanations):
        ref = reference(model, tokenizer, case, text, pair)
        enc = tokenizer(text, pair)
        assert exp.tokens == tokenizer.convert_ids_to_tokens(ref.ids)
        assert exp.text_pair == pair
        sequence_ids = enc.sequence_ids(0)
        for segment, sid, special in zip(exp.segments, sequence_ids, exp.special):
            assert segment == (-1 if sid is None or special else sid)
        assert {0, 1} <= set(exp.segments)
        assert_scores(exp, expected(ref, "normxlogit", layers, [0, 1, 2]))
        probs = ref.logits.softmax(-1)
        for column, name in ID2LABEL.items():
            assert exp.probabilities[name] == pytest.approx(float(probs[column]), abs=1e-5)
    # the pair changes the scores of the first text's tokens, in encoders
    alone = normx.explain(model, tokenizer, TEXTS[0], method="normxlogit", target="all", layer="all")
    n = sum(1 for s in explanations[0].segments if s == 0)
    first = [i for i, s in enumerate(explanations[0].segments) if s == 0]
    first_alone = [i for i, s in enumerate(alone.segments) if s == 0]
    assert len(first_alone) == n
    with_pair, without = explanations[0].scores[:, :, first], alone.scores[:, :, first_alone]
    if case.decoder:  # causal attention: the first text's tokens cannot see the pair that follows them
        np.testing.assert_allclose(with_pair, without, atol=ATOL, rtol=RTOL)
    else:  # bidirectional attention: they can
        assert not np.allclose(with_pair[:, -1], without[:, -1], atol=1e-4)


@pytest.mark.parametrize("case", CLASSIFIERS, ids=ids(CLASSIFIERS))
def test_text_pair_reference_all_methods(case):
    model, tokenizer = build(case.id)
    check_reference(model, tokenizer, case, TEXTS[2], PAIRS[2])


@pytest.mark.parametrize("case", LM_CASES, ids=ids(LM_CASES))
def test_pairs_rejected_for_lm_heads(case):
    model, tokenizer = build(case.id)
    text = texts_for(case, tokenizer)[0]
    with pytest.raises(PairNotSupportedError):
        normx.explain(model, tokenizer, text, text_pair="another text")


# ---- e. regression -------------------------------------------------------------------------------------------------



@pytest.mark.parametrize("case_id", tiny.REGRESSION)
def test_regression_reference(case_id, monkeypatch):
    case = tiny.CASE_BY_ID[case_id]
    model, tokenizer = build(case_id, num_labels=1)
    layers = list(range(LAYERS + 1))
    if case.decoder:
        monkeypatch.setattr(tokenizer, "padding_side", "left")
    for method in ("normxlogit", "logat"):
        explanations = normx.explain(model, tokenizer, TEXTS, method=method, layer="all", batch_size=3)
        for text, exp in zip(TEXTS, explanations):
            ref = reference(model, tokenizer, case, text)
            assert exp.labels == ["score"]
            assert exp.probabilities == {}
            assert exp.regression is True
            assert isinstance(exp.prediction, float)
            assert exp.prediction == pytest.approx(float(ref.logits[0]), abs=PARITY_ATOL)
            want = expected(ref, method, layers, [0], regression=True)
            assert_scores(exp, want)
            assert np.all(exp.scores >= 0)
            # |HoT(x_pooled) - HoT(pooled)| is 0 up to float32 rounding, which differs from CPU to CPU: relative
            # to the size of the explanation's scores
            np.testing.assert_allclose(exp.scores[0, :, ref.pooled], 0.0, atol=1e-5 * np.abs(exp.scores).max())
            assert_informative(want[:, 1:])
    with pytest.raises(UnknownTargetError):
        normx.explain(model, tokenizer, TEXTS[0], target=0)
    with pytest.raises(UnknownTargetError):
        normx.explain(model, tokenizer, TEXTS[0], foil=0)


def test_multi_output_regression_is_rejected_clearly():
    case = tiny.CASE_BY_ID["BertForSequenceClassification"]
    tokenizer = tiny.tokenizer_for(case)
    config = tiny.make_config(case, tokenizer, num_labels=2)
    config.problem_type = "regression"
    model = transformers.BertForSequenceClassification(config).eval()
    with pytest.raises(normx.UnsupportedModelError, match="regression with 2 outputs"):
        normx.explain(model, tokenizer, TEXTS[0])


def test_multi_label_probabilities_are_sigmoids():
    model, tokenizer = build("BertForSequenceClassification", fresh=True)
    model.config.problem_type = "multi_label_classification"
    case = tiny.CASE_BY_ID["BertForSequenceClassification"]
    exp = normx.explain(model, tokenizer, TEXTS[1], method="normxlogit", target="all", layer="all")
    ref = reference(model, tokenizer, case, TEXTS[1])
    for column, name in ID2LABEL.items():
        assert exp.probabilities[name] == pytest.approx(float(ref.logits[column].sigmoid()), abs=1e-6)
    assert_scores(exp, expected(ref, "normxlogit", list(range(LAYERS + 1)), [0, 1, 2]))


# ---- f. PEFT ---------------------------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")
@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")
@pytest.mark.parametrize("name", list(PEFT_CASES))
def test_peft(name):
    model, tokenizer, case, saved = peft_model(name)
    assert type(unwrap_model(model)).__name__ == case.cls
    if "save" in name or ("seqcls" in name and "lora-head" not in name):
        assert saved  # the head really is wrapped in a ModulesToSaveWrapper
    else:
        assert not saved
    texts = texts_for(case, tokenizer)
    # the adapter changes the model: a test that used the base weights would fail
    enc = tokenizer(texts[0], return_tensors="pt")
    with torch.no_grad():
        with_lora = model(**enc).logits
        with model.disable_adapter():
            without = model(**enc).logits
    assert (with_lora - without).abs().max() > 1e-2
    check_parity(model, tokenizer, case, texts)
    check_pass_parity(model, tokenizer, case, texts)
    ref = check_reference(model, tokenizer, case, texts[0])
    exp = normx.explain(model, tokenizer, texts[0], method="normxlogit", layer=[0, LAYERS], embedding="word")
    assert_scores(exp, expected(ref, "normxlogit", [0, LAYERS], [int(ref.logits.argmax())], embedding="word"))
    assert exp.settings["peft"] is True
    # explain leaves the PEFT model as it found it
    assert not model.training


# ---- g. the real all-MiniLM-L6-v2 ---------------------------------------------------------------------------------

MINILM = Case("minilm", "BertForSequenceClassification", "sequence_classification", "wordpiece")


def test_minilm_parity_and_reference():
    model, tokenizer = tiny.minilm_classifier()
    assert model.config.num_hidden_layers == 6 and model.config.hidden_size == 384
    check_parity(model, tokenizer, MINILM, TEXTS)
    check_pass_parity(model, tokenizer, MINILM, TEXTS)
    layers = list(range(7))
    for text in TEXTS[:2]:
        ref = reference(model, tokenizer, MINILM, text)
        for method in METHODS:
            exp = normx.explain(model, tokenizer, text, method=method, target="all", layer="all")
            assert_scores(exp, expected(ref, method, layers, [0, 1, 2]))
        exp = normx.explain(model, tokenizer, text, method="normxlogit", foil=1)
        assert_scores(exp, expected(ref, "normxlogit", [6], [int(ref.logits.argmax())], foil=1))
    exp = normx.explain(model, tokenizer, TEXTS[0], text_pair=PAIRS[0], method="normxlogit", layer="all")
    ref = reference(model, tokenizer, MINILM, TEXTS[0], PAIRS[0])
    assert_scores(exp, expected(ref, "normxlogit", layers, [int(ref.logits.argmax())]))


# ---- the registered families against discovery ---------------------------------------------------------------------

DISCOVERY_FALLS_SHORT = {  # what the registered adapter adds that the conventions do not give
    "DebertaV2ForSequenceClassification": "blocks",  # a convolution replaces layer 0's output (conv_kernel_size)
    "DistilBertForSequenceClassification": "head",  # a functional ReLU between pre_classifier and classifier
    "DistilBertForMaskedLM": "head",
    # the non-legacy head takes the word embeddings as an argument; the convolution as above
    "DebertaV2ForMaskedLM": "(head|final norm|blocks)",
}


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_a_registered_family_is_its_discovered_adapter_plus_overrides(case):
    """Discovery alone reads every registered family but the ones named above as the registered adapter does
    (the same NormXLogit at every layer): the registered adapters are the discovered ones plus what discovery
    cannot give (DecompX's block layouts and head steps, heads that compute only the needed vocabulary columns)."""
    from normx.core import verify
    from normx.models import registry
    from normx.models.discovery import discover

    model, tokenizer = build(case.id)
    registered = get_adapter(model)
    found = discover(unwrap_model(model))
    assert (found.kind, found.pooling, found.num_layers(model)) == (registered.kind, registered.pooling, LAYERS)
    short = DISCOVERY_FALLS_SHORT.get(case.cls)
    if short is not None:
        with pytest.raises(normx.UnsupportedModelError, match=f"at the {short}"):
            verify.verify(model, found)
        return
    verify.verify(model, found)
    text = tiny.texts_for(case, tokenizer)[0]
    want = normx.explain(model, tokenizer, text, layer="all")
    saved = registry._REGISTRY.pop(case.cls)
    try:
        fresh, _ = build(case.id, fresh=True)  # an identical new model: its adapter discovered and verified anew
        got = normx.explain(fresh, tokenizer, text, layer="all")
        assert got.family == found.family == f"{fresh.config.model_type} (discovered)"
    finally:
        registry._REGISTRY[case.cls] = saved
    np.testing.assert_allclose(got.scores, want.scores, rtol=1e-5, atol=1e-5 * np.abs(want.scores).max())
