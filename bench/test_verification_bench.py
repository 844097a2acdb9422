"""What the first-use check costs (normx.core.verify): one probe forward pass of the model with its hidden states,
plus the head on the probe's last layer, once per model. Timed against the model's plain forward on the same probe.

    python -m pytest bench/test_verification_bench.py --benchmark-enable -s

With benchmarks disabled (the default test run) it checks the probe once on a tiny model and that the check runs
once per model.
"""

from __future__ import annotations

import tiny
import torch
from timing import median_seconds

import normx
from normx.core import verify


def _model(enabled: bool):
    if enabled:
        try:
            return normx.load_model("minilm-sst2")[0], "minilm-sst2"
        except normx.ModelLoadError:
            pass
    return tiny.build("LlamaForCausalLM")[0], "tiny Llama causal LM"


def test_first_use_check_costs_about_one_forward_pass(benchmark):
    model, name = _model(benchmark.enabled)
    adapter = normx.get_adapter(model)
    inputs = verify.probe_inputs(model)
    rounds = 20 if benchmark.enabled else 1

    def forward():
        with torch.no_grad():
            model(**inputs)

    forward()  # warm-up
    plain = median_seconds(forward, rounds)
    benchmark.group = "first-use check"
    benchmark.pedantic(verify.verify, args=(model, adapter), rounds=rounds, iterations=1, warmup_rounds=1)
    check = benchmark.stats.stats.median if benchmark.enabled else median_seconds(
        lambda: verify.verify(model, adapter), 1)
    benchmark.extra_info.update(model=name, forward_seconds=plain, check_seconds=check, ratio=check / plain)
    if benchmark.enabled:
        print(f"\nfirst-use check on {name}: {check * 1e3:.1f} ms, the plain forward on the same probe "
              f"{plain * 1e3:.1f} ms ({check / plain:.1f}x), once per model")
    assert normx.core.verify.verified_adapter(model) is adapter
