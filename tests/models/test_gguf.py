"""Bring your own model file (issue #37): a GGUF file the tests write themselves, through every entry point —
``normx.load_model``, ``normx explain`` / ``generate``, the demo's model cache — with no other option; converted once
into the cache under the file's content hash, one copy however many paths hold the file."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from gguf_support import write_tiny_gguf

import normx
from normx.cli.main import main
from normx.models import gguf

pytest.importorskip("gguf", reason="GGUF files need `pip install gguf`")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("NORMX_CACHE", str(folder))
    return folder


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    file = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    model, tokenizer = write_tiny_gguf(file)
    return file, model, tokenizer


def test_a_gguf_file_loads_as_a_causal_lm_with_no_option_and_gives_the_models_own_logits(written, cache):
    file, original, tokenizer = written
    model, loaded_tokenizer = normx.load_model(file)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.architectures == ["LlamaForCausalLM"]
    text = "the film was good"
    ids = loaded_tokenizer(text, return_tensors="pt")
    assert ids["input_ids"].tolist() == tokenizer(text, return_tensors="pt")["input_ids"].tolist()
    with torch.no_grad():
        own = model(**ids, output_hidden_states=True)
        torch.testing.assert_close(own.logits, original(**ids).logits, atol=1e-5, rtol=1e-5)
    g = normx.explain_generation(model, loaded_tokenizer, text, max_new_tokens=3)
    for t, p in enumerate(g.generated):  # every row: ||x^0|| x the model's own logit of the generated token
        with torch.no_grad():
            step = model(input_ids=torch.tensor([g.token_ids[:p]]), output_hidden_states=True)
        want = (step.hidden_states[0][0].norm(dim=-1) * step.logits[0, :, g.token_ids[p]]).numpy()
        np.testing.assert_allclose(g.scores[-1, t, :p], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_converted_once_under_the_files_content_hash(written, cache, tmp_path, monkeypatch):
    file, _, _ = written
    said = []
    normx.load_model(file, notify=said.append)
    assert len(said) == 1 and "converting tiny-llama.gguf" in said[0]
    entries = gguf.cache_entries()
    assert len(entries) == 1 and entries[0]["name"] == "tiny-llama.gguf" and entries[0]["bytes"] > 0
    assert entries[0]["path"].endswith(gguf.file_digest(file))

    def never(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf, "_convert", never)
    copy = tmp_path / "elsewhere" / "renamed.gguf"  # the same content at another path, another name
    copy.parent.mkdir()
    shutil.copy(file, copy)
    normx.load_model(copy, notify=said.append)
    normx.load_model(copy.parent)  # a folder holding one GGUF file
    assert len(said) == 1 and len(gguf.cache_entries()) == 1


def test_a_folder_with_several_gguf_files_names_them(written, tmp_path, cache):
    file, _, _ = written
    for name in ("a.gguf", "b.gguf"):
        shutil.copy(file, tmp_path / name)
    with pytest.raises(normx.ModelLoadError, match=r"2 GGUF files \(a.gguf, b.gguf\); give the file itself"):
        normx.load_model(tmp_path)


def test_the_command_line_takes_the_file_and_lists_the_cache(written, cache, capsys):
    file, _, _ = written
    assert main(["generate", "--model", str(file), "--max-new-tokens", "2", "--json", "the film was"]) == 0
    out = capsys.readouterr()
    assert '"generated"' in out.out and "normx: converting tiny-llama.gguf" in out.err
    assert main(["explain", "--model", str(file), "--json", "the film was good"]) == 0
    assert '"results"' in capsys.readouterr().out
    assert main(["explain", "--model", str(file), "--task", "causal-lm", "the film"]) == 0
    capsys.readouterr()
    assert main(["cache"]) == 0
    listing = capsys.readouterr().out
    assert "tiny-llama.gguf" in listing and "1 entries" in listing
    assert main(["cache", "--clear"]) == 0 and not cache.exists()


def test_the_demo_serves_it(written, cache):
    from demo_support import load_app

    from normx.serving import server

    file, _, _ = written
    demo = load_app().Demo(server.ModelCache())
    out = demo.explain(str(file), "the film was", "", "normxlogit", 2, "subword", False, [])
    state = out[0]
    assert state.kind == "causal_lm" and len(state.steps) == 2
