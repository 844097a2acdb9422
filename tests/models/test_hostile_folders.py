"""A stranger's folder never gets its own code run (#42 item 1), whatever answers standard input: every load passes
``trust_remote_code=False``, and a load normx does not make itself (peft's, for a tuner that loads a model its
adapter config names) raises where transformers would ask "Do you wish to run the custom code? [y/N]". Each folder
plants Python files that write a marker when imported; the marker must never appear, and each load either succeeds
with transformers' built-in classes or ends in a ``normx: error:`` naming the folder (exit 2), never in a prompt.
A pickled adapter that fails the safe load is a ``ModelLoadError`` naming the file (#42 item 9a)."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import subprocess
import sys

import minilm
import pytest

import normx
from normx import errors
from normx.cli.main import main

PLANTED = ("configuration_evil", "modeling_evil", "tokenization_evil")
PROMPT = "Do you wish to run the custom code"


def plant(folder, marker) -> None:
    """The folder's own code: each module, once imported, appends its name to ``marker``."""
    for name in PLANTED:
        (folder / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n")


def edit_json(file, **changes) -> None:
    file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))


EVIL_MAP = {"AutoConfig": "configuration_evil.EvilConfig", "AutoModel": "modeling_evil.EvilModel",
            "AutoModelForSequenceClassification": "modeling_evil.EvilForSequenceClassification"}
EVIL_TOKENIZER = {"tokenizer_class": "EvilTokenizer",
                  "auto_map": {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", "tokenization_evil.EvilTokenizer"]}}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``(root, marker, {kind: (folder, loads)})``: one folder of each kind; ``loads`` says whether it loads
    cleanly with built-in classes (else it must be refused with an error naming it)."""
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("hostile")
    marker = root / "ran"
    kinds = {}

    # a plain model folder of a built-in type whose config.json also maps the Auto classes to its own files
    folder = root / "model-auto-map"
    minilm.save_classifier(folder)
    edit_json(folder / "config.json", auto_map=EVIL_MAP)
    kinds["model-auto-map"] = (folder, True)

    # a model type transformers does not have: only its own code could load it
    folder = root / "custom-type"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "evil-x", "auto_map": EVIL_MAP,
                                                    "architectures": ["EvilForSequenceClassification"]}))
    kinds["custom-type"] = (folder, False)

    # a built-in model whose tokenizer alone names its own class and code
    folder = root / "tokenizer-auto-map"
    minilm.save_classifier(folder)
    edit_json(folder / "tokenizer_config.json", **EVIL_TOKENIZER)
    kinds["tokenizer-auto-map"] = (folder, True)

    # a PEFT adapter with its own tokenizer (tokenizer_config auto_map) and no config.json: the path of #42 item 1
    model, tokenizer = minilm.fresh_classifier()
    adapter = get_peft_model(model, LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["query", "value"]))
    folder = root / "adapter-tokenizer-auto-map"
    adapter.save_pretrained(folder)
    edit_json(folder / "adapter_config.json", base_model_name_or_path=minilm.base_path())
    tokenizer.save_pretrained(folder)
    shutil.copytree(folder, root / "plain-adapter")  # for the pickle test, before its tokenizer is made hostile
    edit_json(folder / "tokenizer_config.json", **EVIL_TOKENIZER)
    kinds["adapter-tokenizer-auto-map"] = (folder, False)

    # an adapter whose tuner (peft's Shadow) loads another model named in adapter_config.json, with peft's own
    # from_pretrained call (no trust_remote_code): that model is the custom-type folder
    folder = root / "adapter-names-a-model"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "SHADOW", "task_type": "SEQ_CLS", "base_model_name_or_path": minilm.base_path(),
        "shadow_model": str(root / "custom-type"), "target_modules": r".*encoder\.layer\.\d+$"}))
    kinds["adapter-names-a-model"] = (folder, False)

    for folder, _ in kinds.values():
        plant(folder, marker)
    return root, marker, kinds


@pytest.mark.parametrize("kind", ["model-auto-map", "custom-type", "tokenizer-auto-map", "adapter-tokenizer-auto-map",
                                  "adapter-names-a-model"])
def test_load_model_never_runs_a_folders_code(folders, kind, monkeypatch):
    from transformers import dynamic_module_utils

    _, marker, kinds = folders
    folder, loads = kinds[kind]
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n" * 20))  # what a person (or a pipe) would answer
    timeout = dynamic_module_utils.TIME_OUT_REMOTE_CODE
    if loads:
        model, tokenizer = normx.load_model(str(folder))
        assert type(model).__module__.startswith("transformers.") and type(model).__name__ == \
            "BertForSequenceClassification"
        assert type(tokenizer).__module__.startswith("transformers.")
        assert normx.explain(model, tokenizer, "a film").tokens[1] == "a"
    else:
        with pytest.raises(errors.ModelLoadError, match=r"never runs a model's own code") as caught:
            normx.load_model(str(folder))
        assert str(folder) in str(caught.value)
    assert not marker.exists(), marker.read_text()
    assert sys.stdin.read() == "y\n" * 20  # nothing was asked
    assert dynamic_module_utils.TIME_OUT_REMOTE_CODE == timeout  # set back after the load


def test_the_cli_with_yes_on_stdin_never_prompts_nor_runs_the_code(folders):
    """The issue's demo: the CLI in a process of its own, its standard input a pipe full of `y`."""
    root, marker, kinds = folders
    script = ("import sys\nfrom normx.cli.main import main\nfor folder in sys.argv[1:]:\n"
              "    print('=== ' + folder, file=sys.stderr, flush=True)\n"
              "    print('=== exit', main(['explain', '--model', folder, 'a film']), file=sys.stderr, flush=True)\n")
    names = list(kinds)
    done = subprocess.run([sys.executable, "-c", script, *(str(kinds[n][0]) for n in names)], input="y\n" * 50,
                          capture_output=True, text=True, timeout=600, cwd=root,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert PROMPT not in done.stdout + done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert not marker.exists(), marker.read_text()
    sections = done.stderr.split("=== ")[1:]
    assert len(sections) == 2 * len(names), done.stderr[-3000:]
    for name, (head, tail) in zip(names, zip(sections[::2], sections[1::2])):
        folder, loads = kinds[name]
        assert head.startswith(str(folder)) and tail.startswith("exit " + ("0" if loads else "2")), (name, head)
        if not loads:
            error = head.split("\n", 1)[1]
            assert error.startswith("normx: error: ") and str(folder) in error and \
                "never runs a model's own code" in error, (name, error)


def test_a_pickled_adapter_that_fails_the_safe_load(folders, tmp_path, capsys):
    """adapter_model.bin holding a pickle that would run a command: refused by the weights-only load, reported as a
    ModelLoadError naming the file (was a raw UnpicklingError traceback)."""
    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    root, _, _ = folders
    folder = tmp_path / "adapter"
    shutil.copytree(root / "plain-adapter", folder)
    (folder / "adapter_model.safetensors").unlink()
    (folder / "adapter_model.bin").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(errors.ModelLoadError) as caught:
        normx.load_model(str(folder))
    message = str(caught.value)
    assert message.startswith(f"could not load the adapter {folder / 'adapter_model.bin'}: its pickled weights "
                              "failed the safe load")
    assert "save them as safetensors (adapter_model.safetensors)" in message and "weights_only` set to" not in message
    capsys.readouterr()
    assert main(["explain", "--model", str(folder), "a film"]) == 2
    err = capsys.readouterr().err
    assert "normx: error: could not load the adapter" in err and "Traceback" not in err
    assert not (tmp_path / "ran").exists()
