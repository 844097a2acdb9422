"""A 7B-class decoder on a lent card (issue #55): time, peak memory and where each method runs out of memory, at
2,048 / 8,192 / 32,768 tokens, as one short prepared run for the minutes a card is lent.

The model: Mistral-7B's architecture (32 blocks of width 4,096, 32 query and 8 key-value heads, an MLP of 14,336,
rotary positions, no sliding window so that its cache is plain) with seeded random weights in bfloat16, made on the
device (what a call costs does not depend on the weights' values), and SmolLM2's tokenizer (offline; its 49,152
tokens are the model's vocabulary). The sequence: a repeated English paragraph, the prompt then the last 32 tokens
as the ``target=`` continuation, every step explained: ``normx.explain_generation(model, tokenizer, prompt,
method=..., target=...)``; ``forward`` is the model's own ``model(input_ids=ids, logits_to_keep=33)``.
``calibrated_attention`` reads the families SmolLM2's shipped weights read (tokens, presence, response_norm), with
weights made for this model and written to a temporary file (timing only); ``contextcite@32`` is normx's
``contextcite`` with 32 ablations.

Each case runs once after a warm-up call at the first length (the first call's one-time work: kernels, checks); its
time is wall time with the device synchronised, its memory the device's peak allocation during the call above what
was allocated before it. A case that runs out of memory is recorded ``"out of memory"``; one that would not finish
within ``--budget`` seconds of the run (its forward's time times its passes) is recorded ``"skipped"``, so that the
run ends inside the lease. The JSON records the card, driver, versions and the command.

    python -m studies.timing.card_decoder --device cuda --out card-decoder.json
    python -m studies.timing.card_decoder --model tiny --device cpu --dtype float32 --lengths 256 512 --out x.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from studies.settings import provenance
from studies.timing.long_context_memory import STEPS, sequence

LENGTHS = (2048, 8192, 32768)
METHODS = ("forward", "normxlogit", "norm_attention", "calibrated_attention", "contextcite@32", "gradient_x_input")
PASSES = {"forward": 1, "normxlogit": 1.1, "norm_attention": 1.3, "calibrated_attention": 2, "contextcite@32": 33,
          "gradient_x_input": 3}  # a case's expected cost in forwards, to skip what the budget cannot finish
SHAPES = {  # Mistral-7B-v0.1's architecture; "tiny": the same layout, small, for a dry run on the CPU
    "mistral-7b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 8},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2},
}


def build(shape: str, device: str, dtype: str, longest: int):
    """(model, tokenizer): the architecture ``shape`` with seeded random weights, made on ``device`` in ``dtype``."""
    import torch
    import transformers

    import normx

    transformers.utils.logging.set_verbosity_error()
    _, tokenizer = normx.load_model("smollm2")
    tokenizer.model_max_length = longest + 64
    config = transformers.MistralConfig(vocab_size=len(tokenizer), max_position_embeddings=longest + 64,
                                        sliding_window=None, bos_token_id=tokenizer.bos_token_id,
                                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                        **SHAPES[shape])
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        with torch.device(device):
            model = transformers.MistralForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    return model, tokenizer


def calls(model, tokenizer, prompt: str, target: list[int], weights: str) -> dict:
    """Each method's call on the sequence."""
    import torch

    import normx

    ids = torch.tensor([tokenizer(prompt)["input_ids"] + target], device=next(model.parameters()).device)

    def forward():
        with torch.no_grad():
            model(input_ids=ids, logits_to_keep=STEPS + 1)

    def explained(method: str, **options):
        return lambda: normx.explain_generation(model, tokenizer, prompt, method=method, target=target, **options)

    return {"forward": forward, "normxlogit": explained("normxlogit"), "norm_attention": explained("norm_attention"),
            "calibrated_attention": explained("calibrated_attention", weights=weights),
            "contextcite@32": explained("contextcite", n_ablations=32),
            "gradient_x_input": explained("gradient_x_input")}


def measure(call, device: str) -> dict:
    """One call's wall time (the device synchronised) and peak memory above what was allocated before it."""
    import gc

    import torch

    cuda = device.startswith("cuda")
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    started = time.perf_counter()
    try:
        call()
        if cuda:
            torch.cuda.synchronize()
    except torch.OutOfMemoryError:
        return {"status": "out of memory", "seconds": time.perf_counter() - started}
    took = time.perf_counter() - started
    peak = (torch.cuda.max_memory_allocated() - before) / 2**20 if cuda else None
    return {"status": "ran", "seconds": took, "peak_mib": peak}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.timing.card_decoder",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=tuple(SHAPES), default="mistral-7b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--budget", type=float, default=420.0, help="seconds the whole run may take")
    parser.add_argument("--out", type=Path, required=True, help="the JSON to write")
    args = parser.parse_args(argv)

    import numpy as np
    import torch
    import transformers

    from normx.methods.calibrated import weights as stored
    from normx.methods.calibrated.readings import shape
    from normx.models import get_adapter
    from normx.models.identity import model_identity

    started = time.perf_counter()
    model, tokenizer = build(args.model, args.device, args.dtype, max(args.lengths))
    families = ("tokens", "presence", "response_norm")
    record = stored.make_record("calibrated_attention", model_identity(model), families,
                                {family: np.ones((1, 1)) for family in families}, shape(model, get_adapter(model)),
                                0.1, "logprob", 0.5, {"contexts": 0, "what": "timing only"})
    weights = str(stored.write(record, Path(tempfile.mkdtemp()) / "weights.json"))
    device = {"name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
              "driver": _driver() if args.device.startswith("cuda") else None}
    given = argv if argv is not None else sys.argv[1:]
    out = {"command": " ".join(["python -m studies.timing.card_decoder", *given]),
           "device": device, "torch": torch.__version__, "transformers": transformers.__version__,
           "model": {"architecture": "MistralForCausalLM", "shape": SHAPES[args.model], "dtype": args.dtype,
                     "parameters": sum(p.numel() for p in model.parameters()), "weights": "random, seed 0"},
           "build_seconds": time.perf_counter() - started, **provenance(), "cases": []}
    for index, length in enumerate(args.lengths):
        prompt, _, target = sequence(tokenizer, length)  # (long_context_memory's: the same paragraph)
        run = calls(model, tokenizer, prompt, target, weights)
        if index == 0:  # the first call's one-time work, not timed
            for method in args.methods:
                measure(run[method], args.device)
        forward = None
        for method in args.methods:
            left = args.budget - (time.perf_counter() - started)
            if forward is not None and forward * PASSES[method] > left:
                case = {"status": "skipped", "why": f"about {forward * PASSES[method]:.0f} s, {left:.0f} s left"}
            else:
                case = measure(run[method], args.device)
            if method == "forward" and case["status"] == "ran":
                forward = case["seconds"]
            if forward and case["status"] == "ran":
                case["ratio_to_forward"] = case["seconds"] / forward
            out["cases"].append({"tokens": length, "method": method, **case})
            print(json.dumps(out["cases"][-1]), flush=True)
    out["run_seconds"] = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


def _driver() -> str | None:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


if __name__ == "__main__":
    raise SystemExit(main())
