"""Re-read ablations (normx.methods.decoder.rereads): hiding sources from every row after them with the positions
closed up IS their removal (a forward pass over the ids without their tokens), per rotary family, in float64; the
keep-everything mask is the model's own pass; threads sharing a model get their own outcomes; a model without rotary
embeddings is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import tiny
from threads import in_threads

from normx._torch import torch
from normx.core.handle import model_handle
from normx.errors import InvalidInputError, UnsupportedModelError
from normx.methods.decoder import rereads

TEXT = "the film was good. a dull plot! it was long and the end was sad"
SOURCES = [[1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12]]
MASKS = np.array([[1, 1, 1, 1], [0, 1, 1, 1], [1, 0, 1, 0], [0, 0, 1, 1], [1, 1, 0, 0]], bool)


def sequence(tok, response=(17, 23, 5, 9)):
    ids = list(tok(TEXT)["input_ids"]) + list(response)
    return ids, len(ids) - len(response)


def removed_log_p(model, ids, prompt_length, keep):
    """Each response token's log-probability from a plain pass over the ids with the removed sources' tokens left
    out (the ablation methods' removal)."""
    gone = {i for j, members in enumerate(SOURCES) if not keep[j] for i in members}
    kept = [t for i, t in enumerate(ids) if i not in gone]
    n = len(ids) - prompt_length
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([kept])).logits[0, -n - 1:-1].double()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[prompt_length:])[:, None])[:, 0].numpy()


@pytest.mark.parametrize("case", ["LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"])
def test_hiding_from_every_later_row_with_positions_closed_up_is_removal(case):
    model, tok = tiny.build(case, fresh=True)
    model = model.double()
    ids, length = sequence(tok)
    log_p, logits = rereads.masked_rereads(model_handle(model), ids, length, SOURCES, MASKS, "test", first_row=1,
                                           batch_size=2)
    with torch.no_grad():
        plain = model(input_ids=torch.tensor([ids])).logits[0, length - 1:-1].float()
    torch.testing.assert_close(logits, plain, rtol=1e-6, atol=1e-6)
    for row, keep in enumerate(MASKS):
        np.testing.assert_allclose(log_p[row], removed_log_p(model, ids, length, keep), rtol=1e-9, atol=1e-9)
    assert not np.allclose(log_p[1], log_p[0])  # removing a source changed something


def test_later_first_rows_keep_the_whole_pass_and_differ_from_removal():
    """From a later first row: the keep-everything mask is still the model's own pass; a removal is approximated
    (the cached rows after a removed source have read it), so it differs from the exact one but moves the same way
    as hiding from those rows does."""
    model, tok = tiny.build("LlamaForCausalLM", fresh=True)
    model = model.double()
    ids, length = sequence(tok)
    log_p = rereads.masked_rereads(model_handle(model), ids, length, SOURCES, MASKS, "test", first_row=length - 3)[0]
    np.testing.assert_allclose(log_p[0], removed_log_p(model, ids, length, MASKS[0]), rtol=1e-9, atol=1e-9)
    assert not np.allclose(log_p[1], removed_log_p(model, ids, length, MASKS[1]), rtol=1e-6, atol=1e-6)


def test_threads_sharing_a_model_each_get_their_own_outcomes():
    model, tok = tiny.build("LlamaForCausalLM")
    ids, length = sequence(tok)
    handle = model_handle(model)
    alone = rereads.masked_rereads(handle, ids, length, SOURCES, MASKS, "test", first_row=5)[0]
    results = in_threads(lambda i: rereads.masked_rereads(handle, ids, length, SOURCES, MASKS[i % 3:], "test",
                                                          first_row=5)[0])
    assert len(results) == 4
    for i, value in results.items():
        np.testing.assert_allclose(value, alone[i % 3:], rtol=1e-5, atol=1e-6)


def test_a_model_without_rotary_embeddings_is_refused_by_name():
    model, tok = tiny.build("GPT2LMHeadModel")
    ids, length = sequence(tok)
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel's attention receives no rotary"):
        rereads.masked_rereads(model_handle(model), ids, length, SOURCES, MASKS, "test", first_row=5)[0]
    # removing nothing before the first re-read row turns no cached key: the re-read rows' positions move, and
    # hiding the removed token from every row after it is then its removal
    keep = np.array([[True], [False]])
    log_p = rereads.masked_rereads(model_handle(model), ids, length, [[length - 2]], keep, "test",
                                   first_row=length - 3)[0]
    kept = ids[:length - 2] + ids[length - 1:]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([kept])).logits[0, -5:-1].double()
    want = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[length:])[:, None])[:, 0].numpy()
    np.testing.assert_allclose(log_p[1], want, rtol=1e-4, atol=1e-4)
    assert not np.allclose(log_p[0], log_p[1])


def test_positions_kept_differ_from_positions_closed_up():
    model, tok = tiny.build("LlamaForCausalLM", fresh=True)
    model = model.double()
    ids, length = sequence(tok)
    closed = rereads.masked_rereads(model_handle(model), ids, length, SOURCES, MASKS, "test", first_row=1)[0]
    kept = rereads.masked_rereads(model_handle(model), ids, length, SOURCES, MASKS, "test", first_row=1,
                                  close_up=False)[0]
    np.testing.assert_allclose(kept[0], closed[0], rtol=1e-9, atol=1e-9)  # nothing removed: the same pass
    assert not np.allclose(kept[1:], closed[1:], rtol=1e-6, atol=1e-6)


def test_bad_masks_and_rows_say_what_was_given():
    model, tok = tiny.build("LlamaForCausalLM")
    ids, length = sequence(tok)
    handle = model_handle(model)
    with pytest.raises(InvalidInputError, match=r"masks must be \[masks, 4 sources\]"):
        rereads.masked_rereads(handle, ids, length, SOURCES, MASKS[:, :3], "test", first_row=5)[0]
    with pytest.raises(InvalidInputError, match="first re-read row"):
        rereads.masked_rereads(handle, ids, length, SOURCES, MASKS, "test", first_row=length)
    with pytest.raises(InvalidInputError, match="source 0 is empty"):
        rereads.masked_rereads(handle, ids, length, [[]], MASKS[:, :1], "test", first_row=5)[0]


@pytest.mark.parametrize(("model_type", "name"), [
    ("gemma3_text", "Gemma3ForCausalLM"),  # local and global blocks rotate by different bases
    ("phi", "PhiForCausalLM"),  # partial rotary, the family's function given the rotated part
    ("gpt_neox", "GPTNeoXForCausalLM"),  # partial rotary inside the family's function
    ("phi3", "Phi3ForCausalLM"),
])
def test_other_rotary_families_close_up_positions_as_removal_does(model_type, name):
    import architectures

    model = architectures.build(model_type, name, "causal_lm").double()
    ids = [int(i) for i in range(20, 40)]
    length = 16
    sources = [[1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12]]
    log_p, _ = rereads.masked_rereads(model_handle(model), ids, length, sources, MASKS, "test", first_row=1)
    for row, keep in enumerate(MASKS):
        gone = {i for j, members in enumerate(sources) if not keep[j] for i in members}
        kept = [t for i, t in enumerate(ids) if i not in gone]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([kept])).logits[0, -5:-1].double()
        want = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[length:])[:, None])[:, 0].numpy()
        np.testing.assert_allclose(log_p[row], want, rtol=1e-8, atol=1e-8)
