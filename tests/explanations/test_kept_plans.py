"""What ``explain`` resolves of its arguments is kept between calls (normx.explanations.kept_plans), and made anew
whenever what it was read from changes: the config, the tokenizer, the module tree, the arguments."""

import copy
import sys

import numpy as np
import pytest
import tiny
import torch

import normx
from normx.explanations import kept_plans
from normx.explanations.explain import prepare

TEXT = tiny.TEXTS[0]


@pytest.fixture
def bert():
    return tiny.build("BertForSequenceClassification", fresh=True)


def test_a_plan_is_kept_for_the_same_model_tokenizer_and_arguments(bert):
    model, tokenizer = bert
    first = prepare(model, tokenizer)
    assert prepare(model, tokenizer).labels is first.labels  # kept
    assert prepare(model, tokenizer, target=1).labels is not first.labels  # other arguments: another entry
    assert prepare(model, tokenizer, target=[0, 1]).labels is prepare(model, tokenizer, target=(0, 1)).labels
    assert prepare(model, tokenizer, layer=1).layers == [1]
    assert prepare(model, tokenizer).layers == [model.config.num_hidden_layers]
    other = copy.deepcopy(tokenizer)
    assert prepare(model, other).labels is not first.labels and prepare(model, other).labels.tokenizer is other


def test_a_changed_config_makes_the_plan_anew(bert):
    model, tokenizer = bert
    names = normx.explain(model, tokenizer, TEXT, target="all").labels
    model.config.id2label[1] = "renamed"  # in place: the kept copy is a deep one
    assert normx.explain(model, tokenizer, TEXT, target="all").labels == [names[0], "renamed", *names[2:]]
    model.config.problem_type = "multi_label_classification"
    result = normx.explain(model, tokenizer, TEXT)
    with torch.no_grad():
        logits = model(**tokenizer(TEXT, return_tensors="pt")).logits[0]
    np.testing.assert_allclose(list(result.probabilities.values()), logits.sigmoid().numpy(), rtol=1e-5)


def test_a_replaced_block_makes_the_plan_anew(bert):
    model, tokenizer = bert
    layers = prepare(model, tokenizer, layer="all").layers
    model.bert.encoder.layer.append(copy.deepcopy(model.bert.encoder.layer[-1]))
    assert prepare(model, tokenizer, layer="all").layers == [*layers, len(layers)]


def test_calls_with_arguments_that_have_no_key_are_made_each_time(bert):
    model, tokenizer = bert
    baselines = torch.zeros(1)
    assert kept_plans.key_of(None, {"baselines": baselines}) is None
    assert kept_plans.key_of(1, True) != kept_plans.key_of(True, 1)  # True is not 1 here
    first = prepare(model, tokenizer, layer=np.int64(1))  # not a plain int: resolved on every call
    assert prepare(model, tokenizer, layer=np.int64(1)).labels is not first.labels
    assert first.layers == [1]


def test_at_most_size_entries_are_kept_per_model(bert):
    model, tokenizer = bert
    made = [copy.deepcopy(tokenizer) for _ in range(kept_plans.SIZE + 3)]
    for other in made:
        prepare(model, other)
    from normx.models.structure import kept

    store = kept(model, "plans", dict)
    assert len(store) == kept_plans.SIZE
    assert all(entry.tokenizer is not made[0] for entry in store.values())  # the oldest went first


def test_a_vocabulary_target_is_resolved_on_every_call():
    model, shared = tiny.build("BertForMaskedLM", fresh=True)
    tokenizer = copy.deepcopy(shared)  # (the tests' tokenizers are shared: this one gets a token added)
    token = tokenizer.convert_ids_to_tokens(7)
    assert prepare(model, tokenizer, target=token).target_columns == [7]
    tokenizer.add_tokens(["zzzqqq"])
    assert prepare(model, tokenizer, target="zzzqqq").target_columns == [tokenizer.convert_tokens_to_ids("zzzqqq")]
    assert prepare(model, tokenizer).labels is prepare(model, tokenizer).labels  # no target: kept


def test_a_config_unequal_to_its_own_copy_is_not_kept(bert):
    model, tokenizer = bert
    model.config.opaque = object()  # compared by identity: a deep copy never equals it
    first = prepare(model, tokenizer)
    assert prepare(model, tokenizer).labels is not first.labels
    from normx.models.structure import kept

    assert not kept(model, "plans", dict)


def test_threads_with_their_own_tokenizers_and_targets_get_what_they_would_get_alone(bert):
    """Threads sharing one model, each with its own tokenizer copy and target, more of them than the store keeps
    (entries made, used and dropped at once): each gets the explanation it gets alone."""
    from threads import in_threads

    model, tokenizer = bert
    count = kept_plans.SIZE + 4
    tokenizers = [copy.deepcopy(tokenizer) for _ in range(count)]
    targets = [None, 0, 1, [0, 2], "all"]
    alone = {i: normx.explain(model, tokenizers[i], TEXT, target=targets[i % 5]) for i in range(count)}

    def work(i):
        return [normx.explain(model, tokenizers[(i + k) % count], TEXT, target=targets[(i + k) % count % 5])
                for k in range(3)]

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch every microsecond: inside each other's lookups and stores
    try:
        found = in_threads(work, count)
    finally:
        sys.setswitchinterval(switch)
    for i, results in found.items():
        for k, got in enumerate(results):
            want = alone[(i + k) % count]
            assert got.labels == want.labels and got.prediction == want.prediction
            np.testing.assert_allclose(got.scores, want.scores, rtol=1e-5, atol=1e-6)
