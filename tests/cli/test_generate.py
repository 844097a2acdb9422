"""``normx generate``: the JSON rows are ||x_i^0|| x logits[i, generated token] from the model's own forward pass on
the printed token_ids; the terminal view names each generated token and the tokens it drew on most."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tiny
import torch

from normx.cli.main import main


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    model, tokenizer = tiny.build("Qwen2ForCausalLM")
    path = tmp_path_factory.mktemp("qwen2")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path), model


def test_json_rows_are_the_models_own_logits_times_the_input_norms(folder, capsys):
    path, model = folder
    assert main(["generate", "--model", path, "--json", "--max-new-tokens", "4", "the film was", "a dull"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        data = json.loads(line)
        ids = data["token_ids"]
        assert data["generated"] == list(range(data["prompt_length"], len(ids))) and len(data["generated"]) == 4
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        norms, logits = out.hidden_states[0][0].norm(dim=-1), out.logits[0]
        for row, p, probability in zip(data["scores"], data["generated"], data["probabilities"]):
            want = (norms[:p] * logits[:p, ids[p]]).numpy()
            assert len(row) == p
            np.testing.assert_allclose(row, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
            assert probability == pytest.approx(torch.softmax(logits[p - 1], -1)[ids[p]].item(), rel=1e-4)


def test_a_given_continuation_and_the_terminal_view(folder, capsys):
    path, _ = folder
    assert main(["generate", "--model", path, "--continuation", " was a gripping story", "--top", "2",
                 "--no-color", "the film"]) == 0
    out = capsys.readouterr().out
    assert "output: ' was a gripping story'" in out
    steps = [line for line in out.splitlines() if line.startswith("  ")]
    assert len(steps) == 10 and all(line.count("@") == 2 and "p=" in line for line in steps)  # 10 BPE tokens
    assert main(["generate", "--model", path, "--json", "--continuation", " was", "--method", "gradient_x_input",
                 "the film"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["method"] == "gradient_x_input" and data["settings"]["teacher_forcing"] is True


def test_bad_arguments_are_one_error_line(folder, capsys):
    path, _ = folder
    assert main(["generate", "--model", path, "--method", "nope", "x"]) == 2
    assert "normx: error:" in capsys.readouterr().err
    assert main(["generate", "--model", path, "--top", "0", "x"]) == 2
    assert "--top must be at least 1" in capsys.readouterr().err
    assert main(["generate", "--model", path, "--chat", "x"]) == 2
    assert "no chat template" in capsys.readouterr().err


def test_device_puts_the_model_there_and_a_bad_one_is_one_error_line(folder, capsys):
    path, _ = folder
    common = ["generate", "--model", path, "--json", "--continuation", " was a", "the film"]
    assert main([*common, "--device", "cpu"]) == 0
    with_device = json.loads(capsys.readouterr().out)
    assert main(common) == 0
    assert json.loads(capsys.readouterr().out)["scores"] == with_device["scores"]
    assert main([*common, "--device", "gpu7"]) == 2
    assert "--device 'gpu7' is not a torch device; use cpu, cuda, cuda:N or mps" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main([*common, "--device", "cuda"]) == 2
        assert "torch sees no CUDA device here" in capsys.readouterr().err


@pytest.mark.parametrize("method", ["decompx", "alti_logit"])
def test_decoder_decomposition_methods_from_the_command_line(folder, capsys, method):
    """``--method decompx``: each step's row is its tokens' shares of the generated token's logit, which with the
    bias share (Qwen2 has value biases) add up to the model's own logit; ``alti_logit`` gives a signed row too."""
    path, model = folder
    assert main(["generate", "--model", path, "--json", "--continuation", " was a", "--method", method,
                 "the film"]) == 0
    data = json.loads(capsys.readouterr().out)
    ids = data["token_ids"]
    assert data["method"] == method and len(data["scores"]) == len(data["generated"]) > 0
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    for t, (row, p) in enumerate(zip(data["scores"], data["generated"])):
        assert len(row) == p and np.isfinite(row).all()
        if method == "decompx":
            total = np.sum(row) + data["diagnostics"]["bias_logit"][t]
            assert total == pytest.approx(float(logits[p - 1, ids[p]]), rel=1e-4, abs=1e-4)
            assert data["diagnostics"]["decomposition_error"][t] < 1e-4 * float(logits[p - 1].abs().max())


def test_html_file_is_announced_and_the_view_has_no_colour_legend(folder, tmp_path, capsys):
    path, _ = folder
    page = tmp_path / "generation.html"
    assert main(["generate", "--model", path, "--max-new-tokens", "2", "--html", str(page), "the film"]) == 0
    captured = capsys.readouterr()
    assert page.is_file() and f"normx: wrote {page} (" in captured.err
    assert "\033[" not in captured.out and "darker" not in captured.out
