"""The response-level methods through ``normx.explain_generation`` on a tiny Llama: leave-one-out equals forward
passes computed by hand, ContextCite is reproducible from its seed and equals its estimator on hand-made passes,
the sum of the rows over the steps and a source's tokens is the source's score, and the gradient methods' response
scope equals one backward pass of the response's log-probability computed by hand."""

from __future__ import annotations

import numpy as np
import pytest
import tiny
import torch

import normx
from normx.errors import InvalidInputError
from normx.methods import get_method, list_methods
from normx.methods.ablation import ablation_masks, response_logit_probability
from normx.methods.ablation.lasso import surrogate

PROMPT = "the film was good. a dull movie with a plot! the end was fine. it was long."


@pytest.fixture(scope="module")
def llama():
    return tiny.build("LlamaForCausalLM")


def response_log_probs(model, ids: list[int], n: int) -> np.ndarray:
    """log p(y_t | y_<t) of the last n ids, from the model's own forward pass."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    return np.array([logp[len(ids) - n - 1 + t, ids[len(ids) - n + t]].item() for t in range(n)])


def without(ids, spans, removed):
    drop = {i for k in removed for i in range(*spans[k])}
    return [token for i, token in enumerate(ids) if i not in drop]


def source_scores(g, spans):
    rows = g.scores[0]
    return np.array([np.nansum(rows[:, a:b]) for a, b in spans])


def test_leave_one_out_equals_forward_passes_by_hand(llama):
    model, tok = llama
    g = normx.explain_generation(model, tok, PROMPT, method="leave_one_out", max_new_tokens=4)
    spans = g.settings["source_spans"]
    assert len(spans) == 4 and g.settings["scope"] == "response"
    assert tok.decode(g.token_ids[spans[1][0]:spans[1][1]]).strip() == "a dull movie with a plot!"
    full = response_log_probs(model, g.token_ids, g.steps)
    np.testing.assert_allclose(g.diagnostics["log_probability"], full, atol=1e-5)
    np.testing.assert_allclose(np.log(g.probabilities), full, atol=1e-5)
    for k, (a, b) in enumerate(spans):
        drop = full - response_log_probs(model, without(g.token_ids, spans, [k]), g.steps)  # per step
        per_step = np.nansum(g.scores[0][:, a:b], axis=1)
        np.testing.assert_allclose(per_step, drop, atol=1e-4)
        np.testing.assert_allclose(g.scores[0][0, a:b], drop[0] / (b - a), atol=1e-5)  # spread evenly
    np.testing.assert_allclose(source_scores(g, spans).sum(), np.nansum(g.scores[0]), atol=1e-5)  # nothing else
    assert np.isnan(g.scores[0][1, g.prompt_length + 1:]).all()


def test_contextcite_is_its_estimator_on_hand_made_passes_and_reproducible(llama):
    model, tok = llama
    options = {"n_ablations": 12, "seed": 5}
    g = normx.explain_generation(model, tok, PROMPT, method="contextcite", max_new_tokens=4, **options)
    again = normx.explain_generation(model, tok, PROMPT, method="contextcite", max_new_tokens=4, batch_size=3,
                                     **options)
    np.testing.assert_allclose(again.scores, g.scores, atol=1e-5, equal_nan=True)  # the seed, not the batching
    other = normx.explain_generation(model, tok, PROMPT, method="contextcite", max_new_tokens=4, n_ablations=12)
    assert not np.allclose(np.nan_to_num(other.scores), np.nan_to_num(g.scores))
    spans = g.settings["source_spans"]
    masks = ablation_masks(len(spans), 12, 0.5, seed=5)
    outcomes = np.array([response_log_probs(model, without(g.token_ids, spans, np.flatnonzero(~m)), g.steps)
                         for m in masks])
    weights, bias = surrogate(masks, response_logit_probability(outcomes), g.steps, 0.01)
    np.testing.assert_allclose(source_scores(g, spans), weights, atol=1e-3)
    assert g.settings["surrogate_bias"] == pytest.approx(bias, abs=1e-3)
    steps = normx.explain_generation(model, tok, PROMPT, method="contextcite", max_new_tokens=4, fit="steps",
                                     **options)
    logit_p = outcomes - np.log(-np.expm1(outcomes))
    for t in range(g.steps):
        w, _ = surrogate(masks, logit_p[:, t], 1, 0.01)
        np.testing.assert_allclose([np.nansum(steps.scores[0][t, a:b]) for a, b in spans], w, atol=2e-3)


def test_given_source_spans_and_token_sources(llama):
    model, tok = llama
    g = normx.explain_generation(model, tok, PROMPT, method="leave_one_out", max_new_tokens=2,
                                 sources=[(1, 4), (6, 9)])
    assert g.settings["source_spans"] == [[1, 4], [6, 9]] == g.settings["sources"]
    outside = np.delete(g.scores[0][:, :g.prompt_length], np.r_[1:4, 6:9], axis=1)
    assert (outside == 0).all()
    t = normx.explain_generation(model, tok, "a dull movie", method="leave_one_out", max_new_tokens=2,
                                 sources="tokens")
    assert len(t.settings["source_spans"]) == t.prompt_length - 1  # every token but the BOS
    with pytest.raises(InvalidInputError, match="ends after the prompt"):
        normx.explain_generation(model, tok, "a dull movie", method="leave_one_out", max_new_tokens=2,
                                 sources=[(1, 50)])
    with pytest.raises(InvalidInputError, match="sources='chapters'"):
        normx.explain_generation(model, tok, PROMPT, method="contextcite", sources="chapters")


def test_ablation_methods_are_response_only(llama):
    model, tok = llama
    assert {"leave_one_out", "contextcite"} <= set(list_methods(response_only=True))
    assert not {"leave_one_out", "contextcite"} & set(list_methods(experimental=True))
    with pytest.raises(InvalidInputError, match="whole response"):
        normx.explain(model, tok, "a dull movie", method="leave_one_out")
    with pytest.raises(InvalidInputError, match="no per-step computation"):
        normx.explain_generation(model, tok, PROMPT, method="contextcite", scope="step")
    with pytest.raises(InvalidInputError, match="no response-level computation"):
        normx.explain_generation(model, tok, PROMPT, method="normxlogit", scope="response")
    assert get_method("contextcite").passes(100, 1, {"n_ablations": 32}) == 33
    assert get_method("leave_one_out").passes(100, 1, {"sources": [(0, 2), (2, 4)]}) == 3
    bert, _ = tiny.build("BertForSequenceClassification")
    assert "causal LM" in get_method("leave_one_out").unsupported(bert)


@pytest.mark.parametrize("method", ["gradient_x_input", "gradient_norm", "attnlrp"])
def test_response_scope_is_one_backward_of_the_responses_log_probability(llama, method):
    model, tok = llama
    g = normx.explain_generation(model, tok, PROMPT, method=method, max_new_tokens=4, scope="response")
    assert g.settings["scope"] == "response"
    n, length = g.steps, g.prompt_length
    if method == "attnlrp":
        from normx.methods.decoder.lrp.context import attnlrp_rules
        rules = attnlrp_rules(model, torch.ones(1, len(g.token_ids), dtype=torch.long), "attnlrp")
    else:
        from contextlib import nullcontext
        rules = nullcontext()
    ids = torch.tensor([g.token_ids])
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    with rules:
        logits = model(inputs_embeds=embeds).logits[0]
    logp = torch.log_softmax(logits.float(), -1)
    total = sum(logp[length - 1 + t, g.token_ids[length + t]] for t in range(n))
    (grad,) = torch.autograd.grad(total, embeds)
    vectors = grad[0] * (embeds[0].detach() if method != "gradient_norm" else 1)
    want = vectors.sum(-1) if method == "attnlrp" else vectors.abs().sum(-1)  # the gradients' default: l1
    got = np.nansum(g.scores[0], axis=0)  # the sum over the steps is the response's row
    np.testing.assert_allclose(got[:-1], want[:-1].numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(g.scores[0][0, :length], want[:length].numpy() / n, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(g.diagnostics["log_probability"], np.log(g.probabilities), atol=1e-4)


def test_a_prompt_with_every_token_a_source_and_no_bos():
    """GPT-2's tokenizer adds no BOS: removing every source leaves no prompt, so the sequence starts from its
    <|endoftext|>; leave-one-out of the only source is the drop from the response after that token alone."""
    model, tok = tiny.build("GPT2LMHeadModel")
    g = normx.explain_generation(model, tok, "a dull movie", method="leave_one_out", max_new_tokens=3,
                                 sources=[(0, len(tok("a dull movie")["input_ids"]))])
    start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    alone = response_log_probs(model, [start, *g.token_ids[g.prompt_length:]], g.steps)
    full = response_log_probs(model, g.token_ids, g.steps)
    np.testing.assert_allclose(np.nansum(g.scores[0], axis=1), full - alone, atol=1e-4)
    c = normx.explain_generation(model, tok, "a dull movie", method="contextcite", max_new_tokens=3,
                                 sources="tokens", n_ablations=16)
    assert np.isfinite(np.nansum(c.scores))
