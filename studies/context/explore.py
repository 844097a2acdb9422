"""What the calibration data says (#46): training instances of ``calibrated_attention`` collected on many contexts
(``collect``), and the cross-validated table of which features explain the response's outcomes (``report``).

``collect``: contexts ``first .. first + count - 1`` of the train split (as ``studies.context.calibrate``: context i's
32 masks drawn from seed i), each one's instance (the features of ``--families`` and the response's
log-probability under the masks) kept in ``OUT/train`` by :func:`normx.methods.calibrated.training.instances_for`,
and one line per context in ``OUT/side_K.jsonl`` (id, index, seed, ids, prompt_length, spans, drops): ``drops`` is
each source's drop in the response's log-probability when it is hidden from every row after the context's end (the
query's and the response's; :func:`normx.methods.decoder.knockout.hidden_source_outcomes` with ``first_row`` the
context's end), the feature called ``q0`` below. Worker K of W takes the K-th contiguous block of the contexts;
several workers are the shell's, one process each (a context already in the worker's side file is skipped, so a
rerun with the same ``--workers`` resumes)::

    for k in 0 1 2 3 4 5; do
      python -m studies.context.explore collect --data DATA --out DIR --first 72 --count 1600 --worker $k \\
          --workers 6 --budget-seconds 900 --device cuda &
    done; wait

``report``: the instances of ``OUT/train`` with the drops of ``OUT/side_*.jsonl`` (or, ``--packed FILE... --side
FILE``, the packed form of a lent card's run: one .npz of ``c{n}_id / _key / _masks / _y / _f_{family}`` per part,
side lines with ``q0``), ordered by seed, in 5 contiguous folds over contexts; ridge
(:mod:`normx.methods.calibrated.fit`, centred, log-probability scaling); LDS = the Spearman correlation over each
left-out context's masks. The table: the per-source family sets at lambda 0.1 (all contexts, qa, claim), the
per-head families alone and added to tokens+source_knockout at each tying and lambda, and a ContextCite-like
reference (per context, a LASSO with alpha 0.01 on 24 of its masks scored on the other 8, 4 folds: what ablations
reach on the same contexts). No boosted-trees row: scikit-learn is no dependency of normx. Deterministic; printed
and written to ``OUT/report.md``::

    OMP_NUM_THREADS=1 python -m studies.context.explore report --out DIR
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from studies.settings import add_data_option, data_folder

FAMILIES = "attention,norm,logit,tokens,source_knockout"
HEADS = ("attention", "norm", "logit")
AFTER = "q0"  # the side drops, as a per-source feature
SETS = (("tokens",), ("source_knockout",), (AFTER,), ("tokens", "source_knockout"), ("tokens", AFTER),
        ("tokens", "source_knockout", AFTER))
LAMBDA = 0.1  # the per-source sets' penalty
LAMBDAS = (0.1, 1.0, 10.0, 100.0, 1000.0)  # the per-head families'
TYINGS = ("all", "block", "head")
FOLDS = 5
LASSO_ALPHA, LASSO_FOLDS = 0.01, 4
PACKED_KEY = re.compile(r"c(\d+)_(id|key|masks|y|f_[a-z_]+)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    gather = commands.add_parser("collect", help="training instances and side drops of a block of contexts")
    gather.add_argument("--out", type=Path, required=True, help="the study's folder (train/, side_K.jsonl)")
    add_data_option(gather)
    gather.add_argument("--model", default="smollm2")
    gather.add_argument("--kinds", default="qa,claim")
    gather.add_argument("--length", type=int, default=300)
    gather.add_argument("--first", type=int, default=72, help="the first context's index in the train split")
    gather.add_argument("--count", type=int, required=True, help="contexts in all (every worker's together)")
    gather.add_argument("--worker", type=int, default=0, help="which contiguous block of the contexts (0-based)")
    gather.add_argument("--workers", type=int, default=1, help="how many blocks the contexts are cut into")
    gather.add_argument("--budget-seconds", type=float, default=None, help="start no context after this long")
    gather.add_argument("--device", default=None, help="where the model runs (default: load_model's)")
    gather.add_argument("--families", default=FAMILIES)
    gather.add_argument("--masks", type=int, default=32)
    gather.add_argument("--max-new-tokens", type=int, default=12)
    gather.add_argument("--batch-size", type=int, default=8)
    gather.add_argument("--threads", type=int, default=1, help="torch threads")
    table = commands.add_parser("report", help="the cross-validated table")
    table.add_argument("--out", type=Path, required=True, help="the study's folder: read (unless --packed), and "
                       "report.md written into it")
    table.add_argument("--packed", type=Path, nargs="+", default=None, help="packed instances (.npz parts)")
    table.add_argument("--side", type=Path, nargs="+", default=None, help="the packed run's side lines "
                       "(.jsonl or .jsonl.gz)")
    table.add_argument("--masks", type=int, default=32)
    args = parser.parse_args(argv)
    from normx.errors import NormxError

    try:
        return collect(args) if args.command == "collect" else report(args)
    except NormxError as error:
        print(f"explore: error: {error}", file=sys.stderr)
        return 2


# --- collect ---------------------------------------------------------------------------------------------------------

def after_context_drops(model, context: dict, batch_size: int = 8) -> list[float]:
    """Each source's drop in the response's log-probability (summed over its tokens) when it is hidden from every
    row from the context's end on (every source ends before it, so from all those rows)."""
    from normx.core.handle import model_handle
    from normx.methods.decoder.knockout import hidden_source_outcomes

    spans = context["spans"]
    log_p, _ = hidden_source_outcomes(model_handle(model), context["ids"], context["prompt_length"],
                                      [list(range(a, b)) for a, b in spans], "explore", batch_size,
                                      first_row=max(b for _, b in spans))
    return (log_p[0] - log_p[1:]).sum(1).tolist()


def collect(args) -> int:
    import torch

    import normx
    from normx.cli.calibrate import training_contexts
    from normx.data.contexts import context_examples
    from normx.errors import InvalidInputError
    from normx.methods.calibrated import training

    if args.count < 1 or args.first < 0 or not 0 <= args.worker < args.workers:
        raise InvalidInputError(f"--first {args.first} --count {args.count} --worker {args.worker} --workers "
                                f"{args.workers}: need first >= 0, count >= 1 and 0 <= worker < workers")
    torch.set_num_threads(args.threads)
    families = [f for f in args.families.split(",") if f]
    examples = context_examples(args.kinds.split(","), "train", args.length, args.first + args.count, 0,
                                data_folder(args.data))[args.first:]
    block = np.array_split(np.arange(args.count), args.workers)[args.worker].tolist()
    model, tokenizer = normx.load_model(args.model, device=args.device)
    keep, side = args.out / "train", args.out / f"side_{args.worker}.jsonl"
    done = {record["id"] for record in read_side(side, repair=True)} if side.is_file() else set()
    began, written = time.perf_counter(), 0
    for index in block:
        if args.budget_seconds is not None and time.perf_counter() - began > args.budget_seconds:
            break
        example, seed = examples[index], args.first + index  # as instances_for(block, seed=first + block[0])
        if example.id in done and training.kept_instances(keep, [example.id], masks=args.masks, seed=seed,
                                                          families=families):
            continue
        started = time.perf_counter()
        context = training_contexts(model, tokenizer, [example], args.max_new_tokens)[0]
        training.instances_for(model, tokenizer, [context], masks=args.masks, seed=seed, families=families,
                               batch_size=args.batch_size, keep=keep, progress=False)
        if example.id not in done:
            record = {"id": example.id, "kind": example.kind, "index": args.first + index, "seed": seed,
                      "ids": [int(t) for t in context["ids"]], "prompt_length": context["prompt_length"],
                      "spans": [list(s) for s in context["spans"]],
                      "drops": after_context_drops(model, context, args.batch_size),
                      "seconds": round(time.perf_counter() - started, 3)}
            with open(side, "a") as out:  # one write per line
                out.write(json.dumps(record) + "\n")
        written += 1
    print(f"worker {args.worker}/{args.workers}: {written} contexts of {len(block)} in "
          f"{time.perf_counter() - began:.0f} s", flush=True)
    return 0


# --- reading ---------------------------------------------------------------------------------------------------------

def checked_side(record, where: str) -> dict:
    """A side line's record, checked (drops under ``drops``, or ``q0`` in the packed run's lines)."""
    from normx.errors import InvalidInputError

    def need(ok, what):
        if not ok:
            raise InvalidInputError(f"{where}: {what}")

    need(isinstance(record, dict), "not a JSON object")
    need(isinstance(record.get("id"), str) and record["id"], "no context id")
    ids, length, spans = record.get("ids"), record.get("prompt_length"), record.get("spans")
    need(isinstance(ids, list) and all(isinstance(t, int) for t in ids), "ids must be a list of token ids")
    need(isinstance(length, int) and 1 < length < len(ids), f"prompt_length {length!r} is not inside the "
         f"{len(ids)} ids")
    need(isinstance(spans, list) and spans and all(
        isinstance(s, list) and len(s) == 2 and all(isinstance(v, int) for v in s) and 0 <= s[0] < s[1] < length
        for s in spans), "spans must be [start, end] token ranges inside the prompt")
    drops = record.get("drops", record.get(AFTER))
    need(isinstance(drops, list) and len(drops) == len(spans) and all(
        isinstance(v, (int, float)) and math.isfinite(v) for v in drops), "drops must be one finite number a span")
    seed = record.get("seed")
    need(seed is None or isinstance(seed, int), f"seed {seed!r} is not a whole number")
    return {"id": record["id"], "seed": seed, "sources": len(spans), "drops": np.asarray(drops, np.float64),
            "ids": ids, "prompt_length": length, "spans": spans}


def add_packed_options(parser: argparse.ArgumentParser) -> None:
    """``--packed`` and ``--side``, required: the packed instances of a collect run and their side lines (the
    studies that read them)."""
    parser.add_argument("--packed", type=Path, nargs="+", required=True, help="explore's packed instances (.npz)")
    parser.add_argument("--side", type=Path, nargs="+", required=True, help="their side lines (.jsonl or .jsonl.gz)")


def read_side(file: Path, repair: bool = False) -> list[dict]:
    """Every line of a side file as a checked record; ``repair`` (collect's own file): a damaged line (a worker
    stopped mid-write) is dropped and the file written again whole, else it is an error naming the line."""
    from normx.errors import InvalidInputError

    if file.is_symlink() or not file.is_file():
        raise InvalidInputError(f"side file {file} is not a regular file")
    opener = gzip.open if file.suffix == ".gz" else open
    try:
        with opener(file, "rt", encoding="utf-8") as lines:
            text = lines.read().splitlines()
    except (OSError, UnicodeDecodeError, EOFError) as error:
        raise InvalidInputError(f"side file {file} cannot be read: {error}") from None
    records, good = [], []
    for number, line in enumerate(text, start=1):
        try:
            records.append(checked_side(json.loads(line), f"{file}:{number}"))
            good.append(line)
        except (json.JSONDecodeError, InvalidInputError) as error:
            if not repair:
                raise InvalidInputError(f"{file}:{number}: not a side record ({error})") from None
    if repair and len(good) < len(text):
        handle, temp = tempfile.mkstemp(prefix=".side.", dir=file.parent)
        with os.fdopen(handle, "w") as out:
            out.write("".join(line + "\n" for line in good))
        os.replace(temp, file)
        print(f"{file}: {len(text) - len(good)} damaged line(s) dropped", flush=True)
    return records


def packed_instances(files: list[Path], families: list[str]) -> list[tuple[int, object]]:
    """``(seed, Instance)`` of every context in packed parts (float32 features, read as float64)."""
    from normx.errors import InvalidInputError
    from normx.methods.calibrated.fit import Instance

    found = []
    for file in files:
        if file.is_symlink() or not file.is_file():
            raise InvalidInputError(f"packed file {file} is not a regular file")
        try:
            with np.load(file, allow_pickle=False) as data:
                bad = [k for k in data.files if not PACKED_KEY.fullmatch(k)]
                if bad:
                    raise InvalidInputError(f"{file}: unknown entries {bad[:3]}; a packed part holds c{{n}}_id, "
                                            "_key, _masks, _y and _f_{family}")
                for n in sorted({int(PACKED_KEY.fullmatch(k)[1]) for k in data.files}):
                    p = f"c{n}_"
                    key = json.loads(str(data[p + "key"]))
                    missing = [f for f in families if p + "f_" + f not in data.files]
                    if missing:
                        raise InvalidInputError(f"{file}: context c{n} has no {missing} features")
                    features = {f: data[p + "f_" + f].astype(np.float64) for f in families}
                    found.append((int(key["seed"]), Instance(features, data[p + "masks"].astype(bool),
                                                             data[p + "y"].astype(np.float64), str(data[p + "id"]))))
        except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as error:
            raise InvalidInputError(f"packed file {file} cannot be read: {error}") from None
    return found


def packed_study(packed: list[Path], side: list[Path], masks: int, families: list[str]) -> tuple[list, dict]:
    """A packed run's checked instances (:func:`study_instances`) and its side records by context id, the side
    files read once (the studies that read a packed run)."""
    sides = [r for f in side for r in read_side(f)]
    found, _ = study_instances(argparse.Namespace(packed=packed, side=side, out=None, masks=masks), families, sides)
    return found, {record["id"]: record for record in sides}


def study_instances(args, families: list[str], sides: list[dict] | None = None) -> tuple[list, list[str]]:
    """The instances with the side drops as the ``q0`` feature, ordered by seed, checked (features one row a source,
    masks the ones their seed draws); and what was left out, said. ``sides``: the packed run's side records, when
    already read."""
    from normx.errors import InvalidInputError
    from normx.methods.calibrated import training

    if args.packed:
        if not args.side:
            raise InvalidInputError("--packed needs the run's side lines: --side FILE")
        sides = [r for f in args.side for r in read_side(f)] if sides is None else sides
        pairs = packed_instances(args.packed, families)
    else:
        sides = [r for f in sorted(args.out.glob("side_*.jsonl")) for r in read_side(f)]
        pairs = []
        for record in sides:
            if record["seed"] is None:
                raise InvalidInputError(f"context {record['id']}: its side line has no seed (collect writes it)")
            kept = training.kept_instances(args.out / "train", [record["id"]], masks=args.masks,
                                           seed=record["seed"], families=families)
            pairs += [(record["seed"], inst) for inst in kept]
    if len({inst.id for _, inst in pairs}) < len(pairs):
        raise InvalidInputError("a context has two instances")
    by_id = {}
    for record in sides:
        if record["id"] in by_id:
            raise InvalidInputError(f"context {record['id']} has two side lines")
        by_id[record["id"]] = record
    notes, found = [], []
    for seed, inst in sorted(pairs, key=lambda pair: pair[0]):
        record = by_id.get(inst.id)
        if record is None:
            notes.append(f"{inst.id}: no side line, left out")
            continue
        sources = record["sources"]
        if record["seed"] not in (None, seed):
            raise InvalidInputError(f"{inst.id}: its side line says seed {record['seed']}, its instance {seed}")
        if any(v.shape[0] != sources or v.ndim != 3 for v in inst.features.values()) or inst.masks.shape != (
                args.masks, sources) or inst.y.shape != (args.masks,):
            raise InvalidInputError(f"{inst.id}: features, masks or outcomes are not {args.masks} masks over its "
                                    f"{sources} sources")
        if not np.array_equal(inst.masks, training.training_masks(sources, args.masks, seed)):
            raise InvalidInputError(f"{inst.id}: its masks are not the ones seed {seed} draws")
        inst.features[AFTER] = record["drops"][:, None, None]
        found.append(inst)
    unread = len(sides) - len(found)
    if unread > len(notes):
        notes.append(f"{unread - len(notes)} side line(s) without a kept instance of every family, left out")
    if len(found) < 2:  # (fewer contexts than FOLDS: one fold each)
        raise InvalidInputError(f"{len(found)} contexts with instances and side drops; the report needs 2 or more")
    return found, notes


# --- report ----------------------------------------------------------------------------------------------------------

def kind_of(id: str) -> str:
    """A context's kind: its id's first part (``normx.data.contexts``: ``{kind}-{split}-{length}-{seed}-{n}``)."""
    return id.split("-", 1)[0]


def cv_lds(instances, families, lam: float, tying: str = "all") -> np.ndarray:
    """Each instance's LDS when left out (``fit.cross_validate``'s folds and fit; their mean is its number)."""
    from normx.methods.calibrated.fit import left_out_lds

    return left_out_lds(instances, families, lam, "logprob", FOLDS, tying)


def lasso_lds(instance) -> float:
    """A ContextCite-like reference: a LASSO (alpha 0.01, intercept) on the context's masks but 8, scored by the
    Spearman correlation on those 8, over 4 contiguous folds of its masks."""
    from normx.methods.ablation.lasso import lasso
    from normx.methods.calibrated.fit import spearman

    x, y = instance.masks.astype(np.float64), np.asarray(instance.y, np.float64)
    scores = []
    for test in np.array_split(np.arange(len(y)), LASSO_FOLDS):
        train = np.setdiff1d(np.arange(len(y)), test)
        weights, _ = lasso(x[train], y[train], LASSO_ALPHA)
        scores.append(spearman(x[test] @ weights, y[test]))
    return float(np.mean(scores))


def by_kind(scores: np.ndarray, kinds: np.ndarray, names: list[str]) -> str:
    return " | ".join(f"{scores[kinds == k].mean():.3f}" for k in names)


def report(args) -> int:
    instances, notes = study_instances(args, [*HEADS, "tokens", "source_knockout"])
    kinds = np.array([kind_of(inst.id) for inst in instances])
    names = sorted(set(kinds.tolist()))
    columns = ["all", *names]
    counts = ", ".join(f"{k} {int((kinds == k).sum())}" for k in names)
    lines = [f"{len(instances)} contexts ({counts}), {args.masks} masks each; {FOLDS}-fold cross-validation over "
             "contexts (contiguous folds in seed order), centred ridge (log-probability scaling), LDS = Spearman over "
             "each left-out context's masks", *(f"note: {n}" for n in notes), "",
             f"Per-source families (lambda {LAMBDA:g}):", "",
             f"| families | {' | '.join(columns)} |", "|---" * (1 + len(columns)) + "|"]

    def row(scores):
        return f"{scores.mean():.3f} | " + by_kind(scores, kinds, names)

    for families in SETS:
        lines.append(f"| {'+'.join(families)} | {row(cv_lds(instances, families, LAMBDA))} |")
    lambdas = " | ".join(f"lambda {lam:g}" for lam in LAMBDAS)
    for title, base in (("Per-head families alone (all contexts)", ()),
                        ("Per-head families added to tokens+source_knockout (all contexts)",
                         ("tokens", "source_knockout"))):
        lines += ["", f"{title}:", "", f"| families | tying | {lambdas} |", "|---" * (2 + len(LAMBDAS)) + "|"]
        for family in HEADS:
            for tying in TYINGS:
                cells = " | ".join(f"{cv_lds(instances, (*base, family), lam, tying).mean():.3f}" for lam in LAMBDAS)
                lines.append(f"| {'+'.join((*base, family))} | {tying} | {cells} |")
    reference = np.array([lasso_lds(inst) for inst in instances])
    lines += ["", f"ContextCite-like reference: per context, LASSO (alpha {LASSO_ALPHA:g}) on "
              f"{args.masks - args.masks // LASSO_FOLDS} masks, Spearman on the other {args.masks // LASSO_FOLDS} "
              f"({LASSO_FOLDS} folds):", "", f"| | {' | '.join(columns)} |", "|---" * (1 + len(columns)) + "|",
              f"| LASSO | {row(reference)} |", "",
              "Boosted trees over per-source features: not run (scikit-learn is no dependency of normx)."]
    text = "\n".join(lines) + "\n"
    print(text, end="", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=".report.", dir=args.out)
    with os.fdopen(handle, "w") as out:
        out.write(text)
    os.replace(temp, args.out / "report.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
