"""Faithfulness for generation on a fixed prompt set with the offline SmolLM2 (docs/generation.md):

- 16 SST-2 dev reviews (the first with 8 to 25 words, in file order), each as
  ``"Review: {sentence}\\nIs this review positive or negative? Answer:"``;
- the BLiMP prefixes (``one_prefix_prefix``: the sentence up to the word that decides its grammaticality), the
  first two of each shared BLiMP file that has them, in file-name order (12 from the 6 files that have them).

Greedy generation of 6 tokens after each prompt; every step explained by NormXLogit, Gradient×Input, Integrated
Gradients (16 steps), attention weights (mean over heads and blocks), norm-based attention (summed over blocks),
the recency baseline (later tokens first) and random; per step the top-K % of the tokens before the generated one
deleted (and only them kept), the drop in the generated token's probability, AOPC over K = 10 ... 90 %
(:func:`normx.evaluation.generation.generation_faithfulness`).

    python -m studies.generation.faithfulness --data DIR   # (or $NORMX_DATA) writes --out, default
                                                           # docs/results/generation/report.json
    python -m studies.generation.faithfulness --methods decompx   # scores only these, merged into the report
                                                                  # (replacing their entries)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import normx
from normx.data import glue
from normx.evaluation.generation import DEFAULT_METHODS, generation_faithfulness
from studies.settings import GENERATION_RESULTS, INSTRUCTION, add_data_option, data_folder

# normxlogit, gradient_x_input, integrated_gradients, attention, norm_attention, recency, random
METHODS = DEFAULT_METHODS


def prompts(data: Path) -> list[str]:
    reviews = [e.text.strip() for e in glue.load("sst2", "dev", data)]
    chosen = [INSTRUCTION.format(sentence=s) for s in reviews if 8 <= len(s.split()) <= 25][:16]
    blimp = []
    for file in sorted((data / "blimp").glob("*.jsonl")):
        rows = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        blimp += [r["one_prefix_prefix"] for r in rows if r.get("one_prefix_method") and r.get("one_prefix_prefix")][:2]
    return chosen + blimp[:16]


def _merged(old: dict, new: dict, methods: list[str]) -> dict:
    """``old`` report with ``methods``' entries taken from ``new`` (the same prompts and generated steps)."""
    if old.get("prompts_used") != new["prompts_used"] or old.get("steps") != new["steps"]:
        raise SystemExit("the stored report was made on other prompts or steps: rerun every method")
    out = dict(old)
    out["methods"] = list(dict.fromkeys(old["methods"] + methods))
    for key in ("aopc", "per_step", "curves"):
        out[key] = {**old[key], **{m: new[key][m] for m in methods}}
    out["seconds_by_method"] = {**old.get("seconds_by_method", {}), **{m: new["seconds"] for m in methods}}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_option(parser)
    parser.add_argument("--out", type=Path, default=GENERATION_RESULTS / "report.json", help="the report (JSON)")
    parser.add_argument("--methods", help="comma-separated: score only these, merged into the stored report")
    args = parser.parse_args()
    only = args.methods.split(",") if args.methods else None
    data = data_folder(args.data)
    model, tokenizer = normx.load_model("smollm2")
    chosen = prompts(data)
    started = time.time()
    report = generation_faithfulness(model, tokenizer, chosen, only or METHODS, max_new_tokens=6,
                                     method_options={"integrated_gradients": {"n_steps": 16}})
    seconds = round(time.time() - started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {**report.to_dict(), "seconds": seconds, "prompts_used": chosen}
    if only is not None:
        result = _merged(json.loads(args.out.read_text()), result, only)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(report.table())
    print(f"\n{report.prompts} prompts, {report.steps} steps, {seconds} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
