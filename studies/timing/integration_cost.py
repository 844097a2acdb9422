"""What normx's methods cost inside inseq (``normx.integrations.inseq``) and what ``Generation.to_captum()`` adds,
against one plain forward pass of the model over the same sequence.

    python -m studies.timing.integration_cost [--out FILE]   # SmolLM2-135M-Instruct (offline preset), 1 thread

The same prompt and 32 teacher-forced generated tokens as bench/test_generation_bench.py (64 tokens in all); inseq
is given the prompt and prompt + continuation as texts (it takes texts only), which read back to the same ids here
(checked, as is that inseq's rows equal ``explain_generation``'s). Each figure is the median of interleaved rounds:
before each round the plain forward pass is timed again, and the ratio is the median over rounds of (round / the
forward just before it). inseq's own ``attention`` (one eager pass with ``output_attentions``) is timed beside
normx's methods for reference.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch

import normx
from bench.generation_workload import NEW_TOKENS, PROMPT
from studies.settings import Printed, add_out_option
from studies.timing.generation_attention import interleaved, timed, timing_setup

ROUNDS = 9


def main() -> int:
    import inseq

    import normx.integrations.inseq as normx_inseq

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_out_option(parser)
    say = Printed(parser.parse_args().out)
    model, tokenizer, continuation, ids, forward = timing_setup()
    full = PROMPT + tokenizer.decode(continuation)
    plain = statistics.median(timed(forward) for _ in range(ROUNDS))
    say(f"SmolLM2-135M-Instruct, {ids.shape[1]} tokens ({NEW_TOKENS} generated), 1 thread, torch "
          f"{torch.__version__}, inseq 0.7.1\n")
    say("| what | time | × one plain forward pass (interleaved median) |\n|---|---|---|")
    say(f"| plain forward pass (`model(input_ids)`) | {plain * 1e3:.1f} ms | 1 |")

    def explain():
        return normx.explain_generation(model, tokenizer, PROMPT, target=continuation)

    row(say, "normx `explain_generation`, NormXLogit, all steps", explain, forward)
    g = explain()
    row(say, "`Generation.to_captum()` (given the Generation)", g.to_captum, forward)
    for name in ("normxlogit", "norm_attention"):
        wrapped = inseq.load_model(model, name, tokenizer=tokenizer)

        def attribute(wrapped=wrapped):
            return wrapped.attribute(PROMPT, full, show_progress=False)

        check(attribute(), normx.explain_generation(model, tokenizer, PROMPT, target=continuation,
                                                    method=normx_inseq.METHODS[name]))
        row(say, f"inseq `load_model(model, {name!r}).attribute(prompt, text)`, all steps", attribute, forward)
    wrapped = inseq.load_model(model, "attention", tokenizer=tokenizer)
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")  # inseq's attention reads output_attentions
    try:
        row(say, "inseq's own `attention` (reference), all steps",
            lambda: wrapped.attribute(PROMPT, full, show_progress=False), forward)
    finally:
        model.set_attn_implementation(before)
    say.save()
    return 0


def row(say: Printed, what: str, fn, forward) -> None:
    fn()  # warm-up
    seconds, ratio = interleaved(fn, forward, ROUNDS)
    shown = f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"
    say(f"| {what} | {shown} | {ratio:.2f} |")


def check(out, want) -> None:
    """inseq attributed the same ids and every step's row is ``explain_generation``'s."""
    attribution = out[0]
    assert [t.id for t in attribution.target] == want.token_ids, "inseq's text read back to other ids"
    matrix = attribution.target_attributions.float().numpy()
    worst = max(float(np.abs(matrix[:p, t] - r).max() / max(1.0, np.abs(r).max()))
                for t, (p, r) in enumerate(zip(want.generated, want.rows())))
    assert worst < 1e-4, worst


if __name__ == "__main__":
    raise SystemExit(main())
