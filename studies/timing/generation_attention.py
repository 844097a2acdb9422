"""What every generation step of the decoder attention methods costs against one plain forward pass of the model over
the same sequence: ``attention`` and ``norm_attention`` read all steps from one eager-attention pass
(``Method.query_rows``), NormXLogit from one pass; for comparison, norm-based attention run once per step on each
prefix (the same method without its one-pass reading, 8 prefixes a batch, as the per-step methods run).

    python -m studies.timing.generation_attention   # SmolLM2-135M-Instruct (offline preset), 1 thread
    python -m studies.timing.generation_attention alti_logit decompx   # only these methods (5 rounds each)
    python -m studies.timing.generation_attention --out timing.md      # the table also written there

The same prompt and 32 teacher-forced generated tokens as bench/test_generation_bench.py (64 tokens in all;
bench/generation_workload.py). Each
figure is the median of interleaved rounds: before each round of a method the plain forward pass is timed again,
and the ratio is the median over rounds of (method round / the forward just before it).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

import normx
from bench.generation_workload import NEW_TOKENS, PROMPT
from normx.methods import get_method, register_method
from studies.settings import Printed, add_out_option

ROUNDS = {"normxlogit": 9, "attention": 9, "norm_attention": 9, "norm_attention_per_step": 3}


def interleaved(fn, baseline, rounds: int) -> tuple[float, float]:
    """(median seconds of ``fn``, median of fn / the baseline run just before it) over ``rounds``."""
    times, ratios = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        baseline()
        plain = time.perf_counter() - start
        start = time.perf_counter()
        fn()
        took = time.perf_counter() - start
        times.append(took)
        ratios.append(took / plain)
    return statistics.median(times), statistics.median(ratios)


def timing_setup():
    """SmolLM2 with one torch thread, the timed sequence (PROMPT and NEW_TOKENS greedy tokens) and a warmed-up plain
    forward pass over it: ``(model, tokenizer, continuation ids, input ids [1, T], forward)``, shared by the timing
    scripts so that every ratio is against the same forward pass."""
    torch.set_num_threads(1)
    model, tokenizer = normx.load_model("smollm2")
    generated = normx.explain_generation(model, tokenizer, PROMPT, max_new_tokens=NEW_TOKENS,
                                         gen_args={"min_new_tokens": NEW_TOKENS})
    ids = torch.tensor([generated.token_ids])

    def forward():
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=torch.ones_like(ids))

    forward()
    return model, tokenizer, generated.token_ids[generated.prompt_length:], ids, forward


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("methods", nargs="*", help="only these methods (5 rounds each)")
    add_out_option(parser)
    args = parser.parse_args()
    say = Printed(args.out)
    model, tokenizer, continuation, ids, forward = timing_setup()
    register_method(dataclasses.replace(get_method("norm_attention"), name="norm_attention_per_step",
                                        display="", query_rows=None))
    plain = statistics.median(timed(forward) for _ in range(9))
    say(f"SmolLM2-135M-Instruct, {ids.shape[1]} tokens ({NEW_TOKENS} generated), 1 thread, {torch.__version__}\n")
    say("| what | time | × one plain forward pass (interleaved median) |\n|---|---|---|")
    say(f"| plain forward pass (`model(input_ids)`) | {plain * 1e3:.1f} ms | 1 |")
    chosen = {name: 5 for name in args.methods} or ROUNDS
    for method, rounds in chosen.items():
        def all_steps(method=method):
            return normx.explain_generation(model, tokenizer, PROMPT, method=method, target=continuation)

        all_steps()  # warm-up
        seconds, ratio = interleaved(all_steps, forward, rounds)
        shown = f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"
        say(f"| {method}, all {NEW_TOKENS} steps | {shown} | {ratio:.2f} |")
    say.save()
    return 0


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    raise SystemExit(main())
