"""Explaining what a causal LM writes: every row of the one-pass result is ||x_i^0|| x logits[i, generated token]
read from the model's own forward pass on the ids it produced, and every step equals ``normx.explain`` on that
step's prefix with that token as the target (one-pass and per-step methods alike)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tiny
import torch

import normx
from normx.explanations.generation_result import Generation

PROMPTS = ["the film was", "a dull movie with a predictable plot and"]


@pytest.fixture(scope="module")
def llama():
    return tiny.build("LlamaForCausalLM")


def own_forward(model, ids: list[int]):
    """(||hidden_states[0]||, logits) at every position from the model's own forward pass on ``ids``."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[0][0].float().norm(dim=-1), out.logits[0].float()


def check_against_own_outputs(model, g: Generation):
    norms, logits = own_forward(model, g.token_ids)
    assert len(g.rows()) == g.steps and g.generated == list(range(g.prompt_length, len(g.tokens)))
    for t, p in enumerate(g.generated):
        row = g.rows()[t]
        assert row.shape == (p,) and np.isnan(g.score[t, p:]).all()
        want = (norms[:p] * logits[:p, g.token_ids[p]]).numpy()
        np.testing.assert_allclose(row, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        probability = torch.softmax(logits[p - 1], -1)[g.token_ids[p]].item()
        assert g.probabilities[t] == pytest.approx(probability, rel=1e-4, abs=1e-7)
        assert g.predictions[t] == int(logits[p - 1].argmax())


@pytest.mark.parametrize("case", ["LlamaForCausalLM", "GPT2LMHeadModel", "Qwen3ForCausalLM"])
def test_every_row_is_the_input_norm_times_the_models_own_logit(case):
    model, tok = tiny.build(case)
    for g in normx.explain_generation(model, tok, PROMPTS, max_new_tokens=6):
        assert g.steps == 6
        check_against_own_outputs(model, g)


def test_greedy_generation_is_the_models_own_generate(llama):
    model, tok = llama
    g = normx.explain_generation(model, tok, PROMPTS[0], max_new_tokens=7)
    ids = torch.tensor([tok(PROMPTS[0])["input_ids"]])
    with torch.no_grad():
        want = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=7, do_sample=False,
                              pad_token_id=tok.pad_token_id)[0].tolist()
    assert g.token_ids == want and g.prompt_length == ids.shape[1]
    assert g.predictions == g.token_ids[g.prompt_length:]  # greedy: each token was the model's first choice
    assert g.settings["teacher_forcing"] is False and g.vocabulary_tokens == tok.convert_ids_to_tokens(want)


@pytest.mark.parametrize("method", ["normxlogit", "logat", "l2norm", "gradient_x_input", "integrated_gradients",
                                    "random", "random_types", "recency", "gradient_norm"])
def test_each_step_equals_explain_on_its_prefix(llama, method):
    model, tok = llama
    layer = "all" if normx.methods.get_method(method).layered else None
    options = {"n_steps": 8} if method == "integrated_gradients" else {}
    g = normx.explain_generation(model, tok, "the film", method=method, layer=layer, target=" was a gripping story",
                                 batch_size=3, **options)
    assert g.settings["teacher_forcing"] and g.steps == len(tok(" was a gripping story",
                                                                add_special_tokens=False)["input_ids"])
    for t in range(g.steps):
        step = g.step(t)
        p = g.prompt_length + t
        prefix = tok.decode(g.token_ids[:p], skip_special_tokens=True)
        want = normx.explain(model, tok, prefix, method=method, target=g.token_ids[p], layer=layer, **options)
        assert want.tokens == step.tokens and want.labels == step.labels == [g.vocabulary_tokens[p]]
        np.testing.assert_allclose(step.scores, want.scores, rtol=1e-4, atol=1e-5 * max(1, np.abs(want.scores).max()))
        if normx.methods.get_method(method).model_free:  # no forward pass: no model outputs
            assert np.isnan(g.probabilities[t]) and g.predictions[t] == -1 and not g.alternatives
            continue
        assert step.probabilities == pytest.approx(want.probabilities, rel=1e-4, abs=1e-7)  # top tokens + its own
        assert step.prediction == want.prediction
        assert step.pooled == p - 1 and step.kind == "causal_lm"


def test_prompts_batched_equal_each_alone(llama):
    model, tok = llama
    for method in ("normxlogit", "gradient_x_input"):
        together = normx.explain_generation(model, tok, PROMPTS, method=method, max_new_tokens=4, batch_size=2)
        for prompt, g in zip(PROMPTS, together):
            alone = normx.explain_generation(model, tok, prompt, method=method, max_new_tokens=4, batch_size=1)
            assert alone.token_ids == g.token_ids
            np.testing.assert_allclose(g.scores, alone.scores, rtol=1e-4, atol=1e-5)


def test_layers_and_the_json_schema(llama):
    model, tok = llama
    g = normx.explain_generation(model, tok, PROMPTS[0], layer="all", max_new_tokens=3)
    data = json.loads(json.dumps(g.to_dict()))
    assert data["prompt_length"] == g.prompt_length and data["generated"] == g.generated
    assert [len(row) for row in data["scores"]] == g.generated  # the row of the token at index p has p entries
    assert len(data["probabilities"]) == 3 and data["token_ids"] == g.token_ids and data["tokens"] == g.texts
    assert data["vocabulary_tokens"] == g.vocabulary_tokens and g.texts == g.tokens
    assert set(data["scores_by_layer"]) == {str(layer) for layer in range(len(model.model.layers) + 1)}
    back = Generation.from_dict(data)
    np.testing.assert_allclose(back.scores, g.scores, rtol=1e-6, equal_nan=True)
    assert back.to_dict() == data
    # layer 0 of l2norm is ||x^0||: the same row for every step
    l2 = normx.explain_generation(model, tok, PROMPTS[0], method="l2norm", target=g.token_ids[g.prompt_length:])
    norms, _ = own_forward(model, g.token_ids)
    np.testing.assert_allclose(l2.rows()[-1], norms[:-1].numpy(), rtol=1e-5)
    assert [i for i, _, _ in g.top(0, k=2)] == list(np.argsort(-g.rows()[0])[:2])


def test_threads_get_what_they_get_alone(llama):
    model, tok = llama
    alone = {p: normx.explain_generation(model, tok, p, max_new_tokens=3) for p in PROMPTS}
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda p: (p, normx.explain_generation(model, tok, p, max_new_tokens=3)),
                                PROMPTS * 3))
    for p, g in results:
        assert g.token_ids == alone[p].token_ids
        np.testing.assert_allclose(g.scores, alone[p].scores, rtol=1e-5, equal_nan=True)


def test_bad_input_is_refused_with_what_is_allowed(llama):
    model, tok = llama
    with pytest.raises(normx.InvalidInputError, match="list of 2 continuations"):
        normx.explain_generation(model, tok, PROMPTS, target=" a")
    with pytest.raises(normx.InvalidInputError, match="max_new_tokens"):
        normx.explain_generation(model, tok, PROMPTS[0], max_new_tokens=-1)
    with pytest.raises(normx.InvalidInputError, match="token ids in 0"):
        normx.explain_generation(model, tok, PROMPTS[0], target=[10 ** 9])
    with pytest.raises(normx.EmptyTextError):
        normx.explain_generation(model, tok, "  ")
    with pytest.raises(normx.InvalidInputError, match="no chat template"):
        normx.explain_generation(model, tok, PROMPTS[0], chat=True)
    with pytest.raises(normx.InvalidInputError, match="step 5 is out of range"):
        normx.explain_generation(model, tok, PROMPTS[0], max_new_tokens=2).step(5)
    classifier, ctok = tiny.build("BertForSequenceClassification")
    with pytest.raises(normx.UnsupportedModelError, match="causal LMs"):
        normx.explain_generation(classifier, ctok, PROMPTS[0])
    empty = normx.explain_generation(model, tok, PROMPTS[0], max_new_tokens=0)
    assert empty.steps == 0 and empty.continuation == "" and empty.to_dict()["scores"] == []


@pytest.mark.slow
def test_smollm2_chat_rows_are_its_own_logits_times_the_input_norms():
    """The offline SmolLM2 with its chat template: every row is ||x^0|| x the model's own logits on the ids it
    produced (greedy), and a step equals normx.explain on its prefix where the prefix's text encodes to the same
    ids."""
    try:
        model, tok = normx.load_model("smollm2")
    except normx.ModelLoadError as exc:
        pytest.skip(f"the smollm2 preset does not load here: {exc}")
    g = normx.explain_generation(model, tok, "Name a colour.", chat=True, max_new_tokens=8)
    assert g.vocabulary_tokens[:g.prompt_length][-3:] == tok.convert_ids_to_tokens(
        tok(tok.apply_chat_template([{"role": "user", "content": "Name a colour."}], tokenize=False,
                                    add_generation_prompt=True), add_special_tokens=False)["input_ids"])[-3:]
    check_against_own_outputs(model, g)
    assert g.predictions == g.token_ids[g.prompt_length:]
    compared = 0
    for t in range(g.steps):
        p = g.prompt_length + t
        prefix = tok.decode(g.token_ids[:p])
        if tok(prefix)["input_ids"] != g.token_ids[:p]:
            continue
        want = normx.explain(model, tok, prefix, target=g.token_ids[p])
        np.testing.assert_allclose(g.step(t).scores, want.scores, rtol=1e-4, atol=1e-4 * np.abs(want.scores).max())
        compared += 1
    assert compared >= 1


def test_generations_compare_and_read_as_text():
    model, tokenizer = tiny.build("LlamaForCausalLM")
    g = normx.explain_generation(model, tokenizer, "the film was", max_new_tokens=3)
    again = normx.explain_generation(model, tokenizer, "the film was", max_new_tokens=3)
    assert g == again and not (g != again)  # arrays compared as arrays, not "truth value ... ambiguous"
    assert g != normx.explain_generation(model, tokenizer, "the film was", max_new_tokens=2)
    text = repr(g)
    assert text.startswith("Generation(normxlogit, 3 generated tokens") and "step 2" in text and "array" not in text
    e = g.step(0)
    assert "array" not in repr(e) and repr(e).startswith("Explanation(normxlogit") and e.texts[1] in repr(e)


def test_tokens_read_as_text_and_a_steps_text_round_trips_through_explain():
    model, tokenizer = tiny.build("LlamaForCausalLM")  # byte-level BPE: "Ġfilm" in the vocabulary, a <s> prefix
    g = normx.explain_generation(model, tokenizer, "the film was", max_new_tokens=3)
    assert g.vocabulary_tokens[0] == "<s>" and g.tokens[0] == "<s>" and not g.text.startswith("<s>")  # no text
    assert any(t.startswith("Ġ") for t in g.vocabulary_tokens) and not any("Ġ" in t for t in g.tokens)
    assert "".join(g.tokens[1:]) == g.text and g.to_dict()["tokens"] == g.tokens  # the JSON reads as text too
    first = g.step(0)
    assert first.text == "the film was"
    again = normx.explain(model, tokenizer, first.text, target=g.token_ids[g.prompt_length])
    assert again.tokens == first.tokens  # one <s>, not two
    np.testing.assert_allclose(again.scores[0, -1], first.scores[0, -1], rtol=1e-4, atol=1e-5)
    assert "Ġ" not in repr(g)


def test_every_python_view_of_a_generation_reads_as_text():
    """#43: ``g.tokens``, ``g.top()``, ``repr(g)``, ``repr(g.step(t))`` and the JSON all give the text a token stands
    for (" film", not "Ġfilm"); the tokenizer's spelling is ``vocabulary_tokens`` (the JSON's field of that name);
    ``g.step(t)`` stays what normx.explain gives on the prefix, its repr as text too."""
    model, tokenizer = tiny.build("LlamaForCausalLM")  # byte-level BPE
    g = normx.explain_generation(model, tokenizer, "the film was good", max_new_tokens=3)
    spelled = tokenizer.convert_ids_to_tokens(g.token_ids)
    assert g.vocabulary_tokens == spelled and any(t.startswith("Ġ") for t in spelled)
    assert g.tokens == [t if i == 0 else tokenizer.decode(g.token_ids[:i + 1], skip_special_tokens=True)[
        len(tokenizer.decode(g.token_ids[:i], skip_special_tokens=True)):] for i, t in enumerate(spelled)]
    assert "Ġf" in spelled and " f" in g.tokens and "Ġf" not in g.tokens  # " film" is " f" "il" "m" here
    for t in range(g.steps):
        for index, token, _ in g.top(t, k=4):
            assert token == g.tokens[index] and "Ġ" not in token
    step = g.step(0)
    assert step.tokens == spelled[:g.prompt_length]  # an Explanation, as normx.explain's on the prefix ...
    assert step.texts == [t.strip() for t in g.tokens[:g.prompt_length]]  # ... read as text
    assert "Ġ" not in repr(step).split("\n", 1)[1]
    assert "Ġ" not in repr(g)
    data = g.to_dict()
    assert data["tokens"] == g.tokens and data["vocabulary_tokens"] == g.vocabulary_tokens
    back = Generation.from_dict(data)
    assert back == g and back.tokens == g.tokens and back.vocabulary_tokens == spelled
