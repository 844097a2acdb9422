"""normx's ``attnlrp`` against LXT 2.1's AttnLRP (``lxt.efficient``, transformers 4.52, its own virtualenv) on the
same generation steps of the offline SmolLM2-135M-Instruct (docs/generation.md, "AttnLRP").

The steps are the generation faithfulness protocol's (``studies/generation/faithfulness.py``: 16 SST-2 + 12 BLiMP
prompts, 6 greedy tokens each, 168 steps): normx generates and explains them (``explain_generation(...,
method="attnlrp")``, the prefixes batched), then ``studies.parity.lxt_attnlrp rows`` explains the SAME ids with LXT,
one step at a time, on the plain copy of the model (``python -m studies.generation.peers export LXT_MODEL``). Per
step, with r the normx row and l LXT's (a relevance for each of the p tokens before the generated one):

- ``max_diff``: max_i |r_i - l_i| / max_i |l_i| (the row's scale);
- ``spearman``: the rank correlation of r and l; ``top1``: the same most relevant token;
- conservation of each: the row's sum / the generated token's logit at the step (normx's logit from the model's own
  plain forward pass in transformers 5, LXT's from its forward pass in 4.52), and how far the two logits are apart.

Plain Gradient×Input (signed sum over the embedding dimensions, the same target logit) is compared with LXT the same
way, to show how far apart two different methods are on this scale.

    python -m studies.parity.attnlrp --data DIR [--limit N] --lxt-python LXT_VENV/bin/python --lxt-model LXT_MODEL
    # data: --data or $NORMX_DATA; LXT: or $NORMX_LXT_PYTHON / $NORMX_LXT_MODEL;
    # writes --out, default docs/results/generation/attnlrp_parity.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import normx
from studies.generation.faithfulness import prompts
from studies.settings import GENERATION_RESULTS, REPO, add_data_option, add_lxt_options, data_folder, lxt_command

OUT = GENERATION_RESULTS / "attnlrp_parity.json"
NEW_TOKENS = 6


def _ranks(x: np.ndarray) -> np.ndarray:
    ranks = np.empty(len(x))
    ranks[np.argsort(x, kind="stable")] = np.arange(len(x))
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2:
        return 1.0
    return float(np.corrcoef(_ranks(a), _ranks(b))[0, 1])


def compare(rows: list[np.ndarray], reference: list[np.ndarray]) -> dict:
    """Per-step agreement of ``rows`` with ``reference`` (lists of 1-D rows), summarised."""
    diff = [float(np.abs(r - ref).max() / np.abs(ref).max()) for r, ref in zip(rows, reference)]
    rho = [spearman(r, ref) for r, ref in zip(rows, reference)]
    top1 = [int(np.argmax(r) == np.argmax(ref)) for r, ref in zip(rows, reference)]
    return {"max_diff": summary(diff), "spearman": summary(rho), "top1": float(np.mean(top1)),
            "steps_max_diff": diff, "steps_spearman": rho}


def summary(values: list[float]) -> dict:
    v = np.asarray(values, dtype=np.float64)
    return {"median": float(np.median(v)), "mean": float(v.mean()), "min": float(v.min()), "max": float(v.max()),
            "sd": float(v.std(ddof=1)) if len(v) > 1 else 0.0}


def target_logits(model, sequences: list[dict]) -> list[list[float]]:
    """The model's own logit of each generated token at its step (one plain forward pass per sequence)."""
    out = []
    with torch.no_grad():
        for seq in sequences:
            ids, p = seq["ids"], seq["prompt_length"]
            logits = model(input_ids=torch.tensor([ids])).logits[0]
            out.append([float(logits[q - 1, ids[q]]) for q in range(p, len(ids))])
    return out


def lxt_rows(python: str | None, model_dir: str | None, sequences: list[dict]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        steps, rows = Path(tmp) / "steps.json", Path(tmp) / "rows.json"
        command = lxt_command(python, model_dir, "rows", str(steps), str(rows))
        steps.write_text(json.dumps({"sequences": sequences}))
        subprocess.run(command, check=True, cwd=REPO)
        return json.loads(rows.read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_option(parser)
    parser.add_argument("--limit", type=int, default=None, help="the first N prompts only")
    add_lxt_options(parser)
    parser.add_argument("--out", type=Path, default=OUT, help="the results (JSON)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    texts = prompts(data_folder(args.data))[:args.limit]
    model, tokenizer = normx.load_model("smollm2")
    start = time.perf_counter()
    ours = normx.explain_generation(model, tokenizer, texts, method="attnlrp", max_new_tokens=NEW_TOKENS)
    seconds = time.perf_counter() - start
    sequences = [{"ids": [int(i) for i in g.token_ids], "prompt_length": g.prompt_length} for g in ours]
    plain = normx.explain_generation(model, tokenizer, texts, method="gradient_x_input", aggregation="sum",
                                     target=[s["ids"][s["prompt_length"]:] for s in sequences])
    start = time.perf_counter()
    lxt = lxt_rows(args.lxt_python, args.lxt_model, sequences)
    lxt_seconds = time.perf_counter() - start
    if lxt["ids"] != [s["ids"] for s in sequences]:
        raise SystemExit("LXT's rows are for other ids")
    logits = target_logits(model, sequences)
    rows = [np.asarray(r, np.float64) for g in ours for r in g.rows()]
    plain_rows = [np.asarray(r, np.float64) for g in plain for r in g.rows()]
    reference = [np.asarray(r, np.float64) for seq in lxt["rows"] for r in seq]
    ours_logits = [x for seq in logits for x in seq]
    lxt_logits = [x for seq in lxt["logits"] for x in seq]
    result = {
        "steps": len(rows), "prompts": len(texts), "new_tokens": NEW_TOKENS, "seconds_normx": seconds,
        "seconds_lxt": lxt_seconds, "lxt_versions": lxt["versions"],
        "versions": {"normx": normx.__version__, "torch": torch.__version__,
                     "transformers": __import__("transformers").__version__},
        "attnlrp_vs_lxt": compare(rows, reference),
        "gradient_x_input_vs_lxt": compare(plain_rows, reference),
        "logit_difference": summary([abs(a - b) for a, b in zip(ours_logits, lxt_logits)]),
        "conservation_normx": summary([r.sum() / z for r, z in zip(rows, ours_logits)]),
        "conservation_lxt": summary([float(np.sum(r)) / z for r, z in zip(reference, lxt_logits)]),
        "sequences": sequences,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    show = {k: v for k, v in result.items() if k != "sequences"}
    for key in ("attnlrp_vs_lxt", "gradient_x_input_vs_lxt"):
        show[key] = {k: v for k, v in show[key].items() if not k.startswith("steps_")}
    print(json.dumps(show, indent=1))


if __name__ == "__main__":
    main()
