"""A prompt longer than explain_generation takes: by default the model's own context length (the tiny Llama's
position table: 64), or ``max_length``; refused with the counts (``truncation="error"``, the default) or cut at its
start with an InputWarning that says how many tokens went (``truncation="warn"``); the same from the command line
(``--max-length`` / ``--max-tokens``, ``--truncation``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tiny

import normx
from normx.cli.main import main
from normx.errors import InputWarning
from normx.explanations.generation import explain_token_ids
from normx.explanations.generation_length import fit_prompt

LONG = " ".join(["the film was a gripping and beautifully acted story"] * 8)  # > 64 tokens
TARGET = " was a"


@pytest.fixture(scope="module")
def llama():
    return tiny.build("LlamaForCausalLM")


def test_the_default_limit_is_the_models_context_length(llama):
    model, tok = llama
    g = normx.explain_generation(model, tok, "the film", target=TARGET)
    assert g.settings["max_length"] == model.config.max_position_embeddings == 64
    assert g.settings["truncation"] == "error" and g.warnings == []
    ids, k = tok(LONG)["input_ids"], len(tok(TARGET, add_special_tokens=False)["input_ids"])
    assert len(ids) > 64
    with pytest.raises(normx.InputTooLongError, match=rf"the prompt has {len(ids)} tokens and {k} continuation tokens "
                       rf"follow it: {len(ids) + k} tokens, more than max_length=64; .*truncation='warn'"):
        normx.explain_generation(model, tok, LONG, target=TARGET)
    with pytest.raises(normx.InputTooLongError, match=r"20 new tokens may follow it.*max_length=64"):
        normx.explain_generation(model, tok, LONG)  # refused before any generation


def test_an_announced_cut_keeps_the_bos_and_the_prompts_end(llama):
    model, tok = llama
    ids = tok(LONG)["input_ids"]
    target = tok(TARGET, add_special_tokens=False)["input_ids"]
    lead = 1 if ids[0] == tok.bos_token_id else 0
    cut = len(ids) + len(target) - 64
    with pytest.warns(InputWarning, match=rf"the prompt's first {cut} tokens.* were cut; the explained prompt "
                      rf"is its last {64 - len(target) - lead} tokens"):
        g = normx.explain_generation(model, tok, LONG, method="gradient_x_input", target=TARGET, truncation="warn")
    assert len(g.token_ids) == 64 and g.prompt_length == 64 - len(target)
    assert g.token_ids[:g.prompt_length] == ids[:lead] + ids[lead + cut:]  # the BOS, then the prompt's last tokens
    assert g.token_ids[g.prompt_length:] == target and len(g.warnings) == 1 and "were cut" in g.warnings[0]
    assert g.settings["truncation"] == "warn"
    # the cut sequence is explained as that sequence given whole
    (want,) = explain_token_ids(model, tok, [g.token_ids], [g.prompt_length], method="gradient_x_input")
    np.testing.assert_allclose(g.scores, want.scores, rtol=1e-6, equal_nan=True)


def test_max_length_below_the_models(llama):
    model, tok = llama
    prompt = "the film was a gripping and beautifully acted story"
    n = len(tok(prompt)["input_ids"])
    with pytest.raises(normx.InputTooLongError, match=rf"{n + 5} tokens, more than max_length={n}"):
        normx.explain_generation(model, tok, prompt, max_new_tokens=5, max_length=n)
    with pytest.warns(InputWarning, match="first 5 tokens"):
        g = normx.explain_generation(model, tok, prompt, max_new_tokens=5, max_length=n, truncation="warn",
                                     gen_args={"min_new_tokens": 5})
    assert len(g.token_ids) == n and g.steps == 5 and g.settings["max_length"] == n
    for bad in (0, 65, "10", True):
        with pytest.raises(normx.InvalidInputError, match=r"max_length=.* is not allowed: .* 1\.\.64 tokens"):
            normx.explain_generation(model, tok, prompt, max_length=bad)
    with pytest.raises(normx.InvalidInputError, match="truncation='left' is not allowed"):
        normx.explain_generation(model, tok, prompt, truncation="left")
    with pytest.raises(normx.InputTooLongError, match="no room for the prompt"):
        normx.explain_generation(model, tok, prompt, max_new_tokens=5, max_length=5, truncation="warn")


def test_a_chat_prompt_is_never_cut(llama):
    _, tok = llama
    ids = list(range(10, 40))
    with pytest.raises(normx.InputTooLongError, match="chat-wrapped prompt is not cut"):
        fit_prompt(tok, ids, 4, 20, "warn", True, 0, "new tokens may")
    assert fit_prompt(tok, ids, 4, 34, "error", True, 0, "new tokens may") == (ids, [])


def test_the_command_line_flags(llama, tmp_path, capsys):
    model, tok = llama
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    command = ["generate", "--model", str(tmp_path), "--continuation", TARGET, "--json"]
    capsys.readouterr()
    assert main([*command, "--max-tokens", "16", LONG]) == 2
    err = capsys.readouterr().err
    assert "normx: error: the prompt has" in err and "max_length=16" in err and "--truncation warn" in err
    assert main([*command, "--max-length", "16", "--truncation", "warn", LONG]) == 0
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert len(data["token_ids"]) == 16 and data["settings"]["max_length"] == 16 and "were cut" in out.err
    assert main([*command, "--max-length", "0", LONG]) == 2
    assert "--max-length must be at least 1" in capsys.readouterr().err
