"""``normx calibrate MODEL --data DIR``: fit the ``calibrated_attention`` method's weights for a causal LM on
training contexts (:func:`normx.data.contexts.context_examples`, split ``train``: never the held-out rows the
evaluation reads) and write them: ``--store`` into normx's cache under the model's fingerprint (where the method
finds them), ``--out FILE`` anywhere (``weights=FILE``). Per context: the model's greedy answer, one pass for the
readings, ``--masks`` random source masks (one forward each); then the feature families, ridge lambda and outcome
scaling chosen by cross-validation over the contexts (:mod:`normx.methods.calibrated.fit`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from normx.bulk import processes
from normx.cli.options import add_model_flags, load
from normx.errors import InvalidInputError


def add_parser(sub, heavy: bool) -> argparse.ArgumentParser:
    parser = sub.add_parser("calibrate", help="fit calibrated_attention's weights for a causal LM on training "
                                              "contexts (random source removals)")
    parser.add_argument("model", metavar="MODEL", help="a causal-LM preset (`normx models`), a model folder or a "
                        "hub id")
    parser.add_argument("--data", default=None, help="the data folder with the GLUE files the contexts are built "
                        "from (default $NORMX_DATA)")
    parser.add_argument("--kinds", default="qa,claim", help="context kinds, comma-separated (qa, claim, copy, "
                        "instruction; default qa,claim)")
    parser.add_argument("--contexts", type=int, default=64, help="training contexts in all (default 64)")
    parser.add_argument("--length", type=int, default=300, help="context length in tokens (default 300)")
    parser.add_argument("--masks", type=int, default=32, help="random source masks per context, one forward pass "
                        "each (default 32)")
    parser.add_argument("--families", default="tokens,presence,response_norm", help="the feature families the "
                        "cross-validation chooses from: attention, norm, logit (one eager pass), knockout, "
                        "knockout_abs (one pass and one backward over the answer's rows), tokens, source_knockout, "
                        "query_knockout, reread, presence (per source: its size, the exact drop when the answer's "
                        "rows cannot read it, and when the query's rows after the context cannot either, its effect "
                        "in a surrogate of 8 balanced re-read ablations with positions closed up, the answer's slope "
                        "in its presence with every source half present to the last rows), response_norm (the norm "
                        "family summed over blocks and heads, read in the presence pass); default "
                        "tokens,presence,response_norm")
    parser.add_argument("--folds", type=int, default=5, help="cross-validation folds over contexts (default 5)")
    parser.add_argument("--max-new-tokens", type=int, default=12, help="the answer's length at most (default 12)")
    parser.add_argument("--seed", type=int, default=0, help="the contexts' and masks' seed (default 0)")
    parser.add_argument("--keep", default=None, metavar="DIR", help="keep each context's features and outcomes "
                        "here; a rerun with the same settings reuses them")
    parser.add_argument("--out", default=None, metavar="FILE", help="write the weights to this JSON file")
    parser.add_argument("--store", action="store_true", help="store the weights in normx's cache for this model "
                        "(where calibrated_attention finds them; refused for a model whose preset ships weights, "
                        "unless --replace-shipped)")
    parser.add_argument("--replace-shipped", action="store_true", help="with --store: store them even where a "
                        "preset ships weights for this model (they are read before the shipped ones)")
    add_model_flags(parser)
    return parser


def training_contexts(model, tokenizer, examples, max_new_tokens: int = 12, kept: set[str] = frozenset()
                      ) -> list[dict]:
    """Each example as the calibration reads it (the evaluation's own prompt, sources and greedy answer:
    :func:`normx.evaluation.context.readings.prepare`): ``{"id", "ids", "prompt_length", "spans"}``; only
    ``{"id"}`` for the ids in ``kept`` (their instances are kept already: no answer generated again)."""
    from normx.evaluation.context.readings import prepare

    found = []
    for example in examples:
        if example.id in kept:
            found.append({"id": example.id})
            continue
        prepared = prepare(model, tokenizer, example, max_new_tokens)
        found.append({"id": example.id, "ids": prepared.ids, "prompt_length": prepared.prompt_length,
                      "spans": [tuple(span) for span in prepared.spans]})
    return found


def check(args) -> tuple[list[str], list[str]]:
    from normx.data.contexts import KINDS
    from normx.methods.calibrated.readings import check_families

    if not (args.out or args.store):
        raise InvalidInputError("say where the weights go: --store (normx's cache) and/or --out FILE")
    if args.replace_shipped and not args.store:
        raise InvalidInputError("--replace-shipped is for --store")
    kinds = [k for k in args.kinds.split(",") if k]
    if not kinds or any(k not in KINDS for k in kinds):
        raise InvalidInputError(f"--kinds {args.kinds!r}: use some of {', '.join(KINDS)}")
    families = list(check_families([f for f in args.families.split(",") if f]))
    for flag, value, least in (("--contexts", args.contexts, 2), ("--masks", args.masks, 2),
                               ("--folds", args.folds, 2), ("--max-new-tokens", args.max_new_tokens, 1)):
        if value < least:
            raise InvalidInputError(f"{flag} must be at least {least}, got {value}")
    if args.folds > args.contexts:
        raise InvalidInputError(f"--folds {args.folds} is more than the {args.contexts} contexts")
    return kinds, families


def _collected(args, model, tokenizer, examples, families, keep: Path | None):
    """Every context's instance (its features and the outcomes of its masks), collected by this process alone or,
    under ``torchrun`` / ``accelerate launch``, by each process for the contexts ``i % world == rank``, kept in the
    shared ``keep`` folder and read back whole by rank 0 (the others get None). Resumable: kept contexts are read,
    not run again."""
    from normx.methods.calibrated import training

    rank, world = processes.rank_and_world()
    if world > 1:
        if keep is None:
            raise InvalidInputError("under torchrun / accelerate launch give --keep DIR, a folder every process "
                                    "reads: the processes share their contexts' ablations through it")
        print(f"normx calibrate: rank {rank} of {world}", file=sys.stderr)
    ids = [e.id for e in examples]
    kept = set() if keep is None else {inst.id for inst in training.kept_instances(
        keep, ids, masks=args.masks, seed=args.seed, families=families)}
    mine = [i for i in range(len(examples)) if i % world == rank]
    contexts = training_contexts(model, tokenizer, [examples[i] for i in mine], args.max_new_tokens, kept)
    instances = training.instances_for(model, tokenizer, contexts, masks=args.masks, seed=args.seed,
                                       families=families, keep=keep, indices=mine, progress=rank == 0)
    if world == 1:
        return instances
    processes.barrier()  # every share kept
    if rank != 0:
        return None
    instances = training.kept_instances(keep, ids, masks=args.masks, seed=args.seed, families=families)
    if [inst.id for inst in instances] != ids:
        missing = sorted(set(ids) - {inst.id for inst in instances})
        raise RuntimeError(f"normx calibrate: {len(missing)} context(s) missing from {keep} after every process "
                           f"finished: {missing[:5]}")
    return instances


def run(args) -> int:
    from normx.data.contexts import context_examples
    from normx.methods.calibrated import training
    from normx.methods.calibrated import weights as stored

    kinds, families = check(args)  # before the model loads
    examples = context_examples(kinds, "train", args.length, args.contexts, args.seed, args.data)
    model, tokenizer = load(args)
    if args.store and not args.replace_shipped:  # before the fit: stored weights come before a preset's shipped ones
        shipped = stored.shipped(model)
        if shipped is not None:
            raise InvalidInputError(
                f"{args.model} ships calibrated weights ({shipped}); --store would put these before them for every "
                "later run on this model: write them with --out FILE and use them by name (weights=FILE), or add "
                "--replace-shipped to store them anyway")
    keep = Path(args.keep) if args.keep else None
    created = processes.join(model)  # under torchrun / accelerate launch: each process collects a share
    try:
        instances = _collected(args, model, tokenizer, examples, families, keep)
    finally:
        if created:
            processes.leave()
    if instances is None:
        return 0  # another process fits
    described = {"data": "normx.data.contexts", "split": "train", "kinds": kinds, "length": args.length,
                 "seed": args.seed, "max_new_tokens": args.max_new_tokens,
                 "ids": [inst.id for inst in instances]}
    record, choice = training.fitted_record(model, instances, families, folds=args.folds, training=described)
    print(f"chosen: {'+'.join(choice.families)}, {choice.tying} weights, lambda {choice.lam:g}, scaling "
          f"{choice.scaling}; cross-validated "
          f"LDS on the training contexts {choice.cv_lds:.3f} ({len(instances)} contexts x {args.masks} masks)")
    if args.out:
        print(f"normx: wrote {stored.write(record, Path(args.out))}", file=sys.stderr)
    if args.store:
        file = stored.store(record)
        print(f"normx: stored {file}; calibrated_attention reads it for this model from now on"
              f"{' (before the weights its preset ships)' if args.replace_shipped else ''} (sha256 "
              f"{record['sha256'][:12]}; `rm {file}` undoes it)", file=sys.stderr)
    return 0
