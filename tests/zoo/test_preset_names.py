"""Presets are names, folders are paths (#42 item 8): a folder in the working directory named like a preset does not
replace it. ``minilm-sst2`` is the preset (with a warning saying how to load the folder); ``./minilm-sst2``, an
absolute path or a ``pathlib.Path`` is the folder."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import minilm
import pytest

import normx
from normx.cli.main import main
from normx.errors import InputWarning
from normx.zoo.presets import preset_named, shadowed_folder

SHADOW = {"0": "SHADOW_A", "1": "SHADOW_B"}


@pytest.fixture
def shadowing(tmp_path, monkeypatch):
    """The working directory holds ./minilm-sst2/, a classifier with labels of its own."""
    folder = tmp_path / "minilm-sst2"
    minilm.save_classifier(folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(id2label=SHADOW, label2id={v: int(k) for k, v in SHADOW.items()})
    (folder / "config.json").write_text(json.dumps(config))
    monkeypatch.chdir(tmp_path)
    return folder


def labels(model) -> list[str]:
    return [model.config.id2label[i] for i in sorted(model.config.id2label)]


def test_a_bare_name_is_the_preset_even_beside_a_folder_of_that_name(shadowing):
    with pytest.warns(InputWarning, match=r"'minilm-sst2' is a preset and also a folder here: the preset was loaded "
                                          r".*give its path: \./minilm-sst2"):
        model, _ = normx.load_model("minilm-sst2")
    assert labels(model) == ["negative", "positive"] and model.normx_name == "minilm-sst2"
    assert model.peft_config["default"].r > 0  # the shipped adapter, not a fresh head


@pytest.mark.parametrize("form", ["./minilm-sst2", "absolute", "Path"])
def test_a_path_is_the_folder(shadowing, form):
    given = {"./minilm-sst2": "./minilm-sst2", "absolute": str(shadowing.resolve()), "Path": Path("minilm-sst2")}[form]
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputWarning)  # no preset warning for a path
        model, _ = normx.load_model(given)
    assert labels(model) == ["SHADOW_A", "SHADOW_B"] and not hasattr(model, "peft_config")


def test_without_the_folder_no_warning_and_a_missing_path_is_no_preset(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert preset_named("minilm-sst2").name == "minilm-sst2" and shadowed_folder("minilm-sst2") is None
    assert preset_named("./minilm-sst2") is None and preset_named(Path("minilm-sst2")) is None
    with pytest.raises(normx.ModelLoadError, match="no model folder at minilm-sst2"):
        normx.load_model(Path("minilm-sst2"))
    with pytest.raises(normx.ModelLoadError, match="no model folder at minilm-sst2"):
        normx.load_model("./minilm-sst2")


def test_the_cli_warns_and_checks_labels_against_what_it_loads(shadowing, capsys):
    assert main(["explain", "--model", "minilm-sst2", "a gripping film"]) == 0
    out, err = capsys.readouterr()
    assert "normx: warning: 'minilm-sst2' is a preset and also a folder here" in err and "./minilm-sst2" in err
    assert "positive" in out and "SHADOW" not in out
    assert main(["explain", "--model", "minilm-sst2", "--target", "SHADOW_A", "a film"]) == 2  # the preset's labels
    assert "label 'SHADOW_A' is not a label of minilm-sst2" in capsys.readouterr().err
    assert main(["explain", "--model", "./minilm-sst2", "--target", "SHADOW_A", "a film"]) == 0
    out, err = capsys.readouterr()
    assert "SHADOW_A" in out and "is a preset" not in err
