"""Fine-tuning a masked LM on BLiMP pairs (normx.zoo.blimp_training, the minilm-blimp preset's recipe): the logits read
at the mask, the paper's two-way loss, accuracy, and training → saving → reloading on a tiny model."""

import json

import pytest
import tiny
import torch
from blimp_data import write_data as _write_data

from normx.evaluation import blimp
from normx.zoo import blimp_training as blimp_lm
from normx.zoo.training import Recipe, evaluate, train


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write_data(tmp_path_factory.mktemp("blimp-lm-data"))


def _all_items(tokenizer, data):
    return blimp_lm.items(tokenizer, "train", data) + blimp_lm.items(tokenizer, "dev", data)


def test_items_are_the_masked_items_of_the_two_disjoint_parts(data):
    _, tokenizer = tiny.build("BertForMaskedLM")
    train, dev = blimp_lm.items(tokenizer, "train", data), blimp_lm.items(tokenizer, "dev", data)
    assert train and dev and not {i.pair.sentence for i in train} & {i.pair.sentence for i in dev}
    assert {i.pair.paradigm for i in train} == set(blimp_lm.PARADIGMS)
    assert all(i.text.count(tokenizer.mask_token) == 1 for i in train + dev)


def test_contrast_logits_are_the_models_logits_at_the_mask(data):
    model, tokenizer = tiny.build("BertForMaskedLM")
    items = _all_items(tokenizer, data)
    with torch.no_grad():
        batched = blimp_lm.contrast_logits(model, tokenizer, items, 64, "cpu")  # padded batch
        for row, item in zip(batched, items):
            enc = tokenizer(item.text, return_tensors="pt")
            at = enc["input_ids"][0].tolist().index(tokenizer.mask_token_id)
            logits = model(**enc).logits[0, at]
            torch.testing.assert_close(row, logits[[item.target_id, item.foil_id]], atol=1e-4, rtol=1e-5)


def test_loss_and_accuracy_by_hand(data):
    model, tokenizer = tiny.build("BertForMaskedLM")
    items = _all_items(tokenizer, data)
    with torch.no_grad():
        pair = blimp_lm.contrast_logits(model, tokenizer, items, 64, "cpu")
        expected = (torch.logsumexp(pair, dim=1) - pair[:, 0]).mean()  # -log softmax(target, foil)[target]
        torch.testing.assert_close(blimp_lm.loss(model, tokenizer, items, 64, "cpu"), expected)
    right = (pair[:, 0] > pair[:, 1]).float().mean().item()
    assert blimp_lm.accuracy(model, tokenizer, items, batch_size=3) == pytest.approx(right)
    assert 0.0 < right < 1.0  # a random tiny model gets some right and some wrong: the comparison is not trivial


def test_an_item_without_its_mask_inside_max_length_is_an_error(data):
    model, tokenizer = tiny.build("BertForMaskedLM")
    item = blimp_lm.items(tokenizer, "train", data)[0]
    cut = blimp.Item(item.pair, item.text.replace(tokenizer.mask_token, "x"), item.target_id, item.foil_id,
                     item.evidence_spans)
    with pytest.raises(ValueError, match="exactly one mask token"):
        blimp_lm.contrast_logits(model, tokenizer, [item, cut], 64, "cpu")


def test_training_lowers_the_loss_and_the_saved_adapter_reloads(data, tmp_path):
    from peft import PeftModel

    def build():
        return tiny.build("BertForMaskedLM", fresh=True)

    recipe = Recipe("blimp", ("query", "value"), ("predictions.transform",), rank=4, alpha=8, dropout=0.0,
                    lr=2e-2, epochs=8.0, batch_size=4, max_length=64)
    base, tokenizer = build()
    train_items = blimp_lm.items(tokenizer, "train", data)
    with torch.no_grad():
        before = blimp_lm.loss(base, tokenizer, train_items, 64, "cpu").item()

    metrics = train(recipe, build, tmp_path / "adapter", data_path=data, seed=0, progress=False)
    assert metrics["metric"] == "accuracy" and metrics["examples"] == len(blimp_lm.items(tokenizer, "dev", data))
    assert metrics["train_examples"] == len(train_items)
    saved = json.loads((tmp_path / "adapter" / "metrics.json").read_text())
    assert saved["value"] == metrics["value"]

    fresh, _ = build()
    reloaded = PeftModel.from_pretrained(fresh, str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        after = blimp_lm.loss(reloaded, tokenizer, train_items, 64, "cpu").item()
    assert after < 0.5 * before  # the adapter and the MLM transform were trained and saved, and load back
    assert evaluate(reloaded, tokenizer, "blimp", data, progress=False)["value"] == metrics["value"]
