"""Choosing NormXLogit for generation on a training prompt set, reported on a disjoint held-out one
(docs/generation.md, "Choosing NormXLogit for generation, held out"; issue #36).

Prompt kinds, each a pool in file order from the shared data, shuffled with ``random.Random(SEED)``; the first
``PER_KIND`` of each pool are the training prompts, the next ``PER_KIND`` the held-out ones (disjoint by
construction):

- ``sst2``: SST-2 dev reviews with 8-25 words, ``"Review: {s}\\nIs this review positive or negative? Answer:"``;
- ``mnli``: MNLI dev-matched pairs (premise <= 25 words, hypothesis <= 15), ``"Premise: {p}\\nHypothesis: {h}\\n
  Does the premise entail the hypothesis? Answer:"``;
- ``fact``: QNLI dev pairs labelled entailment (the sentence answers the question; 10-35 words), ``"Context: {s}
  \\nQuestion: {q}\\nAnswer:"``: the answer is a fact stated earlier in the prompt;
- ``copy``: SST-2 train sentences with 10-20 words, ``"Text: {s}\\nRepeat the text.\\nText: {first two words}"``:
  the continuation copies words from far back;
- ``agreement``: BLiMP ``one_prefix_prefix`` (the sentence up to the word that decides its grammaticality: number
  agreement, some across a distractor), all shared files pooled.

SmolLM2 (``smollm2``), greedy, 6 steps, no chat template; the deletion protocol of
:func:`normx.evaluation.generation.generation_faithfulness` (standard) and its position-controlled protocol with the
``KEEP_RECENT`` = 8 tokens before each generated token held fixed (on steps with >= 4 earlier tokens). Both fixed
before any run.

Selection rule (fixed before the training run): a candidate's score is comprehensiveness AOPC minus sufficiency
AOPC on the standard protocol over the training steps, with the coarser grid K = 20, 50, 80 % (``TRAIN_KS``: the
shared 2-core machine's time); each family's best setting is its choice, and the three families with the best
chosen scores go to the held-out run (full K = 10 ... 90 % grid, both protocols) beside NormXLogit at its default
(last) layer and the baselines, winners and losers alike; the other families are reported on training only.

    python -m studies.generation.study train [i/n]    # every candidate, training prompts, standard protocol
    python -m studies.generation.study merge train n  # the n parts as study-train.json, with each family's choice
    python -m studies.generation.study heldout [i/n]  # the chosen settings and the baselines, held out, both protocols
    python -m studies.generation.study merge heldout n
    python -m studies.generation.study table          # the Markdown tables from the two result files
    python -m studies.generation.study cost           # the chosen settings' all-steps cost against a forward

(data: ``--data DIR`` or ``$NORMX_DATA``; results: ``--out DIR``, default docs/results/generation/study-*.json)
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import time
from pathlib import Path

import numpy as np

from studies.settings import GENERATION_RESULTS, add_data_option, data_folder

SEED = 36
PER_KIND = 4
STEPS = 6
KEEP_RECENT = 8
MIN_FAR = 4
KINDS = ("sst2", "mnli", "fact", "copy", "agreement")
BASELINES = {"gradient_x_input": {}, "norm_attention": {}, "normxlogit": {}, "recency": {}}  # (random: not run held
# out, the machine's time)
# the candidates (one pass for all steps); layer 30 is the last of SmolLM2's 30 blocks
CANDIDATES = {
    **{f"normxlogit@{layer}": {"method": "normxlogit", "layer": layer} for layer in (10, 15, 21, 30)},
    "lens_logprob@30": {"method": "lens_logprob", "layer": 30},
    "normx_centred@30": {"method": "normx_centred", "layer": 30},
    **{f"attention_logit@{layer}": {"method": "attention_logit", "layer": layer} for layer in (15, 30)},
    "recency_first": {},
}
TRAIN_KS = (0.2, 0.5, 0.8)  # selection's coarser AOPC (the 2-core machine's time); held out: K = 10 ... 90 %
# filled in from the training run by the selection rule (see the module docstring), before the held-out run:
# study-train.json's "chosen" (recency_first +0.187, normx_centred@30 +0.125, attention_logit@30 +0.124; the best
# NormXLogit layer, 21, scored +0.062)
CHOSEN: dict[str, dict] = {"attention_logit@30": CANDIDATES["attention_logit@30"],
                           "normx_centred@30": CANDIDATES["normx_centred@30"], "recency_first": {}}


def _words(text: str) -> int:
    return len(text.split())


def pools(data: Path) -> dict[str, list[str]]:
    """Every prompt kind's pool, in file order (before shuffling)."""
    from normx.data import glue

    sst2 = [e.text.strip() for e in glue.load("sst2", "dev", data)]
    out = {"sst2": [f"Review: {s}\nIs this review positive or negative? Answer:" for s in sst2
                    if 8 <= _words(s) <= 25]}
    mnli = [json.loads(line) for line in (data / "mnli" / "dev_matched.jsonl").read_text(encoding="utf-8")
            .splitlines()[:3000] if line.strip()]
    out["mnli"] = [f"Premise: {r['premise'].strip()}\nHypothesis: {r['hypothesis'].strip()}\nDoes the premise "
                   "entail the hypothesis? Answer:" for r in mnli
                   if _words(r["premise"]) <= 25 and _words(r["hypothesis"]) <= 15]
    with open(data / "qnli" / "dev.tsv", encoding="utf-8", newline="") as f:
        qnli = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:3000]
    out["fact"] = [f"Context: {r['sentence'].strip()}\nQuestion: {r['question'].strip()}\nAnswer:" for r in qnli
                   if r["label"] == "entailment" and 10 <= _words(r["sentence"]) <= 35]
    with open(data / "sst2" / "train.tsv", encoding="utf-8", newline="") as f:
        train = [r["sentence"].strip() for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)][:20000]
    out["copy"] = [f"Text: {s}\nRepeat the text.\nText: {' '.join(s.split()[:2])}" for s in train
                   if 10 <= _words(s) <= 20]
    blimp = []
    for file in sorted((data / "blimp").glob("*.jsonl")):
        rows = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        blimp += [r["one_prefix_prefix"] for r in rows if r.get("one_prefix_method") and r.get("one_prefix_prefix")]
    out["agreement"] = blimp
    return out


def split(data: Path) -> dict[str, list[tuple[str, str]]]:
    """``{"train": [(kind, prompt), ...], "heldout": [...]}``: per kind, the seeded shuffle's first PER_KIND and
    next PER_KIND."""
    out: dict[str, list[tuple[str, str]]] = {"train": [], "heldout": []}
    for kind, pool in pools(data).items():
        order = list(dict.fromkeys(pool))  # one copy of a repeated prompt
        random.Random(f"{SEED}:{kind}").shuffle(order)
        out["train"] += [(kind, p) for p in order[:PER_KIND]]
        out["heldout"] += [(kind, p) for p in order[PER_KIND:2 * PER_KIND]]
    assert not {p for _, p in out["train"]} & {p for _, p in out["heldout"]}
    return out


def run(which: str, data: Path, methods: dict[str, dict], far: bool) -> dict:
    import torch

    import normx
    from normx.evaluation.generation import generation_faithfulness

    torch.set_num_threads(1)
    model, tokenizer = normx.load_model("smollm2")
    chosen = split(data)[which]
    started = time.time()
    report = generation_faithfulness(model, tokenizer, [p for _, p in chosen], list(methods), max_new_tokens=STEPS,
                                     method_options=methods, keep_recent=KEEP_RECENT if far else None,
                                     min_far=MIN_FAR, ks=None if far else TRAIN_KS)
    result = report.to_dict()
    result["per_step"] = {m: {mode: [None if v is None else round(v, 5) for v in values]
                              for mode, values in modes.items()} for m, modes in result["per_step"].items()}
    kinds = [chosen[i][0] for i in report.settings["step_prompts"]]
    result |= {"seconds": round(time.time() - started), "split": which, "kinds": kinds, "seed": SEED,
               "prompts_used": [p for _, p in chosen]}
    return result


def _score(result: dict, method: str, prefix: str = "") -> float:
    aopc = result["aopc"][method]
    return aopc[prefix + "comprehensiveness"] - aopc[prefix + "sufficiency"]


def choose(train: dict, families: int = 3) -> dict[str, str]:
    """The selection rule: each family's best setting on training; the ``families`` best of those, best first
    (family -> label)."""
    best: dict[str, str] = {}
    for label in train["methods"]:
        family = label.split("@")[0]
        if family not in best or _score(train, label) > _score(train, best[family]):
            best[family] = label
    ranked = sorted(best.items(), key=lambda item: -_score(train, item[1]))
    return dict(ranked[:families])


def _paired(result: dict, a: str, b: str, mode: str) -> tuple[float, float]:
    x, y = result["per_step"][a][mode], result["per_step"][b][mode]
    d = np.array([u - v for u, v in zip(x, y) if u is not None and v is not None])
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d)))


def _cell(result: dict, method: str, mode: str) -> str:
    values = np.array([v for v in result["per_step"][method][mode] if v is not None])
    return f"{values.mean():.3f} ± {values.std(ddof=1) / np.sqrt(len(values)):.3f}"


def table(train: dict, heldout: dict, against=("gradient_x_input", "recency", "norm_attention")) -> str:
    lines = []
    for prefix, title in (("", "standard protocol"), ("far_", f"position-controlled (last {KEEP_RECENT} fixed)")):
        lines += [f"\n{title}: comprehensiveness ↑ / sufficiency ↓ (± s.e.); held-out paired differences "
                  "(comp / suff, ± s.e.)\n",
                  "| method | training (K = 20, 50, 80 %) | held out | " + " | ".join(f"− {b}" for b in against)
                  + " | ρ(position) |",
                  "|---|---|---|" + "---|" * len(against) + "---|"]
        for method in heldout["methods"]:
            cells = [f"{_cell(r, method, prefix + 'comprehensiveness')} / {_cell(r, method, prefix + 'sufficiency')}"
                     if prefix + "comprehensiveness" in r["aopc"].get(method, {}) else "–" for r in (train, heldout)]
            for b in against:
                if b == method:
                    cells.append("–")
                    continue
                (c, cs), (s, ss) = (_paired(heldout, method, b, prefix + m) for m in ("comprehensiveness",
                                                                                      "sufficiency"))
                cells.append(f"{c:+.3f} ± {cs:.3f} / {s:+.3f} ± {ss:.3f}")
            cells.append(f"{heldout['position_correlation'][method]:.2f}")
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _part(methods: dict[str, dict], part: str | None) -> dict[str, dict]:
    """``part`` "i/n": every n-th method from the i-th (0-based), so n processes can share the work."""
    if part is None:
        return methods
    i, n = (int(v) for v in part.split("/"))
    return {label: options for k, (label, options) in enumerate(methods.items()) if k % n == i}


def merge(out: Path, which: str, parts: int) -> dict:
    """The part files of one split as one result (the same prompts and steps; each method from its part)."""
    files = [json.loads((out / f"study-{which}.part{i}.json").read_text()) for i in range(parts)]
    result = dict(files[0])
    for key in ("aopc", "per_step", "curves", "position_correlation"):
        result[key] = {k: v for f in files for k, v in f[key].items()}
    result["methods"] = [m for f in files for m in f["methods"]]
    result["seconds"] = [f["seconds"] for f in files]
    result["settings"]["method_options"] = {k: v for f in files for k, v in f["settings"]["method_options"].items()}
    result["settings"]["methods_run"] = {k: v for f in files for k, v in f["settings"]["methods_run"].items()}
    return result


def cost(methods: dict[str, dict], rounds: int = 5) -> None:
    """Each method's all-steps cost against one plain forward pass, as studies/timing/generation_attention.py
    measures it (the same prompt, 32 teacher-forced tokens, 1 thread, interleaved medians)."""
    import normx
    from studies.timing.generation_attention import NEW_TOKENS, PROMPT, interleaved, timed, timing_setup

    model, tokenizer, continuation, ids, forward = timing_setup()
    plain = statistics.median(timed(forward) for _ in range(rounds))
    print(f"| plain forward pass ({ids.shape[1]} tokens) | {plain * 1e3:.1f} ms | 1 |")
    for label, options in methods.items():
        options = dict(options)
        method = options.pop("method", label)

        def all_steps(method=method, options=options):
            return normx.explain_generation(model, tokenizer, PROMPT, method=method, target=continuation, **options)

        all_steps()
        seconds, ratio = interleaved(all_steps, forward, rounds)
        print(f"| {label}, all {NEW_TOKENS} steps | {seconds * 1e3:.1f} ms | {ratio:.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", default="table", choices=("train", "heldout", "merge", "table", "cost"))
    parser.add_argument("part", nargs="*", help="train / heldout: i/n (a share); merge: the split and n")
    add_data_option(parser)
    parser.add_argument("--out", type=Path, default=GENERATION_RESULTS, help="the results folder (study-*.json)")
    args = parser.parse_args()
    which, out = args.command, args.out
    part = args.part[0] if which in ("train", "heldout") and args.part else None  # "i/n": a share
    out.mkdir(parents=True, exist_ok=True)
    if which in ("train", "heldout"):
        if which == "heldout" and not CHOSEN:
            raise SystemExit("CHOSEN is empty: run the training selection first and fill it in")
        methods = CANDIDATES if which == "train" else {**BASELINES, **CHOSEN}
        result = run(which, data_folder(args.data), _part(methods, part), far=which == "heldout")
        name = f"study-{which}.part{part.split('/')[0]}.json" if part else f"study-{which}.json"
        (out / name).write_text(json.dumps(result) + "\n")
        print(f"{name}: {result['seconds']} s")
    elif which == "cost":
        cost({"normxlogit": {}, "norm_attention": {}, **CHOSEN})
    elif which == "merge":  # python -m studies.generation.study merge train 2
        split_name, parts = args.part
        result = merge(out, split_name, int(parts))
        if split_name == "train":
            result["chosen"] = choose(result)
            print("chosen:", result["chosen"])
        (out / f"study-{split_name}.json").write_text(json.dumps(result) + "\n")
        for label in result["methods"]:
            print(f"{label:28s} comp - suff {_score(result, label):+.3f}")
    else:
        train = json.loads((out / "study-train.json").read_text())
        heldout = json.loads((out / "study-heldout.json").read_text())
        print(table(train, heldout))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
