"""The selection step of the one-pass variant search (docs/variants.md), on data that is never reported.

Every experimental variant of NormXLogit (``normx methods`` lists them; normx/methods/variants.py) is evaluated with the
faithfulness engine (AOPC comprehensiveness and sufficiency, the protocol of docs/results.md) on the presets'
*training* data, next to NormXLogit itself:

- SST-2: the first 300 sentences of SST-2 train with at least 10 words (train is mostly short phrases; dev, which
  is reported, has 19.5 words on average);
- MNLI, QNLI: the first 200 pairs of the training 70 % of their validation splits (``normx.data.glue``);
- STS-B: the first 500 pairs of STS-B train (regression: only the variants that apply to it).

The rule, fixed before running: a setting's *selection score* on a task is comprehensiveness AOPC minus
sufficiency AOPC (confidence drop; for STS-B sufficiency minus comprehensiveness Pearson AOPC), both higher-is-
better; each variant's ``window`` is the value with the best mean selection score over the tasks it applies to.
The held-out report then runs each variant once, at that setting, with ``normx evaluate faithfulness``.

Usage (about 40 minutes on a 2-core CPU)::

    python -m studies.variants.search --data DIR --out docs/results/variants-selection   # or $NORMX_DATA

writes ``selection.json`` (settings, every AOPC, seconds) and ``selection.csv`` and prints the table.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

TASKS = {"sst2": ("minilm-sst2", 300), "mnli": ("minilm-mnli", 200), "qnli": ("minilm-qnli", 200),
         "stsb": ("minilm-stsb", 500)}
# (method, options) settings tried; window 1 is the variant at one layer
CLASSIFIER = [("normxlogit", {}), ("logat_margin", {}), ("normx_prob", {}), ("normx_selfnorm", {})] + [
    ("normx_margin", {"window": w}) for w in (1, 2, 3, 6)] + [("normx_window", {"window": w}) for w in (2, 3, 6)]
REGRESSION = [("normxlogit", {}), ("normx_selfnorm", {})] + [("normx_window", {"window": w}) for w in (2, 3, 6)]


def selection_examples(task: str, data: str | None):
    from normx.data import glue

    examples = glue.load(task, "train", data)
    if task == "sst2":
        examples = [e for e in examples if len(e.text.split()) >= 10]
    return examples[:TASKS[task][1]]


def run(out: Path, data: str | None, tasks: list[str]) -> list[dict]:
    import normx
    from normx.evaluation.faithfulness import evaluate

    rows = []
    for task in tasks:
        preset, _ = TASKS[task]
        model, tokenizer = normx.load_model(preset)
        examples = selection_examples(task, data)
        settings = REGRESSION if task == "stsb" else CLASSIFIER
        for method, options in settings:
            started = time.perf_counter()
            report = evaluate(model, tokenizer, examples, [method], task=task,
                              method_options={method: options} if options else None, progress=False)
            comp, suff = report.aopc(method, "comprehensiveness"), report.aopc(method, "sufficiency")
            score = suff - comp if report.regression else comp - suff
            rows.append({"task": task, "examples": len(examples), "method": method,
                         "window": options.get("window", ""), "comprehensiveness": round(comp, 4),
                         "sufficiency": round(suff, 4), "score": round(score, 4),
                         "seconds": round(time.perf_counter() - started, 1)})
            print(json.dumps(rows[-1]), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "selection.json").write_text(json.dumps({"tasks": {t: TASKS[t] for t in tasks}, "rows": rows},
                                                   indent=2) + "\n")
    with open(out / "selection.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return rows


def choose(rows: list[dict]) -> dict[str, dict]:
    """Per method: its mean selection score over tasks for each window, and the window chosen."""
    means: dict[str, dict] = {}
    for method in dict.fromkeys(r["method"] for r in rows):
        by_window: dict = {}
        for r in rows:
            if r["method"] == method:
                by_window.setdefault(r["window"], []).append(r["score"])
        scores = {w: sum(v) / len(v) for w, v in by_window.items() if len(v) == max(map(len, by_window.values()))}
        best = max(scores, key=scores.get)
        means[method] = {"mean_score": scores, "window": best}
    return means


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--data", default=None, help="the data folder (default: $NORMX_DATA)")
    parser.add_argument("--tasks", default=",".join(TASKS))
    args = parser.parse_args()
    rows = run(Path(args.out), args.data, args.tasks.split(","))
    print(json.dumps(choose(rows), indent=2))


if __name__ == "__main__":
    main()
