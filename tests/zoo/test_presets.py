"""The offline presets: listed, loadable by name, and predicting what they were trained for."""

import json

import pytest
import torch

import normx
from normx.cli.main import main
from normx.errors import ModelLoadError
from normx.zoo import presets

TRAINED = [name for name, p in presets.PRESETS.items() if p.recipe is not None and p.metrics() is not None]
MINILM = [name for name in TRAINED if presets.PRESETS[name].base == "minilm"]


def test_models_listing(capsys):
    assert main(["models", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert set(rows) == set(presets.PRESETS)
    assert rows["minilm-sst2"]["labels"] == ["negative", "positive"] and rows["minilm-sst2"]["metric"] == "accuracy"
    assert rows["minilm-stsb"]["metric"] == "pearson" and rows["smollm2"]["metric"] is None
    for name in TRAINED:
        assert 0 < rows[name]["size_mb"] < 5  # adapters stay small; the bases come from PyPI


def test_unknown_and_untrained_presets(tmp_path):
    with pytest.raises(ModelLoadError, match="minilm-sst2"):
        presets.get_preset("bert-large")
    ghost = presets.Preset("ghost", "minilm", "sequence-classification", "x", labels=("a", "b"),
                           recipe=presets.PRESETS["minilm-sst2"].recipe)
    with pytest.raises(ModelLoadError, match="normx train ghost"):
        ghost.load()


@pytest.mark.parametrize("name", [n for n in MINILM if presets.PRESETS[n].task == "sequence-classification"])
def test_minilm_presets_load_offline_and_explain(name):
    preset = presets.PRESETS[name]
    model, tokenizer = normx.load_model(name)
    assert type(model).__name__.startswith("PeftModel")
    pair = "A man is playing a guitar." if preset.inputs == "pair" else None
    text = ("Who is playing a guitar?" if name == "minilm-qnli" else "A man plays the guitar." if pair
            else "a gripping, beautifully acted film")
    e = normx.explain(model, tokenizer, text, text_pair=pair)
    enc = tokenizer(text, pair, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits[0]
    if preset.labels == ("score",):
        assert e.prediction == pytest.approx(float(logits[0]), abs=1e-4)
        assert e.prediction > 3.0  # near-paraphrases score high on the 0-5 scale
    else:
        assert e.probabilities == pytest.approx(dict(zip(preset.labels, logits.softmax(-1).tolist())), abs=1e-5)
    if name == "minilm-sst2":
        assert e.prediction == "positive"
        assert normx.explain(model, tokenizer, "a dull, lifeless and tedious mess").prediction == "negative"
    if name in ("minilm-mnli", "minilm-qnli"):
        assert e.prediction == "entailment"


def test_masked_lm_preset_prefers_the_grammatical_word():
    """minilm-blimp: at the mask, the head's logit of the agreeing word beats the other, and LogAt at the mask on
    the last layer is that logit (the head run on the mask token is the model's own output)."""
    model, tokenizer = normx.load_model("minilm-blimp")
    assert type(model).__name__.startswith("PeftModel") and type(model.get_base_model()).__name__ == "BertForMaskedLM"
    cases = [("The cats near the door [MASK] sleeping.", "are", "is"),
             ("The teacher [MASK] the students.", "likes", "like"),
             ("Susan revealed [MASK].", "herself", "themselves"),
             # the paper's determiner-noun items mask the determiner (dna_2: "Russell explored this / these mall")
             ("Russell explored [MASK] mall.", "this", "these"),
             ("Russell explored [MASK] malls.", "these", "this")]
    for text, good, bad in cases:
        ids = tokenizer.convert_tokens_to_ids([good, bad])
        e = normx.explain(model, tokenizer, text, method="logat", target=ids)
        enc = tokenizer(text, return_tensors="pt")
        at = enc["input_ids"][0].tolist().index(tokenizer.mask_token_id)
        with torch.no_grad():
            logits = model(**enc).logits[0, at, ids]
        torch.testing.assert_close(torch.as_tensor(e.scores[:, -1, at]).float(), logits, atol=1e-4, rtol=1e-4)
        assert logits[0] > logits[1], (text, good, bad)


@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINED)
def test_reported_metric_is_reproduced(name):
    """Re-evaluates the shipped adapter on the dev data; the figure must match the one in metrics.json."""
    from locations import SHARED

    from normx.zoo.training import evaluate

    preset = presets.PRESETS[name]
    model, tokenizer = normx.load_model(name)
    result = evaluate(model, tokenizer, preset.recipe.task, SHARED, progress=False)
    assert result["value"] == pytest.approx(preset.metrics()["value"], abs=0.005)


def test_a_preset_tells_of_its_first_conversion(monkeypatch, caplog):
    """The smollm2 preset's base is a GGUF file converted once: load_model passes its notify (by default the normx
    logger's warning, shown on standard error) to the conversion, as for a GGUF file given by path."""
    import logging

    from normx.models import gguf

    seen = []
    real = gguf.converted_folder
    monkeypatch.setattr(gguf, "converted_folder", lambda *a, **k: seen.append(k.get("notify")) or real(*a, **k))
    normx.load_model("smollm2", notify=print)
    assert seen and seen[-1] is print
    normx.load_model("smollm2")
    with caplog.at_level(logging.WARNING, logger="normx"):
        seen[-1]("converting ...")
    assert "converting ..." in caplog.text
