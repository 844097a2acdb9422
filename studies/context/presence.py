"""The ``presence`` family on many training contexts (#46): for the contexts an earlier ``studies.context.explore
collect`` kept (features, the real outcomes under 32 masks, and the side lines' ids, spans and ``q0`` drops), each
source's presence gradient (:func:`normx.methods.calibrated.training.source_features` with ``presence``: the slope
of the response's log-probability in the source's log-presence, every source half present to the last rows, within
the family's row budget), then the per-source family sets cross-validated as ``explore report`` does (ridge,
centred, 5 contiguous folds over contexts; the best lambda of a few per set, and with ``--spread`` the better of the
log-probability and per-context spread scalings), all contexts and per kind. ``response_norm`` is the packed
``norm`` family summed over blocks and heads (what the ``response_norm`` family reads in the presence pass). The
presence features are kept in ``--keep`` (one .npz, written whole and reused). ``--probes`` (with ``--spread``) adds
per-source quantities a removal's effect might hang on beside ``tokens`` + ``presence`` + ``response_norm``: the
source's place (relative, first, last, tokens after it), the rank and the positive part of its presence, its tokens
times the response's length, and the set fitted within each kind alone. Deterministic::

    OMP_NUM_THREADS=2 python -m studies.context.presence --packed gpu_train_0.npz gpu_train_1.npz \\
        --side gpu_side.jsonl.gz --keep FILE.npz --out FILE
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from studies.context.explore import add_packed_options
from studies.settings import Printed, add_out_option

SETS = (("tokens",), ("presence",), ("tokens", "source_knockout"), ("tokens", "q0"), ("tokens", "presence"),
        ("tokens", "source_knockout", "presence"), ("tokens", "q0", "presence"))
NORM_SETS = (("tokens", "response_norm"), ("tokens", "presence", "response_norm"))
SHIPPED = ("tokens", "presence", "response_norm")
PROBES = ("place", "first", "last", "after", "rank", "positive", "tokens_x_response")
LAMBDAS = (0.01, 0.1, 1.0, 10.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.context.presence", description=__doc__.split("\n\n")[0])
    add_out_option(parser)
    add_packed_options(parser)
    parser.add_argument("--keep", type=Path, required=True, help="the presence features (.npz), reused by a rerun")
    parser.add_argument("--count", type=int, default=0, help="the first COUNT contexts in seed order (0: all)")
    parser.add_argument("--masks", type=int, default=32)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--spread", action="store_true", help="also the per-context spread scaling, lambda to 100, "
                        "and the response_norm sets")
    parser.add_argument("--probes", action="store_true", help="with --spread: the shipped set plus each probe "
                        "feature, and the shipped set fitted per kind")
    args = parser.parse_args(argv)

    import torch
    from tqdm.auto import tqdm

    import normx
    from normx.errors import NormxError
    from normx.methods.calibrated import training
    from normx.methods.calibrated.fit import left_out_lds
    from studies.context.explore import packed_study

    torch.set_num_threads(args.threads)
    try:
        found, sides = packed_study(args.packed, args.side, args.masks,
                                    ["tokens", "source_knockout", *(["norm"] if args.spread else [])])
    except NormxError as error:
        print(f"presence: error: {error}", file=sys.stderr)
        return 2
    found = found[:args.count] if args.count else found
    kept = dict(np.load(args.keep)) if args.keep.is_file() else {}
    model = None
    began = time.perf_counter()
    for inst in tqdm(found, desc="presence"):
        if inst.id not in kept:
            if model is None:
                model, _ = normx.load_model(args.model)
            record = sides[inst.id]
            kept[inst.id] = training.source_features(model, record["ids"], record["prompt_length"], record["spans"],
                                                     ["presence"])["presence"][:, 0, 0]
            if len(kept) % 50 == 0:
                _write(kept, args.keep)
    _write(kept, args.keep)
    seconds = time.perf_counter() - began
    try:
        attach(found, kept, args.keep, response_norm=args.spread)
    except NormxError as error:
        print(f"presence: error: {error}", file=sys.stderr)
        return 2
    if args.probes:
        for inst in found:
            inst.features.update(probes(sides[inst.id], kept[inst.id]))
    lambdas, scalings = ((*LAMBDAS, 100.0), ("logprob", "spread")) if args.spread else (LAMBDAS, ("logprob",))
    kinds = np.array([inst.id.split("-")[0] for inst in found])
    show = Printed(args.out)
    show(f"{len(found)} contexts ({', '.join(f'{k} {int((kinds == k).sum())}' for k in sorted(set(kinds)))}), "
         f"{args.masks} masks each; 5-fold cross-validated LDS, the best lambda of {lambdas} and scaling of "
         f"{scalings} ({seconds:.0f} s)")
    show()
    show("| families | all | " + " | ".join(sorted(set(kinds))) + " | lambda | scaling |")
    show("|---|---|" + "---|" * len(set(kinds)) + "---|---|")
    extra = tuple((*SHIPPED, probe) for probe in PROBES) if args.probes and args.spread else ()
    for families in SETS + (NORM_SETS if args.spread else ()) + extra:
        scores = {(lam, how): left_out_lds(found, families, lam, how) for lam in lambdas for how in scalings}
        lam, how = max(scores, key=lambda key: (scores[key].mean(), key[0]))
        by_kind = " | ".join(f"{scores[lam, how][kinds == k].mean():.3f}" for k in sorted(set(kinds)))
        show(f"| {' + '.join(families)} | {scores[lam, how].mean():.3f} | {by_kind} | {lam:g} | {how} |")
    if args.probes and args.spread:
        alone = []
        for kind in sorted(set(kinds)):  # (cross-validation needs 2 contexts of the kind)
            part = [inst for inst, k in zip(found, kinds) if k == kind]
            best = max(left_out_lds(part, SHIPPED, lam, how).mean() for lam in lambdas for how in scalings) if len(
                part) > 1 else None
            alone.append("—" if best is None else f"{best:.3f}")
        show(f"| {' + '.join(SHIPPED)}, fitted within each kind | — | {' | '.join(alone)} | best per kind | best per "
             "kind |")
    show.save()
    return 0


def attach(found: list, kept: dict[str, np.ndarray], path: Path, response_norm: bool = False) -> None:
    """Each instance's ``presence`` feature from ``kept`` (read from ``path``; one value a source, every context
    there, else an InvalidInputError naming the file), and with ``response_norm`` its ``norm`` family summed over
    blocks and heads in that family's place."""
    from normx.errors import InvalidInputError

    for inst in found:
        if inst.id not in kept:
            raise InvalidInputError(f"{path} has no presence for {inst.id}: run studies.context.presence with it first")
        if kept[inst.id].shape != (inst.masks.shape[1],):
            raise InvalidInputError(f"{path} holds {kept[inst.id].shape} for {inst.id}")
        inst.features["presence"] = kept[inst.id][:, None, None].astype(np.float64)
        if response_norm:
            inst.features["response_norm"] = inst.features.pop("norm").sum((1, 2))[:, None, None]


def probes(record: dict, presence: np.ndarray) -> dict[str, np.ndarray]:
    """Per-source probe features [sources, 1, 1] from a side line (ids, prompt_length, spans) and the presence."""
    spans = np.asarray(record["spans"], dtype=np.float64)
    count, prompt = len(spans), record["prompt_length"]
    tokens = spans[:, 1] - spans[:, 0]
    index = np.arange(count)
    values = {"place": (index + 0.5) / count, "first": (index == 0) * 1.0, "last": (index == count - 1) * 1.0,
              "after": prompt - spans[:, 1], "rank": np.argsort(np.argsort(-presence)) / count,
              "positive": np.maximum(presence, 0.0), "tokens_x_response": tokens * (len(record["ids"]) - prompt)}
    return {name: value.astype(np.float64)[:, None, None] for name, value in values.items()}


def _write(kept: dict[str, np.ndarray], path: Path) -> None:
    """The features file, written whole through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".npz")
    try:
        with os.fdopen(handle, "wb") as out:
            np.savez(out, **kept)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


if __name__ == "__main__":
    raise SystemExit(main())
