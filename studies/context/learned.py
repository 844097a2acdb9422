"""Is more in the one-pass readings than the ridge finds? (#46) A small learned estimator, trained as AT2 trains
its own (each context's predicted outcomes against its real ones, Pearson over the masks), on the contexts an
earlier ``studies.context.explore collect`` kept, with the presence features ``studies.context.presence --keep``
wrote: a source's score is a function of its readings, either linear or a two-hidden-layer MLP, and the context's
prediction under a mask is the kept sources' scores summed (the form every normx method is read in). Features per
source: its tokens (log, share of the context's, raw), its presence (raw, over the context's spread, share of the
context's sizes), its ``norm`` and ``attention`` summed over blocks and heads (shares) and per block (shares over the
sources), its place (relative, first, last), the context's number of sources and the response's length (log).
Each estimator on all of them and on the first seven (tokens and presence only). 5 folds over contexts as
``presence``'s, each fold seeded; the LDS of the left-out contexts, all and per kind. Deterministic for a given
thread count::

    OMP_NUM_THREADS=2 python -m studies.context.learned --packed gpu_train_0.npz gpu_train_1.npz \\
        --side gpu_side.jsonl.gz --keep FILE.npz --out FILE
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from studies.context.explore import add_packed_options
from studies.settings import Printed, add_out_option

BASE = 7
MODELS = (("linear", 0), ("mlp", 32), ("mlp", 64))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.context.learned", description=__doc__.split("\n\n")[0])
    add_out_option(parser)
    add_packed_options(parser)
    parser.add_argument("--keep", type=Path, required=True, help="presence's features (.npz, from --keep there)")
    parser.add_argument("--masks", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=150)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import torch

    from normx.errors import NormxError
    from studies.context.explore import packed_study
    from studies.context.presence import attach

    torch.set_num_threads(args.threads)
    try:
        found, sides = packed_study(args.packed, args.side, args.masks, ["tokens", "norm", "attention"])
        attach(found, dict(np.load(args.keep)), args.keep)
    except (NormxError, OSError) as error:
        print(f"learned: error: {error}", file=sys.stderr)
        return 2
    features = [source_features(inst, sides[inst.id]) for inst in found]
    kinds = np.array([inst.id.split("-")[0] for inst in found])
    show = Printed(args.out)
    show(f"{len(found)} contexts, {args.masks} masks each, {features[0].shape[1]} features a source; 5-fold "
         f"cross-validated LDS; {args.epochs} epochs of AdamW (lr 3e-3, weight decay 1e-3, batches of 64)")
    show()
    show("| estimator | features | all | " + " | ".join(sorted(set(kinds))) + " |")
    show("|---|---|---|" + "---|" * len(set(kinds)))
    for kind, hidden in MODELS:
        for columns in ("all", "base"):
            chosen = [f if columns == "all" else f[:, :BASE] for f in features]
            lds = left_out(chosen, found, kind, hidden, args.epochs)
            by_kind = " | ".join(f"{lds[kinds == k].mean():.3f}" for k in sorted(set(kinds)))
            name = "linear" if kind == "linear" else f"MLP, 2 x {hidden}"
            show(f"| {name} | {columns} | {lds.mean():.3f} | {by_kind} |")
    show.save()
    return 0


def source_features(inst, record: dict) -> np.ndarray:
    """[sources, 73] float32 from an instance's ``norm``, ``attention`` and ``presence`` families and its side record,
    the module docstring's features in its order (the first ``BASE`` tokens' and presence's)."""
    presence = inst.features["presence"][:, 0, 0]
    spans = np.asarray(record["spans"], dtype=np.float64)
    count, response = len(spans), len(record["ids"]) - record["prompt_length"]
    tokens = spans[:, 1] - spans[:, 0]
    norm, attention = inst.features["norm"].sum(2), inst.features["attention"].sum(2)  # [sources, blocks]

    def share(x):
        return x / (np.abs(x).sum() + 1e-12)

    index = np.arange(count)
    columns = [np.log(tokens), tokens / tokens.sum(), tokens / 50, presence / (presence.std() + 1e-9) / 10,
               presence * 10, share(presence), share(norm.sum(1)), share(attention.sum(1)), (index + 0.5) / count,
               index == 0, index == count - 1, np.full(count, count / 10), np.full(count, np.log(response))]
    blocks = [norm / (np.abs(norm).sum(0, keepdims=True) + 1e-12),
              attention / (attention.sum(0, keepdims=True) + 1e-12)]
    return np.column_stack(columns + blocks).astype(np.float32)


def left_out(features: list[np.ndarray], instances: list, kind: str, hidden: int, epochs: int) -> np.ndarray:
    """Each context's LDS when its fold is left out (the 5 contiguous folds of :func:`~normx.methods.calibrated.fit.
    folds_of`, as ``presence``'s), the estimator trained on the other folds with a Pearson loss per context."""
    import torch

    from normx.methods.calibrated.fit import folds_of, spearman

    count, width = len(features), features[0].shape[1]
    most = max(f.shape[0] for f in features)
    masks = instances[0].masks.shape[0]
    x = torch.zeros(count, most, width)
    kept = torch.zeros(count, masks, most)
    y = torch.zeros(count, masks)
    for i, (f, inst) in enumerate(zip(features, instances)):
        x[i, :len(f)] = torch.from_numpy(f)
        kept[i, :, :len(f)] = torch.from_numpy(inst.masks.astype(np.float32))
        y[i] = torch.from_numpy(inst.y.astype(np.float32))
    lds = np.zeros(count)
    for fold, test in enumerate(folds_of(count, 5)):
        train = np.setdiff1d(np.arange(count), test)
        torch.manual_seed(fold)
        model = torch.nn.Linear(width, 1) if kind == "linear" else torch.nn.Sequential(
            torch.nn.Linear(width, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, hidden), torch.nn.GELU(),
            torch.nn.Linear(hidden, 1))
        optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-3)
        for _ in range(epochs):
            order = torch.from_numpy(train)[torch.randperm(len(train))]
            for start in range(0, len(order), 64):
                batch = order[start:start + 64]
                predicted = torch.einsum("bmn,bn->bm", kept[batch], model(x[batch]).squeeze(-1))
                loss = 1 - pearson(predicted, y[batch]).mean()
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
        with torch.no_grad():
            predicted = torch.einsum("bmn,bn->bm", kept[test], model(x[test]).squeeze(-1))
        for i, row in zip(test, predicted.numpy()):
            lds[i] = spearman(row, y[i].numpy())
    return lds


def pearson(a, b):
    """Pearson correlation of each row of ``a`` with the same row of ``b``."""
    a, b = a - a.mean(1, keepdim=True), b - b.mean(1, keepdim=True)
    return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1) + 1e-9)


if __name__ == "__main__":
    raise SystemExit(main())
