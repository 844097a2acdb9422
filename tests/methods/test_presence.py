"""Presence gradients (normx.methods.decoder.presence): the derivative of the response's log-probability in each
source's log-presence, against autograd through one whole-sequence pass with the bias added to every block's mask
(float64) and a finite difference; at full presence their sum over sources is the knockout gradients' sum over the
sources' tokens (another reading, per family); the logits are the model's own; threads; bad input; the calibrated
family built on it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tiny
from threads import in_threads

from normx._torch import torch
from normx.core.handle import model_handle
from normx.errors import InvalidInputError
from normx.methods.calibrated import readings
from normx.methods.decoder import presence
from normx.methods.decoder.knockout import knockout_gradients
from normx.methods.decoder.presence import presence_gradients

TEXT = "the film was good. a dull plot! it was long and the end was sad"
SOURCES = [[1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12]]


def sequence(tok, response=(17, 23, 5, 9)):
    ids = list(tok(TEXT)["input_ids"]) + list(response)
    return ids, len(ids) - len(response)


def whole_pass(model, ids, length, first_row, log_presence):
    """The response's log-probability from one forward pass over the whole sequence, every block's mask plus
    log_presence[j] where a row at or after ``first_row`` comes after source j and the key is one of its tokens
    (``log_presence`` one per source, or one per token of the sources: [sum of their sizes], in their order)."""
    total = len(ids)
    bias = torch.zeros(total, total, dtype=torch.float64)
    per_token = len(log_presence) != len(SOURCES)
    at = 0
    for j, members in enumerate(SOURCES):
        for row in range(max(first_row, max(members) + 1), total):
            value = log_presence[at:at + len(members)] if per_token else log_presence[j]
            bias[row, members] = bias[row, members] + value
        at += len(members)

    def add(_module, args, kwargs):
        mask = kwargs["attention_mask"]
        if mask is None:  # sdpa's causal flag alone: the same rule as a mask
            mask = torch.ones(total, total, dtype=torch.bool).tril()[None, None]
        if mask.dtype == torch.bool:
            mask = torch.where(mask, torch.zeros((), dtype=torch.float64), torch.finfo(torch.float64).min)
        kwargs["attention_mask"] = mask + bias
        return args, kwargs

    hooks = [layer.self_attn.register_forward_pre_hook(add, with_kwargs=True) for layer in model.model.layers]
    try:
        tensor = torch.tensor([ids])
        logits = model(input_ids=tensor).logits[0, length - 1:-1].double()
    finally:
        for hook in hooks:
            hook.remove()
    return torch.log_softmax(logits, -1).gather(1, tensor[0, length:, None]).sum()


@pytest.fixture(scope="module")
def llama64():
    model, tok = tiny.build("LlamaForCausalLM", fresh=True)
    return model.double(), tok


@pytest.mark.parametrize("where", ["every row", "the middle", "the response"])
def test_the_reading_is_the_derivative_in_the_log_presences(llama64, where):
    model, tok = llama64
    ids, length = sequence(tok)
    first_row = {"every row": 1, "the middle": 8, "the response": length - 1}[where]
    reading = presence_gradients(model_handle(model), ids, length, SOURCES, "test", first_row)
    per_token, logits = reading.gradients, reading.logits
    g = readings.by_source(per_token, SOURCES)
    beta = torch.full((len(SOURCES),), math.log(0.5), dtype=torch.float64, requires_grad=True)
    (want,) = torch.autograd.grad(whole_pass(model, ids, length, first_row, beta), beta)
    np.testing.assert_allclose(g, want.numpy(), rtol=1e-8, atol=1e-10)
    # per token: each token's own columns (a bias of its own on each source token)
    tokens = [i for members in SOURCES for i in members]
    each = torch.full((len(tokens),), math.log(0.5), dtype=torch.float64, requires_grad=True)
    (want,) = torch.autograd.grad(whole_pass(model, ids, length, first_row, each), each)
    np.testing.assert_allclose(per_token[tokens], want.numpy(), rtol=1e-8, atol=1e-10)
    assert per_token.shape == (length,) and not per_token[[0, 13, 14]].any()  # tokens in no source: 0
    # and a central difference in one source's presence (a wide step: the model's norms compute in float32)
    step = torch.zeros(len(SOURCES), dtype=torch.float64)
    step[1] = 1e-2
    with torch.no_grad():
        up, down = (whole_pass(model, ids, length, first_row, beta.detach() + sign * step).item() for sign in (1, -1))
    assert g[1] == pytest.approx((up - down) / 2e-2, rel=1e-3, abs=1e-6)
    assert np.abs(g).max() > 1e-6  # not all zero
    with torch.no_grad():
        plain = model(input_ids=torch.tensor([ids])).logits[0, length - 1:-1].float()
    torch.testing.assert_close(logits, plain, rtol=1e-6, atol=1e-6)  # the model's own logits, unbiased


@pytest.mark.parametrize(("model_type", "name"), [
    ("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM"), ("gpt2", "GPT2LMHeadModel"),
    ("gemma3_text", "Gemma3ForCausalLM"), ("gpt_neox", "GPTNeoXForCausalLM"),
])
def test_at_full_presence_their_sum_is_the_knockout_gradients_over_the_sources(model_type, name):
    import architectures

    model = architectures.build(model_type, name, "causal_lm").double()
    ids, length = [int(i) for i in range(20, 40)], 16
    handle = model_handle(model)
    per_token = presence_gradients(handle, ids, length, SOURCES, "test", presence=1.0).gradients
    grads, _ = knockout_gradients(handle, ids, length, "test")  # [L, H, n, T - 1] float32, the response's rows
    want = [float(grads[..., members].sum()) for members in SOURCES]
    np.testing.assert_allclose(readings.by_source(per_token, SOURCES), want, rtol=1e-5, atol=1e-8)
    tokens = [i for members in SOURCES for i in members]
    np.testing.assert_allclose(per_token[tokens], grads[..., tokens].double().sum((0, 1, 2)).numpy(), rtol=1e-5,
                               atol=1e-8)
    assert np.abs(per_token).max() > 1e-6


def test_threads_sharing_a_model_each_get_their_own_reading():
    model, tok = tiny.build("LlamaForCausalLM")
    ids, length = sequence(tok)
    handle = model_handle(model)
    alone = [presence_gradients(handle, ids, length, SOURCES[i % 3:], "test", 5).gradients for i in range(3)]
    results = in_threads(lambda i: presence_gradients(handle, ids, length, SOURCES[i % 3:], "test", 5).gradients, 6)
    for i, got in results.items():
        np.testing.assert_allclose(got, alone[i % 3], rtol=1e-5, atol=1e-7)


def test_bad_input_says_what_was_given():
    model, tok = tiny.build("LlamaForCausalLM")
    ids, length = sequence(tok)
    handle = model_handle(model)
    with pytest.raises(InvalidInputError, match=r"presence must be a number in \(0, 1\] or one per source \(4\), "
                                                "got 0.0"):
        presence_gradients(handle, ids, length, SOURCES, "test", presence=0.0)
    with pytest.raises(InvalidInputError, match="presence must be a number"):
        presence_gradients(handle, ids, length, SOURCES, "test", presence=1.5)
    with pytest.raises(InvalidInputError, match=r"one per source \(4\), got \[0.5, 1.0\]"):
        presence_gradients(handle, ids, length, SOURCES, "test", presence=[0.5, 1.0])
    with pytest.raises(InvalidInputError, match="whole names sources"):
        readings.source_readings(handle, ids, length, SOURCES, ["presence"], "test", whole=[4])
    with pytest.raises(InvalidInputError, match=f"at most the response's first row {length - 1}; got {length}"):
        presence_gradients(handle, ids, length, SOURCES, "test", length)
    with pytest.raises(InvalidInputError, match="source 1 is empty"):
        presence_gradients(handle, ids, length, [[1, 2], []], "test")
    with pytest.raises(InvalidInputError, match="the sources overlap"):
        presence_gradients(handle, ids, length, [[1, 2, 3], [3, 4]], "test")


def test_the_bias_is_built_without_a_loop_over_the_sources_as_one_would_write_it_per_source():
    """The bias from per-key vectors equals the per-source rule written out: ``values[j]`` from each row after source
    j's last token to its tokens; tokens in no source, and a source no row comes after, get none."""
    rng = np.random.default_rng(0)
    keys, first_row = 60, 35
    cuts = np.sort(rng.choice(np.arange(2, keys), size=9, replace=False))
    sources = [list(range(a, b)) for a, b in zip(cuts[::2], cuts[1::2])]  # gaps between them: tokens in no source
    values = rng.uniform(-2, 0, len(sources))
    owner, last = presence._owners(sources, keys, "test")
    start = presence._after_rows(owner, last, first_row, keys - first_row)
    got = presence._presence_bias(owner, start, keys - first_row, values, torch.float64, "cpu")[0, 0].numpy()
    want = np.zeros((keys - first_row, keys))
    for members, value in zip(sources, values):
        for row in range(first_row, keys):
            if row > max(members):
                want[row - first_row, members] = value
    np.testing.assert_array_equal(got, want)
    assert (want != 0).any() and (want == 0).any()


def test_each_source_may_have_its_own_presence(llama64):
    model, tok = llama64
    ids, length = sequence(tok)
    presence = [0.5, 1.0, 0.5, 0.25]
    per_token = presence_gradients(model_handle(model), ids, length, SOURCES, "test", 3, presence).gradients
    beta = torch.tensor([math.log(p) for p in presence], dtype=torch.float64, requires_grad=True)
    (want,) = torch.autograd.grad(whole_pass(model, ids, length, 3, beta), beta)
    np.testing.assert_allclose(readings.by_source(per_token, SOURCES), want.numpy(), rtol=1e-8, atol=1e-10)
    halves = presence_gradients(model_handle(model), ids, length, SOURCES, "test", 3).gradients
    assert not np.allclose(readings.by_source(halves, SOURCES), want.numpy(), rtol=1e-3)  # the presences matter


@pytest.mark.parametrize("whole", [[], [3]])
def test_the_presence_family_is_the_gradient_per_token_spread_evenly_over_the_steps(whole):
    model, tok = tiny.build("LlamaForCausalLM")
    ids, length = sequence(tok)
    handle = model_handle(model)
    values, logits = readings.source_readings(handle, ids, length, SOURCES, ["presence"], "test", whole=whole)
    first_row = readings.presence_first_row(len(ids), length, SOURCES)
    assert 2 <= first_row <= length - 1
    presence = [1.0 if j in whole else 0.5 for j in range(len(SOURCES))]
    reading = presence_gradients(handle, ids, length, SOURCES, "test", first_row, presence)
    per_token, want_logits = reading.gradients, reading.logits
    steps = len(ids) - length
    want = np.zeros((steps, len(ids)))
    want[:, :length] = per_token / steps
    np.testing.assert_allclose(values["presence"], want, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(readings.by_source(values["presence"], SOURCES).sum(1),
                               readings.by_source(per_token, SOURCES), rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(logits, want_logits)


def test_the_family_reads_a_share_of_the_rows_and_at_most_a_fixed_number():
    """Within the budget a share of the sequence (the query's rows on a ~300-token prompt); on a long prompt no more
    than PRESENCE_MAX_ROWS, so the backward's memory stays linear in the prompt; never before the first source's
    second token nor after the response's first row."""
    sources = [[5, 6, 7], [8, 9]]
    share = int((readings.PRESENCE_BUDGET - 1) * 337 / 3)
    assert readings.presence_first_row(337, 329, sources) == 337 - 1 - share
    assert readings.presence_first_row(10_000, 9_990, sources) == 10_000 - 1 - readings.PRESENCE_MAX_ROWS
    assert readings.presence_first_row(100, 95, [[90, 91], [92]]) == 91  # the first source's second token
    assert readings.presence_first_row(337, 300, [[320, 321]]) == 299  # the response's first row at the latest


def test_a_one_token_response_runs_where_sdpa_builds_no_mask_for_one_row(llama64):
    model, tok = llama64
    ids, length = sequence(tok, response=(17,))
    handle = model_handle(model)
    reading = presence_gradients(handle, ids, length, SOURCES, "test", presence=1.0)
    per_token, logits = reading.gradients, reading.logits
    grads, _ = knockout_gradients(handle, ids, length, "test")
    np.testing.assert_allclose(readings.by_source(per_token, SOURCES), [float(grads[..., m].sum()) for m in SOURCES],
                               rtol=1e-5, atol=1e-8)
    assert logits.shape == (1, model.config.vocab_size)
