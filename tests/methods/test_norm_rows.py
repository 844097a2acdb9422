"""The response's norm-based attention rows read in the presence reading's plain pass on a cache
(normx.methods.decoder.norm_rows): equal to the ``norm`` family of one eager pass over the whole sequence summed over
blocks and heads (another reading, per architecture family: grouped-query, fused and Conv1D projections); the
presence gradients do not change when they are read; read on the cut cache of a pass over the whole sequence, as
read on their own; the calibrated family built on them; threads; a refused model."""

from __future__ import annotations

import numpy as np
import pytest
import tiny
from threads import in_threads

from normx._torch import torch
from normx.core.batch import Encoded
from normx.core.handle import model_handle
from normx.errors import UnsupportedModelError
from normx.methods.ablation.prefix import Prefix
from normx.methods.calibrated import readings
from normx.methods.decoder.presence import presence_gradients
from normx.methods.response import ResponseContext

SOURCES = [[1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12]]


def norm_family(handle, ids, length):
    """[steps, T]: the ``norm`` family of head_readings (one eager pass over the whole sequence), summed over blocks
    and heads."""
    blocks = handle.adapter.num_layers(handle.base)
    per_block, _ = readings.head_readings(handle, ids, length, ["norm"], lambda _l, block: block[0].sum(0),
                                          "test")
    assert len(per_block) == blocks
    return sum(per_block.values()).double().numpy()


@pytest.mark.parametrize(("model_type", "name"), [
    ("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM"), ("gpt2", "GPT2LMHeadModel"),
    ("gemma3_text", "Gemma3ForCausalLM"), ("gpt_neox", "GPTNeoXForCausalLM"),
])
@pytest.mark.parametrize("first_row", [2, 15])
def test_the_rows_are_the_norm_family_of_one_whole_pass(model_type, name, first_row):
    import architectures

    model = architectures.build(model_type, name, "causal_lm")
    ids, length = [int(i) for i in range(20, 40)], 16
    handle = model_handle(model)
    reading = presence_gradients(handle, ids, length, SOURCES, "test", first_row, norm=True)
    want = norm_family(handle, ids, length)
    assert reading.norm.shape == (len(ids) - length, len(ids) - 1)
    np.testing.assert_allclose(reading.norm, want[:, :-1], rtol=1e-4, atol=1e-6 * np.abs(want).max())
    assert np.abs(want).max() > 1e-3 and not want[:, -1].any()
    plain = presence_gradients(handle, ids, length, SOURCES, "test", first_row)
    assert plain.norm is None
    np.testing.assert_allclose(reading.gradients, plain.gradients, rtol=1e-5, atol=1e-7)  # the same reading
    torch.testing.assert_close(reading.logits, plain.logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("model_type", "name"), [
    ("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM"), ("gpt2", "GPT2LMHeadModel"),
    ("gpt_neox", "GPTNeoXForCausalLM"),
])
def test_continued_from_a_whole_pass_it_reads_what_its_own_passes_read(model_type, name):
    """budgeted's prior: the presence reading (and the rows' norm-based attention) on the cache and value vectors of
    a pass over the whole sequence, cut at its first row, equals the reading that runs its own prompt pass; the
    whole pass is left as it was (a second reading on it reads the same)."""
    import architectures

    model = architectures.build(model_type, name, "causal_lm")
    ids, length, first_row = [int(i) for i in range(20, 40)], 16, 9
    handle = model_handle(model)
    item = Encoded(text="", text_pair=None, ids=ids, tokens=[""] * len(ids), offsets=[(0, 0)] * len(ids),
                   segments=[0] * len(ids), special=[False] * len(ids))
    whole = Prefix(ResponseContext(handle, None, "", item, length, {}, 4), values="test")
    assert whole.layers is not None and sorted(whole.values) == list(range(1, handle.adapter.num_layers(model) + 1))
    own = presence_gradients(handle, ids, length, SOURCES, "test", first_row, norm=True)
    for _ in range(2):
        got = presence_gradients(handle, ids, length, SOURCES, "test", first_row, norm=True, prefix=whole)
        np.testing.assert_allclose(got.gradients, own.gradients, rtol=1e-4, atol=1e-6 * np.abs(own.gradients).max())
        np.testing.assert_allclose(got.norm, own.norm, rtol=1e-4, atol=1e-6 * np.abs(own.norm).max())
        torch.testing.assert_close(got.logits, own.logits, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="no value vectors"):
        presence_gradients(handle, ids, length, SOURCES, "test", first_row, norm=True,
                           prefix=Prefix(ResponseContext(handle, None, "", item, length, {}, 4)))


def test_the_family_is_per_step_and_shares_the_presence_pass():
    model, tok = tiny.build("LlamaForCausalLM")
    ids = [*tok("the film was good. a dull plot! it was long and the end was sad")["input_ids"], 17, 23, 5]
    length = len(ids) - 3
    handle = model_handle(model)
    values, logits = readings.source_readings(handle, ids, length, SOURCES, ["presence", "response_norm"], "test")
    first_row = readings.presence_first_row(len(ids), length, SOURCES)
    want = presence_gradients(handle, ids, length, SOURCES, "test", first_row, norm=True)
    np.testing.assert_allclose(values["response_norm"][:, :-1], want.norm, rtol=1e-6)
    assert values["response_norm"].shape == (3, len(ids)) and not values["response_norm"][:, -1].any()
    np.testing.assert_allclose(values["presence"][:, :length], np.repeat(want.gradients[None] / 3, 3, 0), rtol=1e-6)
    alone, _ = readings.source_readings(handle, ids, length, SOURCES, ["response_norm"], "test")
    assert list(alone) == ["response_norm"]
    np.testing.assert_allclose(alone["response_norm"], values["response_norm"], rtol=1e-6)
    torch.testing.assert_close(logits, want.logits)


def test_threads_sharing_a_model_each_get_their_own_rows():
    model, tok = tiny.build("LlamaForCausalLM")
    ids = [*tok("the film was good. a dull plot! it was long and the end was sad")["input_ids"], 17, 23, 5]
    handle = model_handle(model)

    def read(i):  # a different response length per thread: other rows, other shapes
        return presence_gradients(handle, ids[:len(ids) - i % 2], len(ids) - 3, SOURCES, "test", 5, norm=True).norm

    alone = [read(i) for i in range(2)]
    for i, got in in_threads(read, 6).items():
        np.testing.assert_allclose(got, alone[i % 2], rtol=1e-5, atol=1e-7)


def test_a_model_whose_mix_is_not_its_output_is_refused():
    model, tok = tiny.build("LlamaForCausalLM", fresh=True)
    ids = [*tok("the film was good. a dull plot! it was long")["input_ids"], 17, 23]
    attention = model.model.layers[0].self_attn  # its output is no longer its values mixed and projected
    attention.register_forward_hook(lambda _m, _a, out: (out[0] * 2, *out[1:]))
    with pytest.raises(UnsupportedModelError, match="do not give the module's own output"):
        presence_gradients(model_handle(model), ids, len(ids) - 2, [[1, 2, 3], [4, 5]], "test", norm=True)
