"""One model shared by many threads: every result equals the same call made alone, and the model is left as it was.

Threads run mixed methods (hooks, eager-attention passes, gradient passes, value-zeroing output replacement) and
mixed lengths (one over the model's length, so the tokenizer's truncation state is exercised) on one encoder and
one decoder model. The switch interval is made tiny so that threads interleave inside every forward pass.
"""

from __future__ import annotations

import random
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tiny
import torch
from leaks import model_state

import normx
from normx.core.concurrency import ModelLock, model_lock
from normx.core.hooks import capture, hooked

LONG = " ".join(["the film was a gripping story and"] * 12)  # over the tiny models' 64 positions: truncated
TEXTS = ["paris is large", "the film was a gripping story", "a dull movie, with a predictable plot", LONG]

ENCODER_METHODS = {
    "normxlogit": {"layer": "all"}, "logat": {"target": "all"}, "gradient_x_input": {},
    "integrated_gradients": {"n_steps": 4, "internal_batch_size": 4}, "decompx": {}, "globenc": {"layer": "all"},
    "value_zeroing": {"internal_batch_size": 8},
}
DECODER_METHODS = {
    "normxlogit": {"layer": "all"}, "logat": {"target": "all"}, "gradient_x_input": {},
    "integrated_gradients": {"n_steps": 4, "internal_batch_size": 4},
}
CASES = {"BertForSequenceClassification": ENCODER_METHODS, "LlamaForSequenceClassification": DECODER_METHODS}


def jobs(methods: dict) -> list[tuple[str, tuple[str, ...], dict]]:
    """(method, texts, options): single texts of every length and a mixed-length batch, per method."""
    out = []
    for method, options in methods.items():
        for text in TEXTS:
            out.append((method, (text,), options))
        out.append((method, tuple(TEXTS), options))
    return out


def run(model, tokenizer, job) -> list[normx.Explanation]:
    method, texts, options = job
    return normx.explain(model, tokenizer, list(texts), method=method, **options)


def same(a: list[normx.Explanation], b: list[normx.Explanation]) -> bool:
    return all(x.tokens == y.tokens and x.prediction == y.prediction and x.labels == y.labels
               and np.allclose(x.scores, y.scores, rtol=1e-5, atol=1e-6) for x, y in zip(a, b))


@pytest.fixture
def interleaved():
    """Threads switch every microsecond: every forward pass of one thread is interrupted by the others."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@pytest.mark.parametrize("case_id", list(CASES))
def test_threads_get_what_they_would_get_alone(case_id, interleaved):
    model, tokenizer = tiny.build(case_id, fresh=True)
    work = jobs(CASES[case_id])
    alone = {i: run(model, tokenizer, job) for i, job in enumerate(work)}
    before = model_state(model)

    order = [i for i in alone for _ in range(3)]
    random.Random(0).shuffle(order)
    start = threading.Barrier(8)

    def worker(chunk):
        start.wait()
        return [(i, run(model, tokenizer, work[i])) for i in chunk]

    chunks = [order[k::8] for k in range(8)]
    with ThreadPoolExecutor(8) as pool:
        results = [r for chunk in pool.map(worker, chunks) for r in chunk]
    assert len(results) == len(order)
    wrong = [work[i][0] + f" x{len(work[i][1])}" for i, got in results if not same(got, alone[i])]
    assert not wrong, f"{len(wrong)} of {len(results)} concurrent results differ from the call alone: {wrong}"
    assert model_state(model) == before
    assert model_lock(model).held_by_this_thread is None


def test_a_model_in_training_mode_is_explained_in_eval_mode_by_every_thread(interleaved):
    model, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    work = [job for job in jobs(ENCODER_METHODS) if job[0] in ("normxlogit", "gradient_x_input", "globenc")]
    reference = [run(model, tokenizer, job) for job in work]  # eval mode
    model.train()
    before = model_state(model)
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda job: run(model, tokenizer, job), work * 2))
    assert all(same(g, r) for g, r in zip(got, reference * 2)), "dropout was on in some pass"
    assert model_state(model) == before  # back in training mode, everywhere


def test_hooks_of_one_thread_do_not_see_another_threads_passes():
    model, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    enc = tokenizer(["paris is large"], return_tensors="pt")
    seen = []
    other_ran = threading.Event()

    def other():
        with torch.no_grad():
            model(**enc)
        other_ran.set()

    with capture({"last": model.bert.encoder.layer[-1]}) as store:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert other_ran.is_set()
        seen.append(dict(store))
        with torch.no_grad():
            model(**enc)
    assert seen == [{}]  # the other thread's pass went through the hooked module but was not captured
    assert set(store) == {"last"}


def test_a_pre_hook_called_without_kwargs_is_another_threads_pass():
    """torch adds a keyword pre-hook to the module's hooks before it marks it as taking keywords (and removes it in
    the same two steps), so a pass in another thread at that moment calls it as (module, args): it must change
    nothing and count as no firing, not raise."""
    model, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    enc = tokenizer(["paris is large"], return_tensors="pt")
    layer = model.bert.encoder.layer[-1]
    calls = []
    with hooked({"last": layer}, lambda *call: calls.append(call), inputs={"last"}):
        (hook,) = layer._forward_pre_hooks.values()
        assert hook(layer, (torch.zeros(1, 3, 8),)) is None  # as the racing pass calls it
        assert calls == []
        with torch.no_grad():
            model(**enc)
    assert len(calls) == 1 and calls[0][0] == "last"


def test_model_lock_is_exclusive_and_prefers_writers():
    lock = ModelLock()
    events = []
    reader_in = threading.Event()
    release_reader = threading.Event()

    def reader(name, hold=None):
        with lock.shared():
            events.append(f"{name} in")
            if hold is not None:
                reader_in.set()
                hold.wait(5)
            events.append(f"{name} out")

    def writer():
        with lock.exclusive():
            events.append("writer in")
            events.append("writer out")

    first = threading.Thread(target=reader, args=("r1", release_reader))
    first.start()
    assert reader_in.wait(5)
    w = threading.Thread(target=writer)
    w.start()
    while not lock._writers_waiting:  # the writer is queued behind r1
        threading.Event().wait(0.001)
    late = threading.Thread(target=reader, args=("r2",))
    late.start()  # must wait behind the writer
    threading.Event().wait(0.05)
    assert events == ["r1 in"]
    release_reader.set()
    for t in (first, w, late):
        t.join(5)
    assert events == ["r1 in", "r1 out", "writer in", "writer out", "r2 in", "r2 out"]


def test_model_lock_nests_and_upgrades_within_a_thread():
    lock = ModelLock()
    with lock.shared():
        with lock.shared():
            assert lock.held_by_this_thread == "shared"
        with lock.exclusive():  # a shared hold is given up while exclusive
            assert lock.held_by_this_thread == "exclusive" and lock._readers == 0
            with lock.shared():
                assert lock.held_by_this_thread == "exclusive"
        assert lock.held_by_this_thread == "shared" and lock._readers == 1
    assert lock.held_by_this_thread is None and lock._readers == 0 and lock._writer is None
    with pytest.raises(RuntimeError, match="boom"), lock.exclusive():
        raise RuntimeError("boom")
    assert lock._writer is None  # released on errors


def test_a_module_added_after_first_use_in_training_mode_is_switched_to_eval_too():
    """normx keeps a model's modules between calls (normx.models.structure); a module registered later (a new
    dropout, as a user or PEFT would add one) is among them on the next call."""
    model, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    reference = normx.explain(model, tokenizer, TEXTS[1]).scores
    model.classifier = torch.nn.Sequential(torch.nn.Dropout(0.5), model.classifier)  # in training mode
    assert model.classifier[0].training
    for _ in range(3):  # dropout at 0.5 on 32 features: a pass with it on differs
        np.testing.assert_allclose(normx.explain(model, tokenizer, TEXTS[1]).scores, reference, rtol=1e-5, atol=1e-6)
    assert model.classifier[0].training


def test_a_block_replaced_after_first_use_is_the_one_hooked():
    """The capture points are kept between calls too: a block replaced later is the one read."""
    from normx.models.structure import kept, tree_version

    model, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    before = normx.explain(model, tokenizer, TEXTS[1], target=0, layer="all").scores
    version = tree_version()
    calls = []
    assert kept(model, "probe", lambda: calls.append(1) or len(calls)) == 1
    assert kept(model, "probe", lambda: calls.append(1) or len(calls)) == 1  # kept
    layers = model.bert.encoder.layer
    layers[1] = PassThrough()  # the last block now passes its input on (a registration)
    assert tree_version() != version
    assert kept(model, "probe", lambda: calls.append(1) or len(calls)) == 2  # made again
    after = normx.explain(model, tokenizer, TEXTS[1], target=0, layer="all").scores
    np.testing.assert_allclose(after[:, :2], before[:, :2], rtol=1e-5, atol=1e-6)  # layers 0 and 1 as before
    np.testing.assert_allclose(after[:, 2], before[:, 1], rtol=1e-5, atol=1e-6)  # layer 2 is x^1 now
    assert not np.allclose(before[:, 2], before[:, 1])


def test_blocks_inserted_and_deleted_without_a_registration_are_seen():
    """``ModuleList.insert`` writes its children directly and a deletion rebinds them, neither through torch's
    registration hooks: the kept structure sees both (normx.models.structure compares the containers)."""
    model, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    before = normx.explain(model, tokenizer, TEXTS[1], target=0, layer="all").scores  # layers 0..2
    layers = model.bert.encoder.layer
    layers.insert(0, PassThrough())
    after = normx.explain(model, tokenizer, TEXTS[1], target=0, layer="all").scores
    assert after.shape[1] == before.shape[1] + 1
    np.testing.assert_allclose(after[:, 1], before[:, 0], rtol=1e-5, atol=1e-6)  # block 1 passes x^0 on
    np.testing.assert_allclose(after[:, 2:], before[:, 1:], rtol=1e-5, atol=1e-6)
    del layers[0]
    again = normx.explain(model, tokenizer, TEXTS[1], target=0, layer="all").scores
    np.testing.assert_allclose(again, before, rtol=1e-5, atol=1e-6)


def test_a_decoders_own_forward_keeps_what_is_kept_of_it():
    """Llama's forward slices its block list into a new module list on every pass (each block registered into a
    list no model holds): what normx keeps of the model outlives the pass, and a registration into the model itself
    is still seen."""
    from normx.models.structure import submodules

    model, tokenizer = tiny.build("LlamaForCausalLM", fresh=True)
    modules = submodules(model)
    with torch.no_grad():
        model(**tokenizer(TEXTS[1], return_tensors="pt"))
    assert submodules(model) is modules
    model.lm_head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=False)
    assert submodules(model) is not modules and model.lm_head in submodules(model)


def test_a_model_with_an_unhashable_module_is_explained_and_changes_to_it_seen():
    """A module class may define ``__eq__`` without ``__hash__`` (a dataclass does): normx keeps such a model's modules
    by identity, and a block replaced after first use is still the one read."""
    model, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    model.classifier = Unhashable(model.classifier)
    with pytest.raises(TypeError):
        hash(model.classifier)
    before = normx.explain(model, tokenizer, TEXTS[1], target=0, layer="all").scores
    model.bert.encoder.layer[1] = PassThrough()
    after = normx.explain(model, tokenizer, TEXTS[1], target=0, layer="all").scores
    np.testing.assert_allclose(after[:, 2], before[:, 1], rtol=1e-5, atol=1e-6)


class Unhashable(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, hidden):
        return self.inner(hidden)

    def __eq__(self, other):
        return self is other

    __hash__ = None


class PassThrough(torch.nn.Module):
    def forward(self, hidden, *args, **kwargs):
        return hidden


def test_a_model_explained_is_freed_when_dropped():
    """What normx keeps of a model between calls (its lock, its verified adapter, its modules and hook points) does
    not keep the model alive."""
    import gc
    import weakref

    model, tokenizer = tiny.build("BertForSequenceClassification", fresh=True)
    normx.explain(model, tokenizer, TEXTS[1], layer="all")
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None
