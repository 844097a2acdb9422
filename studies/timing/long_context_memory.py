"""Peak memory of the attention readings (#45) and of the context methods (#56: ``budgeted``, ``contextcite``) on
long prompts against one plain forward pass: every step of a teacher-forced continuation explained, one method per
fresh process.

    python -m studies.timing.long_context_memory --out docs/results/generation/long_context_memory.md
    python -m studies.timing.long_context_memory --cases smollm2:4096 --methods forward norm_attention --out m.md
    python -m studies.timing.long_context_memory --cases tiny-llama:8192 tiny-llama:16384 tiny-llama:32768 \
        --methods budgeted contextcite --out m.md

A case is MODEL:TOKENS: ``smollm2`` (SmolLM2-135M-Instruct, the offline preset: Llama, 30 blocks, 9 heads, 3
key-value heads) or ``tiny-llama`` (a random Llama of 2 blocks, hidden 64, 4 heads, 2 key-value heads, 32,768
positions, on SmolLM2's tokenizer: vocabulary 49,152). The sequence is TOKENS ids of a repeated English paragraph:
a prompt of TOKENS - 32 tokens and the last 32 as the ``target=`` continuation of ``normx.explain_generation`` (all
32 steps explained; for a context method the prompt's sentences are its sources, as ``sources="auto"`` finds them).
``forward`` is the plain ``model(input_ids)`` on the same TOKENS ids, in no_grad.

Each (case, method) runs in a process of its own (1 thread, ``MALLOC_MMAP_THRESHOLD_=65536`` so freed tensors go
back to the system): load the model, make the ids, then measure the call: the peak resident set (Linux ``VmHWM``)
during it minus the resident set just before it, after ``gc`` and ``malloc_trim`` and a reset of the high-water mark
(:func:`studies.timing.peer_cost.peak_mib`): the working memory the call adds on top of the loaded model. The first
call is measured (its one-time allocations included), as a user's first call meets them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from studies.settings import Printed, add_out_option

STEPS = 32
CASES = ("smollm2:4096", "tiny-llama:16384")
METHODS = ("forward", "attention", "norm_attention", "alti_logit")
PARAGRAPH = ("The river town wakes before the sun. Fishermen check their nets, bakers pull the first loaves from "
             "stone ovens, and the ferry's bell carries across the water while the mist still hangs low. By noon "
             "the market is loud with traders from the hills, selling wool, honey and dried apricots, and children "
             "run between the stalls. In the evening the lamps are lit one by one along the quay. ")


def load(name: str):
    import torch
    import transformers

    import normx

    transformers.utils.logging.set_verbosity_error()
    model, tokenizer = normx.load_model("smollm2")
    if name == "smollm2":
        return model.eval(), tokenizer
    if name != "tiny-llama":
        raise SystemExit(f"unknown model {name!r}: smollm2 or tiny-llama")
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                                      max_position_embeddings=32768, bos_token_id=tokenizer.bos_token_id,
                                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    tiny = transformers.LlamaForCausalLM(config).eval()
    tokenizer.model_max_length = 32768
    return tiny, tokenizer


def sequence(tokenizer, tokens: int) -> tuple[str, list[int], list[int]]:
    """(prompt text, its ids, the 32 target ids): the prompt re-encodes to exactly its ids."""
    ids = tokenizer(PARAGRAPH * (tokens // 60 + 2), add_special_tokens=False)["input_ids"]
    cut = tokens - STEPS
    while True:
        prompt = tokenizer.decode(ids[:cut])
        again = tokenizer(prompt)["input_ids"]
        if len(again) == tokens - STEPS:
            return prompt, again, ids[cut:cut + STEPS]
        cut += (tokens - STEPS) - len(again)


def worker(model_name: str, tokens: int, method: str) -> dict:
    import torch

    import normx
    from studies.timing.peer_cost import peak_mib

    model, tokenizer = load(model_name)
    prompt, prompt_ids, target = sequence(tokenizer, tokens)
    ids = torch.tensor([prompt_ids + target])

    def call():
        if method == "forward":
            with torch.no_grad():
                return model(input_ids=ids)
        return normx.explain_generation(model, tokenizer, prompt, method=method, target=target)

    start = time.perf_counter()
    mib = peak_mib(call)
    return {"model": model_name, "tokens": int(ids.shape[1]), "method": method, "peak_mib": round(mib, 1),
            "seconds": round(time.perf_counter() - start, 1)}


def run_case(case: str, method: str) -> dict:
    name, tokens = case.split(":")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536")
    done = subprocess.run([sys.executable, "-m", "studies.timing.long_context_memory", "--worker", name, tokens,
                           method], env=env, capture_output=True, text=True)
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"model": name, "tokens": int(tokens), "method": method, "error": f"exit {done.returncode}: {tail[0]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    forward = {(r["model"], r["tokens"]): r.get("peak_mib") for r in rows if r["method"] == "forward"}
    lines = ["| model | tokens | method | peak growth (MiB) | x plain forward | seconds |", "|---|---|---|---|---|---|"]
    for r in rows:
        plain = forward.get((r["model"], r["tokens"]))
        if "error" in r:
            lines.append(f"| {r['model']} | {r['tokens']:,} | {r['method']} | {r['error']} | | |")
            continue
        ratio = f"{r['peak_mib'] / plain:.2f}" if plain else ""
        lines.append(f"| {r['model']} | {r['tokens']:,} | {r['method']} | {r['peak_mib']:,.0f} | {ratio} | "
                     f"{r['seconds']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), help="MODEL:TOKENS (default: %(default)s)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), help="default: %(default)s")
    parser.add_argument("--worker", nargs=3, metavar=("MODEL", "TOKENS", "METHOD"), help=argparse.SUPPRESS)
    add_out_option(parser)
    args = parser.parse_args(argv)
    if args.worker:
        name, tokens, method = args.worker
        print(json.dumps(worker(name, int(tokens), method)))
        return
    rows = []
    for case in args.cases:
        for method in args.methods:
            rows.append(run_case(case, method))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    out = Printed(args.out)
    out(table(rows))
    out()
    out("rows: " + json.dumps(rows))
    out.save()


if __name__ == "__main__":
    main()
