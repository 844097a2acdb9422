"""Bad input gets a clear error, never a traceback and never a silent guess: the API, the CLI and the demo.

Each row: what a user gives, the exact error class, and the message (a regular expression over the start of what
it says). CLI rows run ``normx.cli.main.main`` and check exit code 2 with ``normx: error: <message>`` on stderr.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle

import minilm
import pytest
import tiny
from demo_support import load_app

import normx
from normx import errors
from normx.cli.main import main
from normx.serving import server as serving
from normx.serving import session
from normx.serving.budget import estimate_gflop
from normx.serving.lanes import WorkGate

app = load_app()
ZERO_WIDTH = "\u200b\u200c\ufeff"
SURROGATE = "bad \udcff text"  # what Python makes of invalid UTF-8 in argv


@pytest.fixture(scope="module")
def mt():
    return tiny.build("BertForSequenceClassification")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return minilm.save_classifier(tmp_path_factory.mktemp("minilm-cls"))


@pytest.fixture(scope="module")
def pair_model():
    model, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    model.config.normx_inputs = "pair"  # what normx train writes into a sentence-pair preset's config
    return model, tokenizer


API_CASES = [
    # (id, call(model, tokenizer), error class, message)
    ("lone surrogate", lambda m, t: normx.explain(m, t, SURROGATE), errors.InvalidInputError,
     r"texts\[0\] is not valid Unicode: a lone surrogate '\\udcff' at character 4"),
    ("zero-width only", lambda m, t: normx.explain(m, t, ZERO_WIDTH), errors.EmptyTextError,
     r"texts\[0\] is empty or has only white space, control or zero-width characters"),
    ("NUL and controls only", lambda m, t: normx.explain(m, t, "\x00\x01 \t\x7f"), errors.EmptyTextError,
     r"texts\[0\] is empty or has only white space, control or zero-width characters"),
    ("zero-width pair", lambda m, t: normx.explain(m, t, "fine", text_pair=ZERO_WIDTH), errors.EmptyTextError,
     r"text_pair\[0\] is empty"),
    ("max_length 0", lambda m, t: normx.explain(m, t, "fine", max_length=0), errors.InvalidInputError,
     r"max_length=0 is not allowed: this model takes inputs of 1\.\.64 tokens"),
    ("max_length negative", lambda m, t: normx.explain(m, t, "fine", max_length=-3), errors.InvalidInputError,
     r"max_length=-3 is not allowed"),
    ("max_length past the position table", lambda m, t: normx.explain(m, t, "fine", max_length=65),
     errors.InvalidInputError, r"max_length=65 is not allowed: this model takes inputs of 1\.\.64 tokens"),
    ("max_length not an integer", lambda m, t: normx.explain(m, t, "fine", max_length=2.5),
     errors.InvalidInputError, r"max_length=2\.5 is not allowed"),
    ("contribution maps max_length", lambda m, t: normx.methods.mixing.contribution_maps(m, t, "fine", max_length=0),
     errors.InvalidInputError, r"max_length=0 is not allowed"),
    ("trust_remote_code", lambda m, t: normx.load_model("minilm-sst2", trust_remote_code=True),
     errors.ModelLoadError, r"trust_remote_code=True is not allowed: normx explains transformers' built-in"),
]


@pytest.mark.parametrize("case", API_CASES, ids=[c[0] for c in API_CASES])
def test_api_bad_input(case, mt):
    _, call, error, message = case
    with pytest.raises(error, match=message):
        call(*mt)


def test_single_text_to_a_sentence_pair_model_is_an_error(pair_model):
    with pytest.raises(errors.PairRequiredError, match=r"this model was trained on sentence pairs .*text_pair="):
        normx.explain(*pair_model, "A man is playing a guitar.")
    normx.explain(*pair_model, "A man is playing a guitar.", text_pair="A person plays music.")  # with its pair: fine


def test_no_pad_token_is_an_error_only_where_padding_is_needed(mt):
    model, _tokenizer = mt
    padless = tiny.wordpiece_tokenizer().__class__.from_pretrained(minilm.base_path())
    padless.pad_token = None
    assert padless.pad_token_id is None and padless.eos_token_id is None
    normx.explain(model, padless, ["same length", "same length"])  # no padding needed: fine
    with pytest.raises(errors.InvalidInputError, match="neither a pad nor an end-of-sequence token, so texts of "
                                                        "different lengths cannot share a batch"):
        normx.explain(model, padless, ["short", "a much longer text than the first"])


def test_pickled_weights_that_fail_the_safe_load(tmp_path, capsys):
    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    minilm.save_classifier(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with open(tmp_path / "pytorch_model.bin", "wb") as handle:
        pickle.dump(Payload(), handle)
    with pytest.raises(errors.ModelLoadError, match=r"its pickled weights failed the safe load \(only tensors"):
        normx.load_model(str(tmp_path))
    assert main(["explain", "--model", str(tmp_path), "a film"]) == 2
    assert "failed the safe load" in capsys.readouterr().err
    assert not (tmp_path / "ran").exists()


def test_damaged_safetensors(tmp_path):
    minilm.save_classifier(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(errors.ModelLoadError, match="its safetensors weights are damaged"):
        normx.load_model(str(tmp_path))


def test_a_folder_with_its_own_code_never_runs_it(tmp_path, monkeypatch, capsys):
    """transformers would ask on the terminal whether to run the folder's code; a piped `y` ran it."""
    marker = tmp_path / "ran"
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "custom-x", "architectures": ["XForSequenceClassification"],
        "auto_map": {"AutoConfig": "configuration_x.XConfig",
                     "AutoModelForSequenceClassification": "modeling_x.XForSequenceClassification"}}))
    code = f"open({str(marker)!r}, 'w').write('ran')\nfrom transformers import PretrainedConfig\n" \
           "class XConfig(PretrainedConfig):\n    model_type = 'custom-x'\n"
    (tmp_path / "configuration_x.py").write_text(code)
    monkeypatch.setattr("sys.stdin", io.StringIO("y\ny\ny\n"))
    assert main(["explain", "--model", str(tmp_path), "a film"]) == 2
    assert "normx: error: could not load a model" in capsys.readouterr().err
    assert not marker.exists()


# ---- the command line -------------------------------------------------------------------------------------------

def cli_error(args, capsys) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("normx: error: ") and "Traceback" not in err
    return err.removeprefix("normx: error: ")


@pytest.mark.parametrize("layer", ["1,x", "x", "1,,2", "-"])
def test_cli_bad_layer(layer, capsys):
    # reported before any model loads: the model name does not even exist
    assert cli_error(["explain", "--model", "no/such/folder", "--layer", layer, "a film"], capsys).startswith(
        f"--layer {layer!r} is not allowed: give a layer index (0 = embeddings, negative counts from the end), a "
        "comma-separated list of them, or 'all'")


def test_cli_unknown_method_before_the_model_loads(capsys):
    assert cli_error(["explain", "--model", "no/such/folder", "--method", "nope", "a film"], capsys).startswith(
        "unknown method 'nope'; available methods: ")


def test_cli_lone_surrogate_and_zero_width(folder, capsys):
    assert cli_error(["explain", "--model", folder, SURROGATE], capsys).startswith(  # in the user's words (#43)
        "the text is not valid Unicode: a lone surrogate")
    assert cli_error(["explain", "--model", folder, ZERO_WIDTH], capsys).startswith(
        "the text is empty or has only white space, control or zero-width characters")


def test_cli_texts_from_stdin(folder, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("a gripping film\n\na dull film\r\n"))
    assert main(["explain", "--model", folder, "--json", "-"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert [r["text"] for r in results] == ["a gripping film", "a dull film"]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n  \n"))
    assert cli_error(["explain", "--model", folder, "-"], capsys) == (
        "`-` reads the texts from standard input, one per line, but it had none\n")


def test_cli_pair_model_given_one_text(pair_model, tmp_path, capsys):
    model, tokenizer = pair_model
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert cli_error(["explain", "--model", str(tmp_path), "one text"], capsys).startswith(
        "this model was trained on sentence pairs (its config says normx_inputs='pair')")


def test_cli_evaluate_bad_files_and_out(tmp_path, capsys):
    binary = tmp_path / "binary.tsv"
    binary.write_bytes(b"text\tlabel\n\xff\xfe\x00\x81 junk\t1\n")
    out = str(tmp_path / "out")
    args = ["evaluate", "faithfulness", "--model", "no/such/folder", "--out", out, "--data"]
    assert cli_error([*args, str(binary)], capsys).startswith(
        f"{binary} is not UTF-8 text (an undecodable byte at offset 11); give a UTF-8 TSV or JSONL file")
    huge = tmp_path / "huge.tsv"
    huge.write_text("text\tlabel\nfine\t1\n" + "x" * 200_000 + "\t0\n")
    assert cli_error([*args, str(huge)], capsys).startswith(f"{huge}:3: not a TSV line (field larger than field limit")
    missing = tmp_path / "missing.tsv"
    missing.write_text("text\tlabel\na good film\tpositive\na bad film\t\nfine\tnegative\n")
    assert cli_error([*args, str(missing)], capsys) == (
        f"{missing}:3: no label, but other examples have one; give every example a label, or none\n")
    jsonl = tmp_path / "missing.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in ({"text": "a", "label": 1}, {"text": "b"}, {"text": "c"})))
    assert cli_error([*args, str(jsonl)], capsys).startswith(
        f"{jsonl}:2: no label, but other examples have one (2 without: lines 2, 3)")
    good = tmp_path / "good.tsv"
    good.write_text("text\tlabel\na good film\tpositive\n")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    bad_out = str(blocker / "out")
    assert cli_error(["evaluate", "faithfulness", "--model", "no/such/folder", "--data", str(good), "--out", bad_out],
                     capsys).startswith(f"--out {bad_out!r}: cannot create the output folder (Not a directory)")
    assert cli_error(["evaluate", "blimp", "--model", "no/such/folder", "--out", bad_out], capsys).startswith(
        f"--out {bad_out!r}: cannot create the output folder")


@pytest.mark.parametrize("port", ["99999", "0", "-1", "http"])
def test_demo_bad_port(port, capsys):
    with pytest.raises(SystemExit) as exit_info:
        app.main(["--port", port])
    assert exit_info.value.code == 2
    assert f"argument --port: {port!r} is not a port: use a number in 1..65535" in capsys.readouterr().err


def test_demo_bad_budget(capsys):
    with pytest.raises(SystemExit):
        app.main(["--budget-gflop", "0"])
    assert "--budget-gflop must be positive, got 0.0" in capsys.readouterr().err


# ---- the demo ------------------------------------------------------------------------------------------------------

def test_demo_text_checks(mt):
    _, tokenizer = mt
    with pytest.raises(errors.EmptyTextError, match="the text is empty or has only white space, control or zero"):
        session.check_inputs(ZERO_WIDTH, "", tokenizer)
    with pytest.raises(errors.InvalidInputError, match="the second text is not valid Unicode: a lone surrogate"):
        session.check_inputs("fine", SURROGATE, tokenizer)
    text, pair, count, notices = session.check_inputs("a " * 1001, None, tokenizer)
    assert len(text) <= session.MAX_CHARS and not text.endswith(" ") and pair is None and count <= session.MAX_TOKENS
    assert notices and "The text has 2,002 characters" in notices[0]


def test_demo_work_budget(mt):
    model, tokenizer = mt
    cache = serving.ModelCache()
    cache.put("tiny", model, tokenizer)
    one_pass = estimate_gflop(model, "normxlogit", 6)
    gate = WorkGate(one_pass * 10)  # ten forward passes of a 6-token text
    state = session.explain_request(cache, "tiny", "paris is large", method="normxlogit", gate=gate)
    assert state.steps[0].method == "normxlogit"
    with pytest.raises(errors.WorkBudgetError, match=r"integrated_gradients on 5 tokens for 3 labels needs about "
                                                     r"[\d.,]+ GFLOP; this server allows [\d.,]+ GFLOP per request"):
        session.explain_request(cache, "tiny", "paris is large", method="integrated_gradients", gate=gate)
    errors_ = session.compare_request(state, cache, ["logat", "integrated_gradients"], gate=gate)
    assert "logat" in state.compare[0] and "integrated_gradients" not in state.compare[0]
    assert len(errors_) == 1 and errors_[0].startswith("integrated_gradients: integrated_gradients on 5 tokens")


def test_demo_locked_errors_do_not_reveal_server_paths(tmp_path):
    cache = serving.ModelCache(locked=True, allowed=["minilm-sst2"])
    messages = set()
    for name in (str(tmp_path), str(tmp_path / "missing"), "/etc", "../normx"):
        with pytest.raises(errors.ModelLoadError) as info:
            cache.get(name)
        messages.add(str(info.value))
    assert messages == {"this demo serves only its own models (minilm-sst2); it loads no other name, folder or file"}


@pytest.mark.parametrize("host, locked, asked", [
    ("127.0.0.1", False, None), ("localhost", False, None), ("::1", False, None), ("127.0.1.1", False, None),
    ("0.0.0.0", True, None), ("192.0.2.7", True, None), ("0.0.0.0", False, False), ("127.0.0.1", True, True)])
def test_demo_unlocked_only_on_loopback_unless_asked(host, locked, asked, monkeypatch, caplog):
    monkeypatch.delenv(serving.LOCKED_ENV, raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    with caplog.at_level(logging.WARNING, logger="normx.demo"):
        assert serving.resolve_locked(asked, host) is locked
    if host in ("0.0.0.0", "192.0.2.7"):
        assert ("UNLOCKED on" if asked is False else "not loopback: locked mode") in caplog.text
    else:
        assert not caplog.text
