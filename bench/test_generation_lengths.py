"""Explaining a whole generation across prompt lengths (issue #45): per method and length, the time per instance,
the peak memory and the max batch under a memory budget, each beside the plain forward ``model(input_ids)`` on the
same ids; and a long-context row on a tiny random Llama with 32,768 positions, whose memory at 8k, 16k and 32k
tokens must grow linearly.

    python -m pytest bench/test_generation_lengths.py -m "not slow or slow" --benchmark-enable \
        --bench-threads 1 --benchmark-timer time.process_time --benchmark-json=.benchmarks/generation.json

Every case runs in a fresh process (bench/length_worker.py): its figures are in each benchmark's ``extra_info``
(``level`` "generation" or "long_context"); pytest-benchmark's own statistics of these entries are not the
figures (they time the worker call from this process). bench/report.py makes the tables from the JSON.

With benchmarks disabled (the default test run) the same path runs on a tiny Llama at 64 and 128 tokens (the
long-context row at 256, 512 and 1,024), every result is checked, and the all-steps rows of each method equal its
rows when each step is explained alone.
"""

from __future__ import annotations

import length_worker
import numpy as np
import pytest
import torch
from generation_lengths import GROWTH_LIMIT, LINEAR, STEPS, GenerationWorkload, check_rows
from generation_lengths import single_step_reference as reference
from generation_options import GIB, GenCase, generation_budget, generation_cases

SHORT = STEPS + 32  # the reference check's sequence: 32 prompt tokens, STEPS explained


def _worker(settings, model: str, methods: list[str], lengths: list[int], cap: int | None = None) -> dict:
    return length_worker.run(model, methods, lengths, budget=settings.budget,
                             cap=settings.cap if cap is None else cap, rounds=settings.rounds,
                             round_seconds=settings.round_seconds, search_seconds=settings.search_seconds,
                             device=settings.device, dtype=settings.dtype, threads=settings.threads,
                             timer=settings.timer)


@pytest.fixture(scope="session")
def gen_measure(gen_settings, request):
    """``measure(case) -> figures``: with benchmarks enabled one fresh process per case; in the smoke run one
    process for every case of the model, on first request."""
    done: dict[tuple[str, str, int], dict] = {}

    def measure(case: GenCase) -> dict:
        key = (case.model, case.method, case.length)
        if key not in done:
            if gen_settings.enabled:
                cases = [case]
            else:
                cases = [c for c in generation_cases(request.config, False) if c.model == case.model]
            methods = list(dict.fromkeys(c.method for c in cases))
            lengths = sorted({c.length for c in cases})
            out = _worker(gen_settings, case.model, methods, lengths)
            for method, by_length in out.items():
                for length, figures in by_length.items():
                    done[(case.model, method, int(length))] = figures
        return done[key]

    return measure


def _check_against_single_steps(model: str, method: str, device: str, dtype: str) -> None:
    """On a short sequence, the method's rows of all steps at once equal its rows of each step explained alone
    (first, middle and last step); the forward's logits are finite."""
    work = GenerationWorkload(model, method, SHORT, 1, device, dtype)
    result = work.attribute()
    check_rows(work, result)
    if method == "forward":
        return
    rows = result[0].rows()
    for t, want in reference(work, (0, STEPS // 2, STEPS - 1)).items():
        scale = float(np.abs(want).max()) or 1.0
        np.testing.assert_allclose(rows[t], want, rtol=1e-4, atol=1e-4 * scale, err_msg=f"{method}, step {t}")


def test_generation_length(benchmark, generation_case, gen_settings, gen_measure):
    case, s = generation_case, gen_settings
    threads = torch.get_num_threads()
    if s.threads:
        torch.set_num_threads(s.threads)
    try:
        _check_against_single_steps(case.model, case.method, s.device, s.dtype)
    finally:
        torch.set_num_threads(threads)
    benchmark.group = f"generation: {case.model}, {case.length} tokens"
    figures = benchmark.pedantic(gen_measure, args=(case,), rounds=1, iterations=1, warmup_rounds=0)
    assert figures["forward_peak_bytes"] is not None and figures["forward_peak_bytes"] > 0
    if not figures["out_of_memory"]:
        assert all(t > 0 for t in figures["seconds"]) and figures["peak_bytes"] > 0
    if "max_batch" in figures:
        trials = {int(b): p for b, p in figures["trials"].items()}
        for batch, peak in trials.items():  # every batch up to the answer fits, every larger one does not
            fits = peak is not None and peak <= figures["budget_bytes"]
            assert fits == (batch <= figures["max_batch"]), (batch, peak, figures)
    benchmark.extra_info.update(level="generation", model=case.model, method=case.method, L=case.length,
                                steps=STEPS, batch=1, device=_device(s), dtype=s.dtype, timer=s.timer,
                                threads=s.threads or torch.get_num_threads(), **figures)


def test_long_context_memory_grows_linearly(benchmark, long_methods, gen_settings):
    """Peak memory of the linear methods (and the forward) on the tiny long Llama at 8k, 16k and 32k tokens (smoke
    run: 256, 512, 1,024): the longest over the one before it at most GROWTH_LIMIT (2 for linear growth, plus
    slack for fixed costs; quadratic attention scores would give ~4)."""
    s = gen_settings
    lengths = list(s.long_lengths)

    def measure() -> dict:
        if not s.enabled:
            return _worker(s, "tiny-long-llama", list(long_methods), lengths, cap=1)
        out = {m: {} for m in long_methods}  # a fresh process for each method and length
        for method in long_methods:
            for length in lengths:
                out[method].update(_worker(s, "tiny-long-llama", [method], [length], cap=1)[method])
        return out

    benchmark.group = "generation: long context"
    out = benchmark.pedantic(measure, rounds=1, iterations=1, warmup_rounds=0)
    growth = {}
    for method, by_length in out.items():
        peaks = [by_length[str(length)]["peak_bytes"] for length in lengths]
        forward = [by_length[str(length)]["forward_peak_bytes"] for length in lengths]
        growth[method] = peaks[-1] / peaks[-2]
        growth.setdefault("forward", forward[-1] / forward[-2])
    benchmark.extra_info.update(level="long_context", model="tiny-long-llama", methods=list(long_methods),
                                lengths=lengths, steps=STEPS, device=_device(s), dtype=s.dtype, timer=s.timer,
                                threads=s.threads or torch.get_num_threads(), figures=out, growth=growth)
    for method, ratio in growth.items():
        if method in LINEAR:
            assert ratio < GROWTH_LIMIT, (f"{method}: peak memory at {lengths[-1]} tokens is {ratio:.2f}x that at "
                                          f"{lengths[-2]} (linear: 2)")


def _device(s) -> str:
    from workloads import device_name

    return device_name(torch.device(s.device))


def test_smollm2_random_is_the_folders_config_and_tokenizer_with_seeded_weights(tmp_path):
    """smollm2-random reads only the config and tokenizer of its folder ($NORMX_BENCH_SMOLLM2_DIR on a machine
    without the preset; here a folder with no weights); its weights are drawn from a fixed seed, so two loads are
    the same model."""
    import tiny
    import transformers
    from generation_lengths import smollm2_random

    tokenizer = tiny.bpe_tokenizer("llama")
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                                      max_position_embeddings=128, tie_word_embeddings=True)
    config.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert not list(tmp_path.glob("*.safetensors")) and not list(tmp_path.glob("*.bin"))
    model, loaded = smollm2_random(tmp_path)
    again, _ = smollm2_random(tmp_path)
    assert type(model).__name__ == "LlamaForCausalLM" and not model.training
    shape = (model.config.num_hidden_layers, model.config.hidden_size, model.config.vocab_size)
    assert shape == (3, 32, len(tokenizer))
    assert loaded("the film was good")["input_ids"] == tokenizer("the film was good")["input_ids"]
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
    ids = torch.tensor([loaded("the film was good")["input_ids"]])
    assert torch.isfinite(model(input_ids=ids).logits).all()


# ---- the budget (the CUDA branch's rule, without a GPU) and the worker's search rule -----------------------------

@pytest.mark.parametrize(("device", "budget_gb", "memory", "expected"), [
    ("cuda", None, 80 * GIB, 48 * GIB),  # an 80 GB card: the design card's 48 GB
    ("cuda", None, 24 * GIB, 24 * GIB),  # a smaller card: all of it
    ("cuda", 10.0, 80 * GIB, 10 * GIB),  # as given
    ("cpu", None, None, 4 * GIB),  # CPU_BUDGET_GB of working memory
    ("cpu", 0.5, None, GIB // 2),
])
def test_generation_budget(device, budget_gb, memory, expected):
    assert generation_budget(device, budget_gb, memory) == expected


def test_generation_budget_refuses_nonsense():
    with pytest.raises(pytest.UsageError, match="must be positive"):
        generation_budget("cpu", 0.0)
    with pytest.raises(ValueError, match="device's memory"):
        generation_budget("cuda", None, None)


def test_worker_searches_only_where_a_round_is_cheap():
    """In this process (no allocator settings): a search where the round took under the limit, 'search_skipped'
    where it took over it; the trials and the per-instance times of the batches tried."""
    length_worker.warm_up("tiny-llama", ["normxlogit"], "cpu", "float32")
    kwargs = dict(rounds=2, round_seconds=60.0, budget=GIB, cap=2, timer="perf_counter")
    searched = length_worker.measure_case("tiny-llama", "normxlogit", SHORT, **kwargs)
    assert searched["max_batch"] == 2 and set(searched["trials"]) == {"1", "2"}
    assert set(searched["batch_seconds"]) == {"1", "2"} and len(searched["seconds"]) == 2
    assert searched["ratio_to_forward"] > 0 and searched["peak_bytes"] > 0
    skipped = length_worker.measure_case("tiny-llama", "normxlogit", SHORT, search_seconds=0.0, **kwargs)
    assert "max_batch" not in skipped and skipped["search_skipped"].startswith("a batch-1 round took")


class _Options:
    """A stand-in for pytest's config: the options given, None for the others."""

    def __init__(self, **given):
        self.given = given

    def getoption(self, name, default=None):
        return self.given.get(name, default)


def test_default_cpu_grid_leaves_out_the_slowest_lengths():
    planned = {(c.method, c.length) for c in generation_cases(_Options(bench_device="cpu", bench_grid="default"), True)}
    assert ("gradient_x_input", 512) in planned and ("gradient_x_input", 2048) not in planned
    assert ("alti_logit", 2048) in planned and ("alti_logit", 8192) not in planned
    assert ("normxlogit", 8192) in planned and ("forward", 8192) in planned
    full = {(c.method, c.length) for c in generation_cases(_Options(bench_device="cpu", bench_grid="full"), True)}
    given = generation_cases(_Options(bench_device="cpu", bench_grid="default", gen_lengths="2048"), True)
    assert ("attnlrp", 8192) in full and {c.length for c in given} == {2048} and len(given) == 8
