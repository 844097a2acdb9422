"""Dynamic batching of one-pass requests: concurrent requests are explained together and each gets what it gets
alone; a bad request fails alone; the same request again is answered from the result cache."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tiny

import normx
from normx.serving.batching import Batcher
from normx.serving.session import ResultCache, explain_request

TEXTS = ["a gripping film", "the plot was predictable and dull", "not bad at all", "a film",
         "an utterly charming story, beautifully acted"]


def test_concurrent_requests_are_batched_and_each_gets_what_it_gets_alone():
    model, tok = tiny.build("BertForSequenceClassification")
    batcher = Batcher(window_ms=50, max_batch=16)
    settings = {"method": "normxlogit", "target": "all", "layer": "all"}
    texts = TEXTS * 3

    def ask(text):
        return batcher.explain(model, tok, text, tokens=len(tok(text)["input_ids"]), **settings)

    with ThreadPoolExecutor(len(texts)) as pool:
        got = list(pool.map(ask, texts))
    assert max(batcher.batches) > 1 and sum(batcher.batches) == len(texts)
    for text, e in zip(texts, got):
        alone = normx.explain(model, tok, text, **settings)
        assert e.tokens == alone.tokens and e.prediction == alone.prediction and e.labels == alone.labels
        np.testing.assert_allclose(e.scores, alone.scores, rtol=1e-5, atol=1e-5)


def test_a_bad_request_fails_alone():
    model, tok = tiny.build("BertForSequenceClassification")
    batcher = Batcher(window_ms=50)

    def ask(text):
        try:
            return batcher.explain(model, tok, text, tokens=8, method="logat")
        except normx.NormxError as exc:
            return exc

    with ThreadPoolExecutor(3) as pool:
        good, bad, other = pool.map(ask, ["a gripping film", "   ", "a dull plot"])
    assert isinstance(bad, normx.EmptyTextError)
    assert good.tokens == normx.explain(model, tok, "a gripping film", method="logat").tokens
    assert other.prediction == normx.explain(model, tok, "a dull plot", method="logat").prediction


def test_the_result_cache_answers_the_same_request_again_with_a_copy():
    model, tok = tiny.build("BertForSequenceClassification")

    class Models:
        def get(self, name):
            return model, tok

    results = ResultCache(size=2)
    first = explain_request(Models(), "m", "a gripping film", None, "normxlogit", results=results)
    again = explain_request(Models(), "m", "a gripping film", None, "normxlogit", results=results)
    assert again.steps[0] is first.steps[0] and again is not first and again.compare is not first.compare
    again.compare[0]["logat"] = "added by one visitor"
    assert "logat" not in explain_request(Models(), "m", "a gripping film", None, "normxlogit",
                                          results=results).compare[0]
    for text in ("one", "two", "three"):
        explain_request(Models(), "m", text, None, "normxlogit", results=results)
    assert results.get(("m", "a gripping film", None, "normxlogit", 8)) is None  # the oldest left (size 2)


def test_bad_settings_are_refused():
    with pytest.raises(normx.InvalidInputError, match="window_ms"):
        Batcher(window_ms=-1)
    with pytest.raises(normx.InvalidInputError, match="max_batch"):
        Batcher(max_batch=0)


def test_every_method_but_the_one_pass_ones_waits_for_the_expensive_lane():
    """While the expensive lane is busy, a one-pass request runs at once and a gradient request waits."""
    import threading

    from normx.serving.lanes import WorkGate
    from normx.serving.session import gated

    model, _ = tiny.build("BertForSequenceClassification")
    gate = WorkGate(1e9, heavy_slots=1)
    busy, release = threading.Event(), threading.Event()

    def hold():
        busy.set()
        release.wait(10)

    holder = threading.Thread(target=lambda: gated(gate, model, "integrated_gradients", 8, hold))
    holder.start()
    busy.wait(10)
    assert gated(gate, model, "normxlogit", 8, lambda: "at once") == "at once"
    waited = []
    waiter = threading.Thread(target=lambda: waited.append(gated(gate, model, "gradient_x_input", 8, lambda: "after")))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and not waited  # behind the expensive request, although its estimate is small
    release.set()
    holder.join(10)
    waiter.join(10)
    assert waited == ["after"]


def test_the_expensive_lane_runs_in_its_own_threads_below_the_server():
    """Expensive work runs in the lane's threads with the lane's torch threads, niced below the caller (Linux);
    cheap work runs in the caller's thread; errors and the budget reach the caller."""
    import os
    import sys
    import threading

    import torch

    from normx.serving.lanes import WorkGate, lower_thread_priority

    gate = WorkGate(1e6, heavy_threads=2, heavy_nice=5)
    linux = sys.platform.startswith("linux")

    def where():
        nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) if linux else None
        return threading.get_ident(), torch.get_num_threads(), nice

    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) if linux else None
    thread, torch_threads, nice = gate.run(1e3, where)  # over cheap_gflop: the lane
    assert thread != threading.get_ident() and torch_threads == 2
    if linux:
        assert nice == min(19, mine + 5)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine  # the caller's is untouched
    assert gate.run(1.0, where)[0] == threading.get_ident()  # cheap: at once, in the caller's thread
    assert gate.run(1.0, where, heavy=True)[0] == thread  # heavy whatever the estimate: the lane
    with pytest.raises(ZeroDivisionError):
        gate.run(1e3, lambda: 1 / 0)
    with pytest.raises(normx.WorkBudgetError, match="GFLOP"):
        gate.run(1e7, where)
    with pytest.raises(normx.InvalidInputError, match="heavy_nice"):
        WorkGate(1e6, heavy_nice=20)
    with pytest.raises(normx.InvalidInputError, match="lowered"):
        lower_thread_priority(-1)


def test_a_batch_does_not_wait_for_expensive_work_on_the_model():
    """A batch holds the model shared, like the expensive request running in the other lane: it runs meanwhile
    (the lane gives it the CPU by its lower priority, not by stopping)."""
    import threading

    from normx.core.concurrency import using

    model, tok = tiny.build("BertForSequenceClassification")
    batcher = Batcher(window_ms=1)
    holding, release = threading.Event(), threading.Event()

    def expensive():
        with using(model):  # a long stretch of work on the model, between two of its passes
            holding.set()
            release.wait(30)

    worker = threading.Thread(target=expensive)
    worker.start()
    try:
        holding.wait(10)
        with ThreadPoolExecutor(1) as pool:
            done = pool.submit(batcher.explain, model, tok, "a gripping film", tokens=5, method="normxlogit")
            assert done.result(timeout=30).tokens  # served while the expensive work still holds the model
        assert worker.is_alive()
    finally:
        release.set()
        worker.join(30)
