"""What the one-pass readings cost beside the model's own forward pass where the forward is fast: a CPU stand-in for
a card (issue #55). On a GPU a forward over a long prompt takes milliseconds, so whatever normx does on the host
beside it (token spans, per-step loops, model checks) shows as a multiple of the forward; on the CPU with seeded
tiny models and one thread the forward takes milliseconds too, so the same overhead shows here, without a GPU.

    python -m pytest bench/test_host_overhead.py --benchmark-enable -s

Cases: batch-1 classification (the tests' tiny BERT, a 40-token text: ``normx.explain`` against
``model(**tokenizer(text, return_tensors="pt"))``) and all 32 steps of a continuation (a tiny Llama, 2 blocks of
width 32, 4 heads, the tests' byte-level BPE tokenizer; 2,048 and 8,192 tokens: ``normx.explain_generation(model,
tokenizer, prompt, method=..., target=continuation)`` against the model's own forward on the same ids with the
logits the explained tokens need, ``model(input_ids=ids, logits_to_keep=33)``). The two alternate (bench/timing.py);
``extra_info["ratio_to_forward"]`` is the median ratio, ``tokenize_s`` what tokenising the prompt alone takes (a part
of every call the forward on given ids does not have).

With benchmarks disabled (the default test run) each reading runs once at 256 tokens and 8 steps and its rows are
checked: NormXLogit's are ||x_i^0|| times the model's own logit of the step's token at every position before it,
attention's rows sum to one over the keys, norm-based attention's are positive where the rows are.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from standin import CLASSIFICATION_TOKENS, STEPS, byte_tokenizer, classifier, llama, sequence
from timing import timed_rounds
from workloads import device_name

import normx

GENERATION = {2048: ("normxlogit", "attention", "norm_attention"), 8192: ("normxlogit", "attention", "norm_attention")}
SMOKE_LENGTH, SMOKE_STEPS = 256, 8
ROUNDS, MIN_TIME, MAX_ROUNDS = 7, 8.0, 60


def _check(generation, model, ids: list[int], method: str) -> None:
    rows = generation.rows()
    if method == "normxlogit":
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        norms = out.hidden_states[0][0].norm(dim=-1).numpy()
        logits = out.logits[0].numpy()  # the model's own logits at every position
        for t, p in enumerate(generation.generated):
            want = norms[:p] * logits[:p, ids[p]]
            np.testing.assert_allclose(rows[t], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    elif method == "attention":
        for row in rows:
            np.testing.assert_allclose(row.sum(), 1.0, rtol=1e-4)
    else:
        assert all(np.isfinite(row).all() and (row >= 0).all() and row.max() > 0 for row in rows)


def _cases(enabled: bool):
    lengths = GENERATION if enabled else {SMOKE_LENGTH: GENERATION[2048]}
    return [(length, method) for length, methods in lengths.items() for method in methods]


@pytest.mark.parametrize(("length", "method"), _cases(True), ids=lambda v: str(v))
def test_generation_beside_its_forward(benchmark, length, method):
    enabled = benchmark.enabled
    if not enabled and length != 2048:
        pytest.skip("timed runs only (--benchmark-enable); the smoke run checks the 2,048 row's readings")
    steps = STEPS if enabled else SMOKE_STEPS
    length = length if enabled else SMOKE_LENGTH
    with _one_thread():
        result, baseline, model, made, prompt, ids = _timed_generation(benchmark, length, steps, method)
        _check(result, model, ids, method)
        start = time.perf_counter()
        made(prompt)
        _record(benchmark, baseline, level="host_overhead", case="generation", model="tiny Llama", method=method,
                tokens=len(ids), steps=steps, tokenize_s=time.perf_counter() - start)


@contextmanager
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _timed_generation(benchmark, length: int, steps: int, method: str) -> tuple:
    """(the explanation, the forward's timings, the tiny Llama, its tokenizer, the prompt, the prompt's ids and the
    continuation's): ``method`` explaining the last ``steps`` of ``length`` tokens, timed alternately with the model's
    own forward over them with the logits those steps need."""
    made = byte_tokenizer(length)
    model = llama(made, length)
    prompt, prompt_ids, continuation = sequence(made, length, steps)
    ids = torch.tensor([prompt_ids + continuation])

    def forward():
        with torch.no_grad():
            model(input_ids=ids, logits_to_keep=steps + 1)

    def explain():
        return normx.explain_generation(model, made, prompt, method=method, target=continuation)

    result, baseline, _ = timed_rounds(benchmark, explain, forward, torch.device("cpu"), ROUNDS, min_time=MIN_TIME,
                                       max_rounds=MAX_ROUNDS)
    return result, baseline, model, made, prompt, prompt_ids + continuation


BUDGETED = (320, 2048)  # budgeted's timed lengths: a short prompt, where its plan on the host weighs most, and a long


@pytest.mark.parametrize("length", BUDGETED, ids=str)
def test_budgeted_beside_its_forward(benchmark, length):
    """``budgeted`` at its default budget (6 forward passes, counted as work) beside the model's own forward: what
    its plan and its masked passes cost on the host where a forward takes milliseconds. Checked: the passes it
    counted are within the budget, and its scores are the surrogate of the masks it records."""
    from normx.methods.ablation.budgeted import surrogate

    if not benchmark.enabled and length != BUDGETED[0]:
        pytest.skip("timed runs only (--benchmark-enable); the smoke run checks the first length's scores")
    steps = STEPS if benchmark.enabled else SMOKE_STEPS
    with _one_thread():
        result, baseline, _, _, _, ids = _timed_generation(benchmark, length, steps, "budgeted")
        settings = result.settings
        assert settings["passes"] <= 6 and settings["masks"] == len(settings["design"]) - 1
        spans = settings["source_spans"]
        members = [list(range(a, b)) for a, b in spans]
        if "groups" in settings:
            members = [[i for j in group for i in members[j]] for group in settings["groups"]]
        rows = result.rows()  # (each step's row over the tokens before it: every one reads the prompt)
        got = np.array([sum(float(row[m].sum()) for row in rows) for m in members])
        want = surrogate(np.array(settings["design"], bool), np.array(settings["outcomes"]))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
        _record(benchmark, baseline, level="host_overhead", case="generation", model="tiny Llama", method="budgeted",
                tokens=len(ids), steps=steps, masks=settings["masks"], passes=settings["passes"])


def test_classification_beside_its_forward(benchmark):
    with _one_thread():
        model, tokenizer, text = classifier()

        def forward():
            with torch.no_grad():
                model(**tokenizer(text, return_tensors="pt"))

        def explain():
            return normx.explain(model, tokenizer, text)

        result, baseline, _ = timed_rounds(benchmark, explain, forward, torch.device("cpu"), ROUNDS * 4,
                                           min_time=MIN_TIME / 2, max_rounds=MAX_ROUNDS * 10)
        inputs = tokenizer(text, return_tensors="pt")
        assert len(result.tokens) == inputs["input_ids"].shape[1] == CLASSIFICATION_TOKENS
        with torch.no_grad():
            out = model(**inputs, output_hidden_states=True)
            label = int(out.logits[0].argmax())
            every = out.hidden_states[-1][0][:, None]  # each token as the pooled one
            want = out.hidden_states[0][0].norm(dim=-1) * model.classifier(model.bert.pooler(every))[:, label]
        want = want.numpy()
        np.testing.assert_allclose(result.score, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        _record(benchmark, baseline, level="host_overhead", case="classification", model="tiny BERT",
                method="normxlogit",
                tokens=CLASSIFICATION_TOKENS, steps=0)


def _record(benchmark, baseline: list[float], **info) -> None:
    benchmark.extra_info.update(info, device=device_name(torch.device("cpu")), threads=1, dtype="float32",
                                timer=getattr(getattr(benchmark, "_timer", None), "__name__", "perf_counter"))
    if not benchmark.enabled:
        return
    times = list(benchmark.stats.stats.data)
    benchmark.extra_info["per_instance_s"] = float(np.median(times))
    benchmark.extra_info["forward_per_instance_s"] = float(np.median(baseline))
    benchmark.extra_info["ratio_to_forward"] = float(np.median([t / f for t, f in zip(times, baseline)]))
