"""What explaining a whole generation costs: every step of NormXLogit (one forward pass over prompt + continuation)
against one plain forward pass of the model over the same sequence; the per-step gradient loop (Gradient×Input, one
backward pass per generated token, 8 prefixes a batch); Captum's ``LLMGradientAttribution`` (Gradient×Input at the
embedding layer) on the same model and text.

    python -m pytest bench/test_generation_bench.py --benchmark-enable -s

Timed on the offline SmolLM2-135M-Instruct (``smollm2``; 1 thread), a SST-2 review with an instruction and 32
generated tokens. With benchmarks disabled (the default test run) it runs once on a tiny Llama and checks the
results: NormXLogit's rows are ||x^0|| x the model's own logits, Captum attributes the same steps.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tiny
import torch
from generation_workload import NEW_TOKENS, PROMPT, SHORT
from timing import median_seconds

import normx


def _setup(enabled: bool):
    if enabled:
        try:
            model, tokenizer = normx.load_model("smollm2")
            return model, tokenizer, "SmolLM2-135M-Instruct"
        except normx.ModelLoadError:
            pass
    model, tokenizer = tiny.build("LlamaForCausalLM")
    return model, tokenizer, "tiny Llama"


FALLBACK = " and the story moves with care from one scene to the next, so that every actor has a moment to shine"


def text_continuation(tokenizer, ids: list[int]) -> list[int]:
    """The generated ids when they are text (decoding and encoding them again gives them back), else the first
    ``NEW_TOKENS`` tokens of an English continuation. Captum turns its target ids into its output tokens by decoding
    and encoding them again; a tiny random model writes lone bytes of multi-byte characters (decoded as U+FFFD,
    which encodes to three other ids), and Captum warned "input_ids[i] 176 != ids[idx] 233 ... Skipping this token"
    for each. The steps timed are the same count either way."""
    again = tokenizer(tokenizer.decode(ids), add_special_tokens=False)["input_ids"]
    if list(again) != list(ids):
        ids = tokenizer(FALLBACK, add_special_tokens=False)["input_ids"][:NEW_TOKENS]
        again = tokenizer(tokenizer.decode(ids), add_special_tokens=False)["input_ids"]
        assert list(again) == list(ids), "the fallback continuation does not decode and encode to itself"
    return list(ids)


def test_all_generation_steps_cost_about_one_forward_pass(benchmark):
    enabled = benchmark.enabled
    threads = torch.get_num_threads()
    if enabled:
        torch.set_num_threads(1)
    try:
        _run(benchmark, enabled)
    finally:
        torch.set_num_threads(threads)


def _run(benchmark, enabled: bool):
    model, tokenizer, name = _setup(enabled)
    prompt = PROMPT if name.startswith("SmolLM2") else SHORT
    generated = normx.explain_generation(model, tokenizer, prompt, max_new_tokens=NEW_TOKENS,
                                         gen_args={"min_new_tokens": NEW_TOKENS})
    continuation = text_continuation(tokenizer, generated.token_ids[generated.prompt_length:])
    assert len(continuation) == NEW_TOKENS
    ids = torch.tensor([generated.token_ids[:generated.prompt_length] + continuation])
    rounds = 7 if enabled else 1

    def forward():
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=torch.ones_like(ids))

    def all_steps():
        return normx.explain_generation(model, tokenizer, prompt, target=continuation)

    forward(), all_steps()  # warm-up
    plain = median_seconds(forward, rounds)
    benchmark.group = "generation: all steps"
    result = benchmark.pedantic(all_steps, rounds=rounds, iterations=1, warmup_rounds=0)
    one_pass = benchmark.stats.stats.median if enabled else median_seconds(all_steps, 1)

    # correct: every row is ||x_i^0|| x the model's own logit for the generated token
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    norms, logits = out.hidden_states[0][0].float().norm(dim=-1), out.logits[0].float()
    for t, p in enumerate(result.generated):
        want = (norms[:p] * logits[:p, result.token_ids[p]]).numpy()
        np.testing.assert_allclose(result.rows()[t], want, rtol=1e-3, atol=1e-3 * np.abs(want).max())

    loop_rounds = 2 if enabled else 1
    loop = median_seconds(lambda: normx.explain_generation(model, tokenizer, prompt, method="gradient_x_input",
                                                            target=continuation), loop_rounds)
    captum = _captum_seconds(model, tokenizer, prompt, continuation, result, loop_rounds)
    benchmark.extra_info.update(model=name, tokens=len(result.tokens), steps=NEW_TOKENS, forward_seconds=plain,
                                normxlogit_seconds=one_pass, normxlogit_ratio=one_pass / plain,
                                gradient_loop_seconds=loop, gradient_loop_ratio=loop / plain,
                                captum_seconds=captum, captum_ratio=None if captum is None else captum / plain)
    if enabled:
        print(f"\n{name}, {len(result.tokens)} tokens ({NEW_TOKENS} generated), 1 thread: plain forward "
              f"{plain * 1e3:.1f} ms; NormXLogit, all {NEW_TOKENS} steps {one_pass * 1e3:.1f} ms "
              f"({one_pass / plain:.2f}x); Gradient×Input per-step loop {loop:.2f} s ({loop / plain:.0f}x)"
              + ("" if captum is None else f"; Captum LLMGradientAttribution {captum:.2f} s ({captum / plain:.0f}x)"))
        assert one_pass <= 1.3 * plain, f"all steps cost {one_pass / plain:.2f}x one forward pass"


def _captum_seconds(model, tokenizer, text: str, continuation: list[int], result, rounds: int) -> float | None:
    """Captum's LLM wrapper (Gradient×Input at the embedding layer), one attribution per generated token; its
    result covers the same prompt tokens and steps."""
    try:
        from captum.attr import LayerGradientXActivation, LLMGradientAttribution, TextTokenInput
    except ImportError:
        pytest.skip("captum is not installed (pip install -e '.[bench]')")
    attribution = LLMGradientAttribution(LayerGradientXActivation(model, model.get_input_embeddings()), tokenizer)
    prompt = TextTokenInput(text, tokenizer)
    target = torch.tensor(continuation)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = attribution.attribute(prompt, target=target)
    skipped = [str(w.message) for w in caught if "Skipping this token" in str(w.message)]
    assert not skipped, f"Captum could not read {len(skipped)} target tokens back: {skipped[:2]}"
    assert tuple(out.token_attr.shape) == (NEW_TOKENS, result.prompt_length)  # one row per step, over the prompt
    return median_seconds(lambda: attribution.attribute(prompt, target=target), rounds)
