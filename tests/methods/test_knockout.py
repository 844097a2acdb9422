"""The attention knockout readings at a response's rows (normx.methods.decoder.knockout): the gradients are the
derivative of the response's log-probability (central differences in float64), the hidden-source outcomes equal a
plain forward pass whose mask hides those keys from those rows, both run on the model's own cache and mask (its
logits are the model's), per family, in threads; a model whose attention takes no bias is a clear error."""

from __future__ import annotations

import numpy as np
import pytest
import tiny
from threads import in_threads

from normx._torch import torch
from normx.core.handle import model_handle
from normx.errors import InvalidInputError, UnsupportedModelError
from normx.methods.decoder import knockout

TEXT = "the film was good. a dull plot! it was long and the end was sad"


def sequence(tok, response=(17, 23, 5, 9)):
    ids = list(tok(TEXT)["input_ids"]) + list(response)
    return ids, len(ids) - len(response)


def log_probability(model, ids, prompt_length, mask=None, bias_at=None, grad=False):
    """The response's per-step log-probabilities from one forward pass over the whole sequence (``mask``: a 4D
    float mask; ``bias_at``: {block index: a bias [1, heads, T, T] added to that block's attention mask})."""
    tensor = torch.tensor([ids])
    hooks = []
    for block, bias in (bias_at or {}).items():
        def add(_module, args, kwargs, bias=bias):
            mask_ = kwargs["attention_mask"]
            if mask_ is None:  # sdpa's causal flag alone: the same rule as a mask
                total = bias.shape[-1]
                mask_ = torch.ones(total, total, dtype=torch.bool).tril()[None, None]
            if mask_.dtype == torch.bool:
                mask_ = torch.where(mask_, torch.zeros((), dtype=bias.dtype), torch.finfo(bias.dtype).min)
            kwargs["attention_mask"] = mask_ + bias
            return args, kwargs
        hooks.append(model.model.layers[block].self_attn.register_forward_pre_hook(add, with_kwargs=True))
    try:
        with torch.set_grad_enabled(grad):
            logits = model(input_ids=tensor, attention_mask=mask).logits[0, prompt_length - 1:-1].double()
    finally:
        for hook in hooks:
            hook.remove()
    return torch.log_softmax(logits, -1).gather(1, tensor[0, prompt_length:, None])[:, 0]


def _whole_sequence_gradients(model, ids, length):
    """d log P / d bias at the response's rows, from one forward pass over the whole sequence with a bias leaf on
    every block's mask ([blocks, heads, n, T - 1])."""
    total, heads = len(ids), model.config.num_attention_heads
    biases = {b: torch.zeros(1, heads, total, total, dtype=torch.float64, requires_grad=True)
              for b in range(model.config.num_hidden_layers)}
    grads = torch.autograd.grad(log_probability(model, ids, length, bias_at=biases, grad=True).sum(),
                                list(biases.values()))
    return torch.stack([g[0, :, length - 1:total - 1, :total - 1] for g in grads])


@pytest.fixture(scope="module")
def llama64():
    model, tok = tiny.build("LlamaForCausalLM", fresh=True)
    return model.double(), tok


def test_the_gradients_are_the_derivative_of_the_response_log_probability(llama64):
    model, tok = llama64
    ids, length = sequence(tok)
    handle = model_handle(model)
    grads, logits = knockout.knockout_gradients(handle, ids, length, "test")
    blocks, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    assert grads.shape == (blocks, heads, len(ids) - length, len(ids) - 1)
    np.testing.assert_allclose(logits.double().numpy(), _plain_logits(model, ids, length), rtol=1e-5, atol=1e-5)
    want = _whole_sequence_gradients(model, ids, length)  # no cache, every row: another computation
    torch.testing.assert_close(grads.double(), want, rtol=1e-5, atol=1e-7)
    block, head, row, key = (int(i) for i in np.unravel_index(int(grads.abs().argmax()), tuple(grads.shape)))
    eps, values = 1e-2, []  # and the largest entry by central differences
    for sign in (1, -1):
        bias = torch.zeros(1, heads, len(ids), len(ids), dtype=torch.float64)
        bias[0, head, length - 1 + row, key] = sign * eps
        values.append(float(log_probability(model, ids, length, bias_at={block: bias}).sum()))
    assert abs((values[0] - values[1]) / (2 * eps) - float(grads[block, head, row, key])) <= 0.02 * abs(
        float(grads[block, head, row, key]))
    for row in range(len(ids) - length):  # a key after the row's position is never read: gradient 0
        assert torch.all(grads[:, :, row, length + row:] == 0)


def _plain_logits(model, ids, length):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, length - 1:-1].double().numpy()


def test_hidden_sources_equal_a_forward_pass_whose_mask_hides_them_from_the_response_rows(llama64):
    model, tok = llama64
    ids, length = sequence(tok)
    sources = [[1, 2, 3], [4, 5, 6, 7], [length - 2]]
    log_p, _ = knockout.hidden_source_outcomes(model_handle(model), ids, length, sources, "test", batch_size=2)
    total = len(ids)
    np.testing.assert_allclose(log_p[0].numpy(), log_probability(model, ids, length).numpy(), rtol=1e-9, atol=1e-9)
    for row, members in enumerate(sources, start=1):
        allowed = torch.ones(total, total).tril().bool()
        for q in range(length - 1, total - 1):
            allowed[q, members] = False
        mask = torch.where(allowed, torch.zeros((), dtype=torch.float64), torch.finfo(torch.float64).min)[None, None]
        want = log_probability(model, ids, length, mask)
        np.testing.assert_allclose(log_p[row].numpy(), want.numpy(), rtol=1e-9, atol=1e-9)
        assert not np.allclose(log_p[row].numpy(), log_p[0].numpy())  # hiding changed something


@pytest.mark.parametrize("case", ["GPT2LMHeadModel", "Qwen2ForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"])
def test_other_families_run_on_their_own_cache_and_mask(case):
    model, tok = tiny.build(case)
    ids, length = sequence(tok, (5, 9, 11))
    grads, logits = knockout.knockout_gradients(model_handle(model), ids, length, "test")
    np.testing.assert_allclose(logits.double().numpy(), _plain_logits(model, ids, length), rtol=1e-4, atol=1e-4)
    assert torch.isfinite(grads).all() and grads.abs().sum() > 0
    log_p, _ = knockout.hidden_source_outcomes(model_handle(model), ids, length, [[1, 2], [3, 4, 5]], "test")
    np.testing.assert_allclose(log_p[0].numpy(), log_probability(model, ids, length).numpy(), rtol=1e-4, atol=1e-5)


def test_threads_sharing_a_model_each_get_their_own_reading():
    model, tok = tiny.build("LlamaForCausalLM")
    ids, length = sequence(tok)
    handle = model_handle(model)
    alone = knockout.knockout_gradients(handle, ids, length, "test")[0]
    hidden = knockout.hidden_source_outcomes(handle, ids, length, [[1, 2], [5, 6]], "test")[0]

    def work(i):
        if i % 2:
            return "g", knockout.knockout_gradients(handle, ids, length, "test")[0]
        return "h", knockout.hidden_source_outcomes(handle, ids, length, [[1, 2], [5, 6]], "test")[0]

    results = in_threads(work)
    assert len(results) == 4
    for kind, value in results.values():
        torch.testing.assert_close(value, alone if kind == "g" else hidden, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("model_type", "name", "says"), [
    ("bert", "BertLMHeadModel", "got NoneType for it .attention implementation 'sdpa'"),  # causal by is_causal alone
    ("mpt", "MptForCausalLM", "did not run with a bias added to its mask"),  # takes boolean masks only
])
def test_a_model_whose_attention_takes_no_bias_is_a_clear_error(model_type, name, says):
    import architectures

    model = architectures.build(model_type, name, "causal_lm")
    ids = [int(i) for i in range(20, 40)]
    with pytest.raises(UnsupportedModelError, match=says):
        knockout.knockout_gradients(model_handle(model), ids, 14, "attention_knockout")
    with pytest.raises(UnsupportedModelError, match=says):
        knockout.hidden_source_outcomes(model_handle(model), ids, 14, [[1, 2]], "attention_knockout")


def test_a_one_token_response_runs_where_sdpa_builds_no_mask_for_one_row():
    """One response row: sdpa's mask builder hands the attention module no mask (every cached key is read), which
    the readings take as zeros; the results equal the whole-sequence computations."""
    model, tok = tiny.build("LlamaForCausalLM", fresh=True)
    model = model.double()
    assert model.config._attn_implementation == "sdpa"
    ids, length = sequence(tok, (17,))
    handle = model_handle(model)
    log_p, _ = knockout.hidden_source_outcomes(handle, ids, length, [[1, 2, 3], [4, 5]], "test")
    np.testing.assert_allclose(log_p[0].numpy(), log_probability(model, ids, length).numpy(), rtol=1e-9, atol=1e-9)
    allowed = torch.ones(len(ids), len(ids)).tril().bool()
    allowed[length - 1, [1, 2, 3]] = False
    mask = torch.where(allowed, torch.zeros((), dtype=torch.float64), torch.finfo(torch.float64).min)[None, None]
    np.testing.assert_allclose(log_p[1].numpy(), log_probability(model, ids, length, mask).numpy(), rtol=1e-9,
                               atol=1e-9)
    grads, _ = knockout.knockout_gradients(handle, ids, length, "test")
    torch.testing.assert_close(grads.double(), _whole_sequence_gradients(model, ids, length), rtol=1e-5, atol=1e-7)


def test_sources_hidden_from_the_prompts_last_rows_too_equal_a_forward_pass_with_that_mask(llama64):
    """first_row before the response: the sources are hidden from the prompt's rows from first_row on as well (the
    rows before it read everything); = one plain pass whose mask says so; a first row at the first token or after
    the response's first row is refused."""
    model, tok = llama64
    ids, length = sequence(tok)
    sources, first = [[1, 2, 3], [4, 5, 6, 7], [10, 11]], 9  # the last one among the re-read rows
    log_p, logits = knockout.hidden_source_outcomes(model_handle(model), ids, length, sources, "test", batch_size=2,
                                                    first_row=first)
    np.testing.assert_allclose(logits.double().numpy(), _plain_logits(model, ids, length), rtol=1e-6, atol=1e-6)
    total = len(ids)
    for row, members in enumerate(sources, start=1):
        allowed = torch.ones(total, total).tril().bool()
        for q in range(max(first, max(members) + 1), total - 1):  # the re-read rows after the source
            allowed[q, members] = False
        mask = torch.where(allowed, torch.zeros((), dtype=torch.float64), torch.finfo(torch.float64).min)[None, None]
        np.testing.assert_allclose(log_p[row].numpy(), log_probability(model, ids, length, mask).numpy(),
                                   rtol=1e-9, atol=1e-9)
    assert length - 1 > 12  # (the third source ends before the response's rows)
    later, _ = knockout.hidden_source_outcomes(model_handle(model), ids, length, sources, "test")
    assert not np.allclose(later[1:].numpy(), log_p[1:].numpy())  # more rows blind to them: another outcome
    for bad in (0, length):
        with pytest.raises(InvalidInputError, match="first row that cannot read the sources"):
            knockout.hidden_source_outcomes(model_handle(model), ids, length, sources, "test", first_row=bad)
