"""AT2 trained for SmolLM2 by at2's own trainer (at2 0.0.1's ``LinearScoreEstimatorTrainer``: generate, then
compute features and outputs, then train) on the training contexts normx calibrates ``calibrated_attention`` on,
so that the trained estimator can be read on the held-out contexts by the peers study (``AT2 (trained)``).

Run it with the peers' virtualenv (``studies/context/peers.py``) and normx on its path, from the repository root::

    PYTHONPATH=. PEERS_PYTHON -m studies.context.at2_train --data DATA --out DIR --threads 2

then read the estimator on the held-out contexts::

    PYTHONPATH=. PEERS_PYTHON -m studies.context.peers --data DATA --length 300 --limit 12 --kinds qa,claim \\
        --peers "AT2 (trained),AT2 (average attention)" --methods random,position \\
        --at2-estimator DIR/estimators/default/score_estimator.pt --threads 2 --out OUT

The contexts: 32-71 of the ``train`` split (20 ``qa``, 20 ``claim``, ~300 tokens; ``--first``, ``--train``), as
``studies.context.calibrate --first 32 --train 40`` reads them. Each is at2's own ``SimpleContextAttributionTask``
(the user message "Context: {context}\\n\\nQuery: {query}" under SmolLM2's chat template: normx's layout, checked to
give normx's ids) whose sources are the example's sources (the partition the peers study gives AT2's attributor,
checked to give the evaluation's token spans), and whose generation is normx's response (the evaluation's greedy
answer, at most 12 tokens, the end-of-turn token left out; at2 reads it as text, which on ``qa-train-300-0-30``
it tokenises to two "\\n" tokens where the model generated one "\\n\\n": listed in summary.json), written as the
trainer's generations file before ``generate``, which then only records each task's sources and targets (at2's own
greedy generation runs up to 512 new tokens and keeps the end-of-turn token: not the response the held-out LDS
reads). Then at2's own ``compute_features_and_outputs`` (its 32 masks per context, each source kept with p = 0.5
from seeds 0-31, its ablation forwards with the sources' attention masked, the response's sentences as targets) and
``train`` (Pearson loss, Adam, cosine schedule, gradient clipping 1.0, 1,000 steps at learning rate 1e-3; the
estimator's weights L1-normalised at the end), saving ``DIR/estimators/NAME/score_estimator.pt``. ``generate`` and
``compute_features_and_outputs`` resume where the trainer does (its JSON files and memory-mapped stores in DIR).

What differs from the authors' recipe (scripts/train_context_at2.py of MadryLab/AT2: 4,000 Dolly-15k contexts,
sources one token each, bfloat16 with FlashAttention 2 on a GPU, the model's own generations):

- 40 contexts, not 4,000, and the training batch is all of them (``--batch-size``, default: every context with a
  target; the trainer samples contexts without replacement, so its default 512 cannot run on 40);
- the sources are normx's (one sentence each, ~8 a context), not single tokens, and the response is normx's;
- float32 on the CPU (``device="cpu"``), sdpa attention; numpy and torch seeded (``--seed``) for a repeatable run;
- the response's sentences come from nltk's Punkt with no trained parameters (the English ``punkt_tab`` data that at2
  asks nltk to download is not reachable offline; an empty model of that name, written under DIR/nltk_data, is
  Punkt untrained, as normx's own sentence sources use it); the package's ``nltk.download`` call fails and is left
  to fail. No hub download is needed: the model is normx's offline SmolLM2.

Writes into ``--out``: the trainer's folders (``generations``, ``task_datas``, ``features_and_outputs``,
``estimators``), ``contexts.jsonl`` (the 40 contexts as given to the trainer) and ``summary.json`` (settings, each
step's seconds, and the mean in-sample Pearson correlation over every (context, target) of the untrained and the
trained estimator: the trainer's loss is its negative on sampled batches).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from studies.settings import add_data_option, data_folder, provenance, version

PUNKT_FILES = ("collocations.tab", "sent_starters.txt", "abbrev_types.txt", "ortho_context.tab")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.context.at2_train", description=__doc__.split("\n\n")[0])
    add_data_option(parser)
    parser.add_argument("--out", type=Path, required=True, help="the trainer's folder (resumed by a rerun)")
    parser.add_argument("--kinds", default="qa,claim")
    parser.add_argument("--length", type=int, default=300)
    parser.add_argument("--first", type=int, default=32, help="the first training context's index")
    parser.add_argument("--train", type=int, default=40, help="training contexts")
    parser.add_argument("--masks", type=int, default=32, help="at2's ablation masks per context")
    parser.add_argument("--split-target-by", default="sentence", choices=("sentence", "word", "token", "none"))
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=None, help="contexts per step (default: all of them)")
    parser.add_argument("--forward-batch", type=int, default=4, help="ablation forwards per batch")
    parser.add_argument("--save-name", default="default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import torch

    import normx
    from normx.data.contexts import context_examples

    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    offline_punkt(args.out / "nltk_data")
    from at2 import AT2Trainer
    from datasets import Dataset

    from studies.context.peers import at2_extractor, at2_task

    started, seconds = time.perf_counter(), {}
    examples = context_examples(args.kinds.split(","), "train", args.length, args.first + args.train, 0,
                                data_folder(args.data))[args.first:]
    model, tokenizer = normx.load_model("smollm2")
    rows = contexts(model, tokenizer, examples, args.out / "contexts.jsonl")
    seeded_generations(args.out / "generations", rows)
    seconds["contexts"] = time.perf_counter() - started

    def task_from_example(example, model, tokenizer):
        return at2_task(model, tokenizer, example["context"], example["query"], example["ranges"])

    split = None if args.split_target_by == "none" else args.split_target_by
    trainer = AT2Trainer(save_path=args.out, dataset=Dataset.from_list(rows), model=model, tokenizer=tokenizer,
                         task_from_example=task_from_example, feature_extractor=at2_extractor(model),
                         split_target_by=split, num_masks=args.masks)
    retokenised = check_tasks(trainer, rows)
    for step, run in (("generate", lambda: trainer.generate()),
                      ("features_and_outputs", lambda: trainer.compute_features_and_outputs(
                          batch_size=args.forward_batch))):
        at = time.perf_counter()
        run()
        seconds[step] = time.perf_counter() - at
    if trainer.load_generations() != {i: row["response"] for i, row in enumerate(rows)}:
        raise RuntimeError("the trainer's generations are not normx's responses")
    usable = [i for i in range(len(rows)) if trainer.task_datas[i]["num_targets"] > 0]
    batch = args.batch_size or len(usable)
    if batch > len(usable):
        raise SystemExit(f"--batch-size {batch} is more than the {len(usable)} contexts with a target")
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    at = time.perf_counter()
    estimator = trainer.train(num_iterations=args.iterations, learning_rate=args.learning_rate, batch_size=batch,
                              device="cpu", save_name=args.save_name)
    seconds["train"] = time.perf_counter() - at
    fit = {"untrained": in_sample(trainer, usable, None), "trained": in_sample(trainer, usable, estimator)}
    weights = estimator.linear.weight.detach().double().numpy().ravel()
    summary = {
        "command": "PYTHONPATH=. PEERS_PYTHON -m studies.context.at2_train " + " ".join(argv or sys.argv[1:]),
        "contexts": [row["id"] for row in rows], "contexts_with_targets": len(usable),
        "response_retokenised": retokenised,
        "targets": {row["id"]: trainer.task_datas[i]["num_targets"] for i, row in enumerate(rows)},
        "settings": {"masks": args.masks, "split_target_by": split, "iterations": args.iterations,
                     "learning_rate": args.learning_rate, "batch_size": batch, "forward_batch": args.forward_batch,
                     "seed": args.seed, "threads": torch.get_num_threads(), "device": "cpu", "dtype": "float32"},
        "estimator": str((args.out / "estimators" / args.save_name / "score_estimator.pt").resolve()),
        "in_sample_pearson": fit,
        "weights": {"min": float(weights.min()), "max": float(weights.max()), "negative": int((weights < 0).sum()),
                    "count": len(weights)},
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "versions": {name: version(name) for name in ("at2", "torch", "transformers", "nltk", "datasets")},
        **provenance()}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: summary[k] for k in ("contexts_with_targets", "in_sample_pearson", "seconds")}))
    return 0


def offline_punkt(folder: Path) -> None:
    """An English ``punkt_tab`` model with no parameters (Punkt untrained) where nltk looks first."""
    import nltk

    english = folder / "tokenizers" / "punkt_tab" / "english"
    english.mkdir(parents=True, exist_ok=True)
    for name in PUNKT_FILES:
        (english / name).touch()
    nltk.data.path.insert(0, str(folder.resolve()))


def contexts(model, tokenizer, examples, file: Path) -> list[dict]:
    """Each example as the evaluation prepares it (its ids, sources' spans and greedy response), kept in ``file``."""
    from normx.evaluation.context.readings import prepare
    from studies.context.peers import source_ranges

    if file.is_file():
        rows = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
        if [row["id"] for row in rows] == [e.id for e in examples]:
            return rows
        raise SystemExit(f"{file} holds other contexts; use another --out")
    rows = []
    for example in examples:
        prepared = prepare(model, tokenizer, example)
        rows.append({"id": example.id, "kind": example.kind, "context": example.context(), "query": example.query,
                     "ranges": [list(r) for r in source_ranges(example)], "evidence": list(example.evidence),
                     "response": prepared.response, "ids": prepared.ids, "prompt_length": prepared.prompt_length,
                     "spans": [list(span) for span in prepared.spans]})
    file.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return rows


def seeded_generations(folder: Path, rows: list[dict]) -> None:
    """The trainer's generations file (one job) holding normx's responses, so that ``generate`` generates nothing."""
    folder.mkdir(parents=True, exist_ok=True)
    file, wanted = folder / "0_of_1.json", {str(i): row["response"] for i, row in enumerate(rows)}
    if file.is_file() and json.loads(file.read_text()) != wanted:
        raise SystemExit(f"{file} holds other generations; use another --out")
    if sorted(p.name for p in folder.iterdir()) not in ([], ["0_of_1.json"]):
        raise SystemExit(f"{folder} holds other jobs' files; use another --out")
    file.write_text(json.dumps(wanted, indent=4))


def check_tasks(trainer, rows: list[dict]) -> list[str]:
    """Each task reads normx's prompt ids, sources' token spans and response text; returns the contexts whose response
    text at2 tokenises to other ids than normx's greedy ones (at2 reads text: ``"\n\n"`` generated as one token can
    come back as two)."""
    retokenised = []
    for i, row in enumerate(rows):
        task = trainer.get_task(i)
        ids, length = list(task.get_tokens()["input_ids"]), row["prompt_length"]
        start, end = task.target_token_range
        spans = [list(span) for span in task.source_token_ranges]
        if (ids[:length] != row["ids"][:length] or (start, end) != (length, len(ids)) or spans != row["spans"]
                or trainer.tokenizer.decode(ids[start:end]) != row["response"]):
            raise RuntimeError(f"{row['id']}: at2's task reads other prompt ids, source spans or response than normx")
        if ids != row["ids"]:
            retokenised.append(row["id"])
    return retokenised


def in_sample(trainer, indices: list[int], estimator) -> dict:
    """The Pearson correlation over each (context, target)'s masks between the estimator's predictions (uniform
    weights when None: the untrained estimator) and the outputs, averaged; the trainer's own loss, on every target."""
    correlations = []
    for i in indices:
        features, outputs = trainer.get_features_and_outputs(i)
        features, outputs = np.asarray(features, np.float64), np.asarray(outputs, np.float64)
        weights = (np.full(features.shape[-1], 1.0) if estimator is None
                   else estimator.linear.weight.detach().double().numpy().ravel())
        for x, y in zip(features @ weights, outputs):
            x, y = x - x.mean(), y - y.mean()
            correlations.append(float((x * y).mean() / (np.sqrt((x**2).mean()) * np.sqrt((y**2).mean()) + 1e-8)))
    return {"mean": float(np.mean(correlations)), "instances": len(correlations)}


if __name__ == "__main__":
    raise SystemExit(main())
