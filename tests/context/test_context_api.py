"""``normx.explain_context`` and ``normx cite`` on a tiny Llama: sources and their token spans, a source's score as
the sum of the Generation's rows over the steps and its tokens (what explain_generation gives for the same prompt),
parts of the response, JSON round trip, HTML, Captum, bad input, and the command line end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tiny

import normx
from normx.cli.main import main
from normx.context import ContextAttribution, explain_context
from normx.errors import EmptyTextError, InvalidInputError

CONTEXT = "the film was good. a dull plot! it was long."


@pytest.fixture(scope="module")
def llama():
    return tiny.build("LlamaForCausalLM")


def test_sources_spans_and_scores_are_the_generations_rows(llama):
    model, tok = llama
    r = explain_context(model, tok, CONTEXT, "good?", method="leave_one_out", max_new_tokens=3)
    assert [s.text for s in r.sources] == ["the film was good.", "a dull plot!", "it was long."]
    assert r.prompt == "Context: " + CONTEXT + "\n\nQuery: good?"
    g = r.generation
    for s in r.sources:
        assert CONTEXT[s.start:s.end] == s.text
        assert tok.decode(g.token_ids[s.token_start:s.token_end]).strip() == s.text
    assert g.settings["source_spans"] == [[s.token_start, s.token_end] for s in r.sources]
    same = normx.explain_generation(model, tok, r.prompt, method="leave_one_out", target=r.response_ids,
                                    sources=[(s.token_start, s.token_end) for s in r.sources])
    # the checker's reading: a source's score is the sum of its rows over the steps and its tokens
    want = [np.nansum(same.scores[0][:, s.token_start:s.token_end]) for s in r.sources]
    np.testing.assert_allclose(r.scores, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(r.attributions(0, 1) + r.attributions(1, None), r.scores, atol=1e-5)
    assert r.top(1)[0][0] == int(np.argmax(r.scores)) and r.top(2)[0][2] >= r.top(2)[1][2]
    assert r.response_parts() and r.response_parts()[0][1] == 0
    # left to itself, explain_generation finds the prompt's own sources (auto): the template's "Context:" label and its
    # closing query are none of them, so they are the context's sentences
    own = normx.explain_generation(model, tok, r.prompt, method="leave_one_out", target=r.response_ids)
    found = [tok.decode(own.token_ids[a:b]).strip() for a, b in own.settings["source_spans"]]
    assert found == [s.text for s in r.sources] and found[0] == "the film was good."


def test_one_pass_and_gradient_methods_aggregate_their_rows(llama):
    model, tok = llama
    r = explain_context(model, tok, CONTEXT, "good?", method="gradient_x_input", max_new_tokens=3)
    assert r.generation.settings["scope"] == "response" and r.reading == "magnitude"
    rows = r.generation.scores[0]
    np.testing.assert_allclose(r.scores, [np.nansum(np.abs(rows[:, s.token_start:s.token_end]))
                                          for s in r.sources], rtol=1e-5)
    n = explain_context(model, tok, CONTEXT, "good?", method="normxlogit", response=" yes it")
    assert n.response == " yes it" and "scope" not in n.generation.settings
    np.testing.assert_allclose(n.scores, [np.nansum(n.generation.scores[-1][:, s.token_start:s.token_end])
                                          for s in n.sources], rtol=1e-5)


def test_a_list_of_sources_a_template_and_chat_scaffolding(llama):
    model, tok = llama
    r = explain_context(model, tok, ["first doc.", "second doc."], method="contextcite", n_ablations=8,
                        prompt_template="Docs: {context}\nQ: {query}\nA:", query="which?", max_new_tokens=2)
    assert r.prompt == "Docs: first doc.\n\nsecond doc.\nQ: which?\nA:"
    assert [s.text for s in r.sources] == ["first doc.", "second doc."] and r.settings["sources"] == "given"
    for bad, error in ((dict(context=" \n "), EmptyTextError), (dict(context=["a", " "]), EmptyTextError),
                       (dict(context=CONTEXT, prompt_template="no place"), InvalidInputError),
                       (dict(context=CONTEXT, prompt_template="{context} {query}"), InvalidInputError),
                       (dict(context=CONTEXT, sources="chapters"), InvalidInputError)):
        with pytest.raises(error):
            explain_context(model, tok, **bad, max_new_tokens=1)


def test_json_round_trip_html_and_captum(llama):
    model, tok = llama
    r = explain_context(model, tok, CONTEXT, "good?", method="contextcite", n_ablations=8, max_new_tokens=3)
    back = ContextAttribution.from_json(r.to_json())
    assert back == r and back is not r  # whole: texts, sources, settings, the generation's rows
    np.testing.assert_allclose(back.scores, r.scores)
    assert back.sources == r.sources and back.response == r.response and back.query == "good?"
    assert back != ContextAttribution.from_json(r.to_json().replace('"good?"', '"bad?"'))
    assert len(r.top(99)) == 3 and len(r.top(1)) == 1
    for k in (0, -1, 1.5, True):
        with pytest.raises(InvalidInputError, match="k must be"):
            r.top(k)
    data = json.loads(r.to_json())
    assert [s["score"] for s in data["sources"]] == pytest.approx(r.scores.tolist())
    page = r.to_html()
    for s in r.sources:
        assert s.text in page
    assert "source 0:" in page and "response:" in page
    assert "ContextAttribution(contextcite, 3 sources" in repr(r)
    pytest.importorskip("captum")
    result = r.to_captum()
    assert list(result.seq_attr.shape) == [3] and list(result.token_attr.shape) == [3, 3]
    np.testing.assert_allclose(result.seq_attr.numpy(), r.scores, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def llama_folder(llama, tmp_path_factory):
    model, tok = llama
    folder = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_cite_end_to_end(llama_folder, tmp_path, capsys):
    context = tmp_path / "context.txt"
    context.write_text(CONTEXT + "\n", encoding="utf-8")
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    code = main(["cite", str(context), "--model", str(llama_folder), "--query", "good?", "--n-ablations", "8",
                 "--max-new-tokens", "3", "--json", str(out), "--html", str(page), "--top", "2"])
    shown = capsys.readouterr()
    assert code == 0, shown.err
    lines = shown.out.splitlines()
    # 3 sources: 2^3 distinct masks at most, each run once
    assert lines[0].startswith("response: ") and "contextcite" in lines[1] and "about 8 forward passes" in lines[1]
    assert len(lines) == 3 + 2
    stored = ContextAttribution.from_json(out.read_text(encoding="utf-8"))
    assert str(stored.top(1)[0][0]) == lines[3].split()[1]
    assert all(s.text in page.read_text(encoding="utf-8") for s in stored.sources)


def test_cite_with_a_budget(llama_folder, tmp_path, capsys):
    """`--method budgeted@fast` and `--budget` reach the method: its passes in the header, its budget in the JSON."""
    context = tmp_path / "context.txt"
    context.write_text(CONTEXT + "\n", encoding="utf-8")
    runs = {}
    for flags in (["--method", "budgeted@fast"], ["--method", "budgeted", "--budget", "9"]):
        out = tmp_path / f"{len(runs)}.json"
        code = main(["cite", str(context), "--model", str(llama_folder), "--query", "good?", "--max-new-tokens", "3",
                     "--json", str(out), *flags])
        shown = capsys.readouterr()
        assert code == 0, shown.err
        assert "budgeted" in shown.out.splitlines()[1]
        runs[flags[-1]] = ContextAttribution.from_json(out.read_text(encoding="utf-8")).generation.settings
    assert runs["budgeted@fast"]["budget"] == 2.0 and runs["9"]["budget"] == 9.0
    assert runs["9"]["masks"] > runs["budgeted@fast"]["masks"] >= 2


@pytest.mark.parametrize("argv, message", [
    (["cite", "/no/such/file", "--model", "M"], "no context file"),
    (["cite", "CTX", "--model", "M", "--method", "nope"], "cite has no method 'nope'"),
    (["cite", "CTX", "--model", "M", "--top", "0"], "--top must be at least 1"),
    (["cite", "CTX", "--model", "M", "--query", " "], "--query text"),
    (["cite", "BIN", "--model", "M"], "not UTF-8"),
    (["cite", "CTX", "--model", "M", "--method", "contextcit"], "did you mean 'contextcite'?"),
    (["cite", "CTX", "--model", "M", "--method", "leave_one_out@32"], "contextcite@32: --n-ablations 32"),
    (["cite", "CTX", "--model", "M", "--method", "contextcite@8", "--n-ablations", "16"], "disagree"),
    (["cite", "CTX", "--model", "M", "--n-ablations", "1"], "n_ablations must be at least 2"),
    (["cite", "CTX", "--model", "minilm-sst2"], "is a sequence-classification model"),
])
def test_cite_refuses_bad_input_before_any_model_load(argv, message, tmp_path, capsys, monkeypatch):
    (tmp_path / "ctx.txt").write_text(CONTEXT, encoding="utf-8")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00abc")
    argv = [str(tmp_path / "ctx.txt") if a == "CTX" else str(tmp_path / "bin.txt") if a == "BIN" else a
            for a in argv]
    monkeypatch.setattr("normx.zoo.loading.load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("normx: error:") and message in err and "Traceback" not in err


def test_cite_lists_its_own_methods_and_takes_contextcite_at_n():
    from normx.cli.cite import cite_method, cite_methods

    methods = cite_methods()
    assert methods[:4] == ["budgeted", "calibrated_attention", "contextcite", "leave_one_out"]  # context methods first
    assert "globenc" not in methods and "value_zeroing" not in methods  # encoder-only mixing maps
    assert not any(normx.methods.get_method(m).experimental for m in methods)
    assert cite_method("contextcite@32") == ("contextcite", {"n_ablations": 32})
    assert cite_method("leave_one_out") == ("leave_one_out", {})
    assert cite_method("budgeted@fast") == ("budgeted", {"budget": "fast"})
    assert cite_method("budgeted@12") == ("budgeted", {"budget": 12.0})
    with pytest.raises(InvalidInputError, match="budget"):
        cite_method("budgeted@cheap")


def test_a_long_context_is_refused_before_it_is_split(llama, monkeypatch):
    """A context far longer than the model takes is refused in time that does not grow with it: only a prefix is
    tokenised, nothing is split into sentences, and the message names the ways out the callers have."""
    import time

    from normx.methods.ablation import sources

    model, tok = llama
    monkeypatch.setattr(sources, "split_text", lambda *_: pytest.fail("the long context was split"))
    for size in (200_000, 2_000_000):
        start = time.perf_counter()
        with pytest.raises(normx.InputTooLongError, match="give a shorter context") as raised:
            normx.explain_context(model, tok, "The film was good. " * (size // 19), "good?", method="leave_one_out",
                                  max_new_tokens=4)
        assert time.perf_counter() - start < 2.0
        assert "truncation" not in str(raised.value)


def test_contextcite_runs_each_distinct_mask_once(llama, monkeypatch):
    """One source has two masks (kept, removed): 64 ablations run 2 passes, not 65, with the scores ContextCite's
    masks give; one ablation is refused."""
    from normx.methods.ablation import forwards

    model, tok = llama
    seen = []
    real = forwards._distinct_outcomes
    monkeypatch.setattr(forwards, "_distinct_outcomes",
                        lambda ctx, sources, keeps, desc: seen.append(len(keeps)) or real(ctx, sources, keeps, desc))
    from normx.methods.ablation import ablation_masks

    seed = next(s for s in range(50) if len(set(ablation_masks(1, 2, 0.5, s)[:, 0])) == 1)  # both masks alike
    with pytest.warns(normx.errors.InputWarning, match="kept, or removed, in every one"):
        result = normx.explain_context(model, tok, ["The film was good."], "good?", method="contextcite",
                                       n_ablations=2, max_new_tokens=2, seed=seed)
    assert seen[0] <= 2 and len(result.sources) == 1
    seen.clear()
    normx.explain_context(model, tok, ["The film was good."], "good?", method="contextcite", max_new_tokens=2)
    assert seen == [2]
    with pytest.raises(normx.errors.InvalidInputError, match="at least 2"):
        normx.explain_context(model, tok, ["The film was good."], "good?", method="contextcite", n_ablations=1)


def test_a_chat_model_is_asked_through_its_template_by_default_and_no_response_shows_special_tokens(tmp_path,
                                                                                                   capsys):
    folder = tiny.chat_qwen2_folder(tmp_path / "chat")
    model, tok = normx.load_model(folder)
    end = tok.eos_token  # the template's end of turn
    r = explain_context(model, tok, CONTEXT, "good?", method="leave_one_out", response=[5, 6, tok.eos_token_id])
    assert r.settings["chat"] is True and r.generation.settings["chat"] is True
    assert r.generation.text.endswith(end) and end not in r.response and r.response
    plain = explain_context(model, tok, CONTEXT, "good?", method="leave_one_out", response=[5, 6], chat=False)
    assert plain.settings["chat"] is False
    (tmp_path / "ctx.txt").write_text(CONTEXT, encoding="utf-8")
    argv = ["cite", str(tmp_path / "ctx.txt"), "--model", folder, "--query", "good?", "--method", "leave_one_out",
            "--max-new-tokens", "3"]
    assert main(argv) == 0
    shown = capsys.readouterr()
    assert "chat template (--no-chat" in shown.err and end not in shown.out.splitlines()[0]
    assert main([*argv, "--no-chat"]) == 0
    assert "chat template" not in capsys.readouterr().err


def test_an_answer_longer_than_the_model_takes_is_refused_naming_it(llama):
    model, tok = llama
    with pytest.raises(normx.InputTooLongError, match="give a shorter response"):
        explain_context(model, tok, "The film was good.", "good?", method="leave_one_out", response=list(range(5, 80)))
    with pytest.raises(normx.InputTooLongError, match="give fewer new tokens"):
        explain_context(model, tok, "The film was good.", "good?", method="leave_one_out", max_new_tokens=80)
