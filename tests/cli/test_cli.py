import json

import minilm
import pytest
import tiny

import normx
from normx.cli.main import main


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return minilm.save_classifier(tmp_path_factory.mktemp("minilm-cls"))


def test_json_output(folder, capsys):
    assert main(["explain", "--model", folder, "--json", "a gripping film", "a dull film"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["results"]) == 2
    for item in data["results"]:
        assert isinstance(item["tokens"], list) and all(isinstance(t, str) for t in item["tokens"])
        assert len(item["scores"]) == len(item["tokens"]) and all(isinstance(s, float) for s in item["scores"])
        assert item["prediction"] in ("negative", "positive")
        assert set(item["probabilities"]) == {"negative", "positive"}
        assert sum(item["probabilities"].values()) == pytest.approx(1.0)
    assert data["results"][0]["tokens"] == ["[CLS]", "a", "gripping", "film", "[SEP]"]


def test_options_reach_explain(folder, capsys):
    args = ["explain", "--model", folder, "--json", "--method", "logat", "--target", "positive", "--target", "0",
            "--layer", "all", "--pair", "the other text", "--word-aggregation", "max", "first text"]
    assert main(args) == 0
    item = json.loads(capsys.readouterr().out)["results"][0]
    assert item["labels"] == ["positive", "negative"] and item["layers"] == list(range(7))
    assert item["method"] == "logat" and item["unit"] == "word" and item["text_pair"] == "the other text"


def test_table_output(folder, capsys):
    assert main(["explain", "--model", folder, "--no-color", "--foil", "negative", "--target", "positive",
                 "a gripping film"]) == 0
    out = capsys.readouterr().out
    assert "prediction:" in out and "gripping" in out and "[CLS] *" in out
    assert "\033[" not in out


def test_errors_are_messages_not_tracebacks(folder, capsys):
    assert main(["explain", "--model", folder, "--target", "neutral", "text"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("normx: error:") and "neutral" in err and "Traceback" not in err
    assert main(["explain", "--model", folder, "--layer", "99", "text"]) == 2
    assert main(["explain", "--model", folder, "--method", "nope", "text"]) == 2
    assert main(["explain", "--model", folder, "  "]) == 2
    assert main(["explain", "--model", "./no/such/folder", "text"]) == 2
    assert "no model folder" in capsys.readouterr().err


def test_listings(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("normxlogit", "logat", "l2norm"))
    assert main(["supported"]) == 0
    out = capsys.readouterr().out
    assert "LlamaForCausalLM" in out and "GemmaForCausalLM" in out and "refused" in out
    assert main(["supported", "--verdict", "refused"]) == 0
    refused = capsys.readouterr().out
    assert "BartForConditionalGeneration" in refused and "encoder-decoder" in refused
    assert "GemmaForCausalLM" not in refused
    assert main(["supported", "--registered"]) == 0
    assert capsys.readouterr().out.split() == normx.supported_models()
    assert main(["models"]) == 0
    assert "smollm2" in capsys.readouterr().out


@pytest.mark.parametrize("case", tiny.CASES, ids=[c.id for c in tiny.CASES])
def test_cli_explains_every_family_from_a_folder(case, tmp_path, capsys):
    model, tokenizer = tiny.build(case.id)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    text = tiny.texts_for(case, tokenizer)[0]
    assert main(["explain", "--model", str(tmp_path), "--json", "--layer", "all", text]) == 0
    item = json.loads(capsys.readouterr().out)["results"][0]
    expected = normx.explain(model, tokenizer, text, layer="all")
    assert item["tokens"] == expected.tokens and item["prediction"] == expected.prediction
    assert item["scores"] == pytest.approx(expected.score.tolist(), abs=1e-5)
    assert item["settings"]["model_class"] == type(model).__name__


def test_rollout_option_reaches_the_mixing_methods(folder, capsys):
    base = ["explain", "--model", folder, "--json", "--method", "globenc", "--layer", "all", "a gripping film"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)["results"][0]
    assert main([*base[:-1], "--rollout", base[-1]]) == 0
    rolled = json.loads(capsys.readouterr().out)["results"][0]
    assert plain["settings"]["rollout"] is False and rolled["settings"]["rollout"] is True
    (plain_layers,), (rolled_layers,) = plain["scores_by_label"].values(), rolled["scores_by_label"].values()
    assert plain_layers["1"] == rolled_layers["1"]  # layer 1: nothing to roll out yet
    assert plain_layers["6"] != rolled_layers["6"]


def test_decompx_options_reach_the_method(folder, capsys):
    base = ["explain", "--model", folder, "--json", "--method", "decompx", "a gripping film"]
    assert main([*base[:-1], "--bias-rule", "norm", "--no-biases", base[-1]]) == 0
    item = json.loads(capsys.readouterr().out)["results"][0]
    assert item["settings"]["bias_rule"] == "norm" and item["settings"]["include_biases"] is False
    assert main(base) == 0
    item = json.loads(capsys.readouterr().out)["results"][0]
    assert item["settings"]["bias_rule"] == "absdot" and item["settings"]["include_biases"] is True
    assert item["diagnostics"]["decomposition_error"][0] < 1e-3  # with biases the contributions sum to the logit


def test_evaluate_name_lists_take_spaces_commas_or_both():
    import argparse

    from normx.cli.options import add_names_argument, names

    parser = argparse.ArgumentParser()
    add_names_argument(parser, "--methods", "methods")
    for argv in (["--methods", "a", "b", "c"], ["--methods", "a,b,c"], ["--methods", "a,", "b", ",c"]):
        assert names(parser.parse_args(argv).methods) == ["a", "b", "c"]
    assert names(parser.parse_args([]).methods) is None


def test_words_flag_before_the_text(folder, capsys):
    """The README's syntax: --words takes no value, so the text after it is the text."""
    assert main(["explain", "--model", folder, "--json", "--words", "a gripping film"]) == 0
    item = json.loads(capsys.readouterr().out)["results"][0]
    assert item["unit"] == "word" and item["text"] == "a gripping film"
    assert item["settings"]["word_aggregation"] == "sum"


def test_table_says_what_it_shows():
    from normx.cli.render import render_table

    model, tokenizer = tiny.build("BertForSequenceClassification")
    every = normx.explain(model, tokenizer, "the film was good", target="all", layer="all")  # 3 labels x 3 layers
    table = render_table(every, color=False, max_columns=2)
    assert "showing 2 of 9 label x layer columns; left out: layers 0; labels neutral, positive" in table
    contrast = render_table(normx.explain(model, tokenizer, "the film", target="positive", foil="negative"),
                            color=False)
    assert "positive − negative" in contrast and "favours the label over negative" in contrast
    regression_model, regression_tokenizer = tiny.build("BertForSequenceClassification", num_labels=1)
    regression = render_table(normx.explain(regression_model, regression_tokenizer, "the film"), color=False)
    assert "Regression: scores are not signed support" in regression and "support the label" not in regression
    flat = render_table(normx.explain(model, tokenizer, "the film", method="l2norm"), color=False)
    assert "do not depend on the label" in flat
    decoder, bpe = tiny.build("GPT2LMHeadModel")
    e = normx.explain(decoder, bpe, "the film was gripping")
    assert any(t.startswith("Ġ") for t in e.tokens)  # the tokenizer's own spelling ...
    rows = render_table(e, color=False).splitlines()
    assert not any("Ġ" in row for row in rows) and any(row.split()[:1] == ["ing"] for row in rows)  # ... shown clean


def test_light_commands_never_import_torch():
    """`normx --help`, `models`, `methods`, `supported` and usage errors answer without importing torch or
    transformers (so faster than `python -c "import torch"`: 0.10-0.17 s against 1.2 s here)."""
    import subprocess
    import sys

    code = ("import sys\nfrom normx.cli.main import main\nfor argv in ({}):\n    try:\n        main(argv)\n"
            "    except SystemExit:\n        pass\nprint('torch' in sys.modules, 'transformers' in sys.modules)")
    for argv in (["--help"], ["models"], ["methods"], ["supported"], ["nope"], ["explain"], ["explain", "--help"]):
        done = subprocess.run([sys.executable, "-c", code.format(repr(argv) + ",")], capture_output=True, text=True,
                              timeout=120)
        assert done.stdout.strip().splitlines()[-1] == "False False", (argv, done.stdout[-500:], done.stderr[-500:])


def test_unknown_label_is_reported_before_the_model_loads(folder, capsys, monkeypatch):
    from normx.zoo import loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the model must not load"))
    assert main(["explain", "--model", "minilm-sst2", "--target", "positve", "a film"]) == 2
    assert "label 'positve' is not a label of minilm-sst2; its labels are ['negative', 'positive']" in \
        capsys.readouterr().err
    assert main(["explain", "--model", folder, "--foil", "neutral", "a film"]) == 2  # a folder: its config.json
    assert "its labels are ['negative', 'positive']" in capsys.readouterr().err


def test_version_and_flag_help(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"normx {normx.__version__}"
    with pytest.raises(SystemExit):
        main(["explain", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default True)" not in text and "--no-biases decompx: turns off" in text
    assert "--truncation {warn,error} a text longer than the model takes" in text


def test_input_warnings_are_cli_lines(folder, capsys):
    assert main(["explain", "--model", folder, "a gripping film 🙂"]) == 0
    err = capsys.readouterr().err
    assert "normx: warning: 1 piece(s) of the text are not in the tokenizer's vocabulary" in err
    assert "InputWarning" not in err


@pytest.fixture
def no_loading(monkeypatch):
    """The model loader fails the test: an error that needs no model must come before it loads."""
    from normx.cli import options

    monkeypatch.setattr(options, "load", lambda *a, **k: pytest.fail("the model must not load"))


@pytest.mark.parametrize("model", ["minilm-sst2", "smollm2", "folder"])
def test_layer_out_of_range_is_reported_before_the_model_loads(folder, model, no_loading, capsys):
    """The layer count is read from the model's config without its weights: a preset's base (config.json, or the
    GGUF header of SmolLM2's file), a folder's config.json."""
    name = folder if model == "folder" else model
    layers = {"minilm-sst2": 6, "smollm2": 30, "folder": 6}[model]
    assert main(["explain", "--model", name, "--layer", "99", "text"]) == 2
    err = capsys.readouterr().err
    assert f"normx: error: layer 99 is out of range: this model has {layers} layers" in err
    assert main(["explain", "--model", name, "--layer", f"0,-{layers + 2}", "text"]) == 2
    assert f"layer -{layers + 2} is out of range" in capsys.readouterr().err


def test_layer_count_from_a_config_without_weights(tmp_path, folder):
    from normx.cli.checks import layer_count

    assert layer_count(folder) == 6
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 3}))  # AutoConfig's map
    assert layer_count(str(gpt2)) == 3
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(gpt2)}))
    assert layer_count(str(adapter)) == 3
    assert layer_count("someone/hub-model") is None  # read when it loads, as before


def test_empty_texts_are_reported_in_the_users_words_before_the_model_loads(no_loading, capsys):
    assert main(["explain", "--model", "minilm-sst2", ""]) == 2
    err = capsys.readouterr().err
    assert err.startswith("normx: error: the text is empty") and "texts[" not in err
    assert main(["explain", "--model", "minilm-sst2", "a film", " \u200b "]) == 2
    assert capsys.readouterr().err.startswith("normx: error: text 2 (of 2) is empty")
    assert main(["explain", "--model", "minilm-qnli", "--pair", "", "a film"]) == 2
    assert capsys.readouterr().err.startswith("normx: error: the --pair text is empty")
    assert main(["generate", "--model", "smollm2", "  "]) == 2
    assert capsys.readouterr().err.startswith("normx: error: the prompt is empty")
    assert main(["generate", "--model", "smollm2", "--layer", "31", "x"]) == 2
    assert "layer 31 is out of range: this model has 30 layers" in capsys.readouterr().err
    assert main(["generate", "--model", "smollm2", "--max-new-tokens", "0", "x"]) == 2
    assert "--max-new-tokens must be at least 1, got 0" in capsys.readouterr().err


def test_a_missing_pyarrow_is_reported_before_the_model_loads(tmp_path, no_loading, monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def without_pyarrow(name, *args, **kwargs):
        if name.split(".")[0] == "pyarrow":
            raise ImportError("No module named 'pyarrow'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_pyarrow)
    data = tmp_path / "rows.tsv"
    data.write_text("sentence\tlabel\na film\t1\n")
    assert main(["attribute", "--model", "minilm-sst2", "--data", str(data), "--out", str(tmp_path / "out")]) == 2
    assert "normx: error: Parquet needs pyarrow" in capsys.readouterr().err


def test_piped_output_has_no_colour_legend(folder, capsys):
    """Standard output that is not a terminal (capsys) gets no colours, so its footer speaks of numbers and signs,
    not of "darker", "red" or "purple"; a terminal's footer names the colours it shows."""
    from normx.cli.render import render_table

    for extra in ([], ["--foil", "negative"], ["--method", "l2norm"], ["--method", "gradient_x_input"]):
        assert main(["explain", "--model", folder, *extra, "a gripping film"]) == 0
        out = capsys.readouterr().out
        assert "\033[" not in out
        footer = out.strip().splitlines()[-1].lower()
        assert footer.startswith("* special token.") and not any(w in footer for w in ("darker", "red", "purple"))
    model, tokenizer = tiny.build("BertForSequenceClassification")
    contrast = normx.explain(model, tokenizer, "the film", target="positive", foil="negative")
    assert "Red: favours the label over negative" in render_table(contrast, color=True)
    assert "Positive: favours the label over negative; negative: negative over the label" in \
        render_table(contrast, color=False)


def test_html_file_is_announced(folder, tmp_path, capsys):
    page = tmp_path / "out" / "page.html"
    assert main(["explain", "--model", folder, "--json", "--html", str(page), "a gripping film"]) == 0
    captured = capsys.readouterr()
    assert page.is_file() and f"normx: wrote {page} (" in captured.err
    assert json.loads(captured.out)["results"]  # standard output stays the JSON alone
