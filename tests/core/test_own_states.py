"""A pass reads the model's own hidden states, asked for by index, where the first-use check found them to be the very
tensors its hooks capture (:attr:`normx.core.forward.OwnForward.states`); everywhere else, and once the module tree
has changed, it hooks. A pass on rows that fill their batch leaves an all-ones attention mask out where the check
found the backbone exactly the same without it (:attr:`~normx.core.forward.OwnForward.unmasked`). Either way the
scores are the same."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import tiny
import torch

import normx
import normx.core.forward
from normx.core.forward import OWN_FORWARD
from normx.core.verify import _own_states, _unmasked
from normx.models.structure import recalled, remember

TEXT = " ".join(tiny.CORPUS[:2])


def _hooked(monkeypatch) -> list:
    """Each call of the hooks' capture (:func:`normx.core.forward.capture_layers`) from now on."""
    calls = []
    real = normx.core.forward.capture_layers

    def counted(*args, **kwargs):
        calls.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(normx.core.forward, "capture_layers", counted)
    return calls


@pytest.mark.parametrize("case_id", ["BertForSequenceClassification", "ElectraForMaskedLM",
                                     "DebertaV2ForSequenceClassification", "LlamaForCausalLM",
                                     "GPT2ForSequenceClassification"])
def test_own_hidden_states_give_the_hooks_scores(case_id, monkeypatch):
    model, tokenizer = tiny.build(case_id, fresh=True)
    texts = tiny.texts_for(tiny.CASE_BY_ID[case_id], tokenizer)
    normx.explain(model, tokenizer, texts[0])  # the first-use check finds them
    found = recalled(model, OWN_FORWARD)
    own = found.states
    layers = normx.get_adapter(model).num_layers(model)
    assert own <= set(range(layers + 1))
    hooked = _hooked(monkeypatch)
    calls = [dict(method=method, layer=layer) for method in ("normxlogit", "logat", "l2norm")
             for layer in (None, "all", 1)]
    read = [normx.explain(model, tokenizer, texts, batch_size=2, **call) for call in calls]
    used_own = len(hooked) < len(calls)  # (hooks only for the calls whose layers are not all its own)
    remember(model, OWN_FORWARD, replace(found, states=frozenset()))  # every pass hooks now
    hooked.clear()
    for call, got in zip(calls, read):
        want = normx.explain(model, tokenizer, texts, batch_size=2, **call)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a.scores, b.scores)
            assert a.prediction == b.prediction
    assert len(hooked) == len(calls) * -(-len(texts) // 2)
    if own == set(range(layers + 1)):
        assert used_own


def test_an_encoders_hidden_states_are_its_own_and_a_decoders_last_is_not():
    """BERT reports every block's output as it is; Llama reports its last layer after the final norm (which normx
    applies in the head), so that layer is hooked."""
    bert, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    normx.explain(bert, tokenizer, TEXT)
    assert recalled(bert, OWN_FORWARD).states == frozenset({0, 1, 2})
    llama, tokenizer = tiny.build("LlamaForCausalLM", fresh=True)
    normx.explain(llama, tokenizer, TEXT)
    assert recalled(llama, OWN_FORWARD).states == frozenset({0, 1})


def test_a_bert_pass_hooks_nothing_until_its_tree_changes(monkeypatch):
    model, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    before = normx.explain(model, tokenizer, TEXT, layer="all").scores
    hooked = _hooked(monkeypatch)
    normx.explain(model, tokenizer, TEXT, layer="all")
    assert hooked == []
    normx.explain(model, tokenizer, TEXT, embedding="word")  # the raw word embedding: no hidden state reports it
    assert len(hooked) == 1
    weights = model.classifier.state_dict()
    model.classifier = torch.nn.Linear(model.classifier.in_features, model.classifier.out_features)
    model.classifier.load_state_dict(weights)
    assert recalled(model, OWN_FORWARD) is None  # a registration: what the check found is not kept
    hooked.clear()
    again = normx.explain(model, tokenizer, TEXT, layer="all").scores  # the same weights, read through hooks
    assert len(hooked) == 1
    np.testing.assert_array_equal(again, before)


def test_a_forward_that_takes_no_index_or_returns_every_layer_has_no_own_states():
    model, _ = tiny.build("BertForSequenceClassification", fresh=True)
    adapter = normx.get_adapter(model)
    blocks = adapter.block_modules(model)
    inputs = {"input_ids": torch.tensor([[5, 6, 7, 8]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    with torch.no_grad():
        assert _own_states(model, adapter, blocks, inputs) == frozenset({0, 1, 2})
        forward = model.bert.forward

        def every_layer(*args, output_hidden_states=None, **kwargs):  # a flag, not a selection
            return forward(*args, output_hidden_states=bool(output_hidden_states), **kwargs)

        model.bert.forward = every_layer
        assert _own_states(model, adapter, blocks, inputs) == frozenset()

        def no_index(*args, output_hidden_states=None, **kwargs):
            if isinstance(output_hidden_states, list):
                raise TypeError("output_hidden_states must be a bool")
            return forward(*args, **kwargs)

        model.bert.forward = no_index
        assert _own_states(model, adapter, blocks, inputs) == frozenset()
        del model.bert.forward


def test_threads_reading_own_states_get_what_they_get_alone():
    from threads import in_threads

    model, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    texts = [" ".join(tiny.CORPUS[i:i + 2 + i % 3]) for i in range(8)]
    alone = [normx.explain(model, tokenizer, text, layer="all").scores for text in texts]

    def work(i):
        with torch.no_grad():  # another caller's own pass asking for every hidden state meanwhile
            hidden = model(**tokenizer(texts[i], return_tensors="pt"), output_hidden_states=True).hidden_states
        got = [normx.explain(model, tokenizer, texts[(i + k) % len(texts)], layer="all").scores for k in range(6)]
        return len(hidden), got

    for i, (count, got) in in_threads(work, 8).items():
        assert count == 3
        for k, scores in enumerate(got):
            np.testing.assert_array_equal(scores, alone[(i + k) % len(texts)])


def _masks(model, monkeypatch) -> list:
    """Whether each backbone call from now on got an attention mask."""
    seen = []
    forward = type(model.base_model).forward

    def spied(self, *args, **kwargs):
        seen.append(kwargs.get("attention_mask") is not None)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(model.base_model), "forward", spied)
    return seen


@pytest.mark.parametrize("case_id", ["BertForSequenceClassification", "LlamaForCausalLM"])
def test_rows_that_fill_their_batch_run_without_a_mask_of_ones(case_id, monkeypatch):
    model, tokenizer = tiny.build(case_id, fresh=True)
    texts = tiny.texts_for(tiny.CASE_BY_ID[case_id], tokenizer)
    normx.explain(model, tokenizer, texts[0])
    found = recalled(model, OWN_FORWARD)
    assert found.unmasked is True
    same = [t for t in texts if len(tokenizer(t)["input_ids"]) == len(tokenizer(texts[0])["input_ids"])]
    mixed = [texts[0], *[t for t in texts if len(tokenizer(t)["input_ids"]) != len(tokenizer(texts[0])["input_ids"])]]
    assert len(mixed) > 1
    seen = _masks(model, monkeypatch)
    calls = [(same, "all"), (mixed, "all"), (texts[0], None)]
    got = [normx.explain(model, tokenizer, texts_, layer=layer, batch_size=8) for texts_, layer in calls]
    assert seen == [False, True, False]
    remember(model, OWN_FORWARD, replace(found, unmasked=False))
    want = [normx.explain(model, tokenizer, texts_, layer=layer, batch_size=8) for texts_, layer in calls]
    assert seen[3:] == [True, True, True]
    for a, b in zip(got, want):
        for x, y in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b]):
            np.testing.assert_array_equal(x.scores, y.scores)


def test_a_row_ending_in_the_pad_token_keeps_its_mask(monkeypatch):
    """transformers warns that a row given no mask may be padded where it starts or ends with the pad token."""
    model, tokenizer = tiny.build("LlamaForCausalLM", fresh=True)
    normx.explain(model, tokenizer, TEXT)
    seen = _masks(model, monkeypatch)
    pad = tokenizer.convert_ids_to_tokens(model.config.pad_token_id)
    normx.explain(model, tokenizer, TEXT + pad)
    normx.explain(model, tokenizer, TEXT)
    assert seen == [True, False]


def test_a_backbone_that_differs_without_its_mask_keeps_it():
    model, _ = tiny.build("BertForSequenceClassification", fresh=True)
    adapter = normx.get_adapter(model)
    row = {"input_ids": torch.tensor([[5, 6, 7, 8]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    with torch.no_grad():
        assert _unmasked(model, adapter, row, model(**row, output_hidden_states=True))
        forward = model.bert.forward

        def shifted(*args, attention_mask=None, **kwargs):  # a model that reads a missing mask otherwise
            out = forward(*args, attention_mask=attention_mask, **kwargs)
            if attention_mask is None:
                out.last_hidden_state = out.last_hidden_state + 1e-6
            return out

        model.bert.forward = shifted
        assert not _unmasked(model, adapter, row, model(**row, output_hidden_states=True))
        del model.bert.forward


@pytest.mark.parametrize(("case_id", "where"), [("BertForSequenceClassification", "first"),
                                                ("GPT2ForSequenceClassification", "last"),
                                                ("LlamaForCausalLM", "last"), ("ElectraForMaskedLM", None)])
def test_rows_that_fill_their_batch_pool_where_their_mask_says(case_id, where):
    """Where every row fills its batch, the position each pools at is known without reading the batch (the first or
    the last; a mask token's is read from the tokens): the rows read there are those the mask finds."""
    from normx.core.forward import Pass
    from normx.core.inputs import batches, encode
    from normx.explanations.explain import prepare

    model, tokenizer = tiny.build(case_id)
    text = tiny.texts_for(tiny.CASE_BY_ID[case_id], tokenizer)[0]
    plan = prepare(model, tokenizer)
    encoded = encode(tokenizer, [text, text], None, 512, "warn")
    _, inputs = next(batches(encoded, 2, tokenizer, torch.device("cpu")))
    width = inputs["input_ids"].shape[1]
    runs = [Pass(plan.base, plan.adapter, inputs, plan.layers, mask_token_id=tokenizer.mask_token_id, full=full)
            for full in (True, False)]
    for run in runs:
        with torch.inference_mode():
            run.run()
    assert runs[0].at == {"first": 0, "last": width - 1, None: None}[where] and runs[1].at is None
    every = torch.arange(2 * width * 3, dtype=torch.float32).reshape(2, width, 3)
    torch.testing.assert_close(runs[0].pooled, runs[1].pooled, rtol=0, atol=0)
    torch.testing.assert_close(runs[0].pooled_rows(every), runs[1].pooled_rows(every), rtol=0, atol=0)
    torch.testing.assert_close(runs[0].pooled_rows(every), every[torch.arange(2), runs[1].pooled], rtol=0, atol=0)


def test_a_generation_read_from_one_pass_leaves_its_mask_out(monkeypatch):
    """explain_generation's one pass over a prompt and its continuation fills its batch: a per-position method's pass
    runs without a mask of ones, with the same scores as with it."""
    model, tokenizer = tiny.build("LlamaForCausalLM", fresh=True)
    normx.explain(model, tokenizer, TEXT)
    found = recalled(model, OWN_FORWARD)
    assert found.unmasked is True
    seen = _masks(model, monkeypatch)
    target = tokenizer(" the end", add_special_tokens=False)["input_ids"]
    got = normx.explain_generation(model, tokenizer, TEXT, method="normxlogit", target=target)
    remember(model, OWN_FORWARD, replace(found, unmasked=False))
    want = normx.explain_generation(model, tokenizer, TEXT, method="normxlogit", target=target)
    assert seen == [False, True]
    for a, b in zip(got.rows(), want.rows()):
        np.testing.assert_array_equal(a, b)
