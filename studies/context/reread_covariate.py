"""Whether re-read ablations pay for the real masks they displace in ``budgeted`` (#56), without running its masks
again: for contexts a run of :mod:`studies.context.budget` recorded (``budgeted``'s design, its masks' outcomes,
what it counted, and the context's 32 real removals), the design's masks and ``--extra`` more (a fold-over design,
seed 1000) are re-read on one cache from the context's end (the question's rows and the response's, every removed
source hidden from them and the positions closed up: :func:`normx.methods.decoder.rereads.masked_rereads`; a
Spearman of about 0.83 with the real outcomes, docs/context.md). Then refitted:

- ``budgeted`` as it fits (:func:`normx.methods.ablation.budgeted.surrogate`: Huber's loss on the log of the loss);
- *the covariate fit* (:func:`normx.methods.ablation.surrogate_fit.covariate`, as ``budgeted(rereads="auto")`` fits
  it): each real mask's log-loss regressed on its own re-read log-loss and on the masks (a ridge
  ``--lambda`` on the sources' corrections only); a source's weight is the slope times its weight in the surrogate of
  every re-read (Huber's, on the log of the loss), plus its correction: the re-reads' surrogate, corrected by the
  real masks where it is off;
- the same *paid for*: the design's last real masks left out until their cost (what the run counted per mask)
  covers the re-reads' (SmolLM2's work per token, :class:`normx.methods.ablation.planning.Costs`: each re-read its
  rows, their attention to every key, the head at the response, a share of its pass), as a budget would spend it.

Where the run's masks removed groups of sources, the re-reads are of the sources themselves (the groups' masks, and
extra masks of every source), the covariate's corrections are the groups', shared by their sources by tokens, and
``budgeted``'s weights are its groups' spread alike. ``--keep-positions``: re-read with the removed tokens only
hidden, the positions kept (as ``budgeted`` re-reads, packed on its whole pass's cache:
:mod:`normx.methods.ablation.rereads`).

Each LDS against the context's 32 real removals, paired with ``budgeted``'s and ContextCite-32's::

    python -m studies.context.reread_covariate --records FILE [FILE ...] --layout passages --split heldout \\
        --data DATA --out FILE.jsonl   # FILE.jsonl: the re-read outcomes (resumable); FILE.jsonl.md the table
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from studies.settings import add_data_option, data_folder, provenance

SPEC = "budgeted:budget=6.0,seed=0"  # the label of the default call's runs on the passage files (17b522c on)
EXTRA_SEED = 1000
PER_PASS = 8  # re-reads batched a pass (masked_rereads' batch size)


def _on_sources(design: np.ndarray, groups: list[list[int]] | None) -> np.ndarray:
    """A design over groups of sources (a run's ``groups``) as masks of the sources themselves."""
    if not groups:
        return design
    from normx.methods.ablation.surrogate_fit import group_columns

    return design[:, group_columns(groups)]


def reread_cost(total: int, first_row: int, steps: int, costs) -> float:
    """One re-read in plain forward passes: its rows (from ``first_row`` to the sequence's last but one), their
    attention to every key before them, the head at the response's positions and its share of a pass's call."""
    from normx.methods.ablation.prefix import CALL_ROWS

    rows, keys = total - 1 - first_row, total - 1
    work = rows * costs.body + costs.attention * rows * keys + steps * costs.head + CALL_ROWS / PER_PASS * costs.body
    return work / costs.plain(total)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.context.reread_covariate",
                                     description=__doc__.split("\n\n")[0])
    add_data_option(parser)
    parser.add_argument("--records", type=Path, nargs="+", required=True, help="studies.context.budget's JSON lines")
    parser.add_argument("--out", type=Path, required=True, help="the re-read outcomes (JSON lines, resumable); "
                        "FILE.md the table")
    parser.add_argument("--layout", default="passages")
    parser.add_argument("--split", choices=("train", "heldout"), default="heldout")
    parser.add_argument("--length", type=int, default=2000, help="as the records' run built its contexts")
    parser.add_argument("--extra", type=int, nargs="+", default=[16, 32], help="re-read masks beside the design's")
    parser.add_argument("--lambda", dest="strength", type=float, default=1.0)
    parser.add_argument("--spec", default=SPEC, help="the recorded budgeted runs read (their design and outcomes)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep-positions", action="store_true", help="re-read with the removed tokens only hidden, "
                        "the positions kept (masked_rereads' close_up=False)")
    args = parser.parse_args(argv)

    import torch

    import normx
    from normx.core.handle import model_handle
    from normx.data.contexts import context_examples
    from normx.methods.ablation import designs
    from normx.methods.decoder.rereads import masked_rereads
    from studies.context.budget import laid_out

    torch.set_num_threads(args.threads)
    model, tokenizer = normx.load_model("smollm2")
    handle = model_handle(model)
    recorded = [json.loads(line) for file in args.records for line in file.read_text(encoding="utf-8").splitlines()]
    recorded = [r for r in recorded if r.get("truth") and args.spec in r["methods"]]
    examples = {e.id: e for e in context_examples(["qa", "claim"], args.split, args.length, 64, 0,
                                                  data_folder(args.data))}
    done = {}
    if args.out.exists():
        done = {r["id"]: r for r in map(json.loads, args.out.read_text(encoding="utf-8").splitlines())}
    most = max(args.extra)
    for record in recorded:
        run = record["methods"][args.spec]
        design = np.array(run["design"], bool)
        have = done.get(record["id"], {})
        if have.get("spec") == args.spec and len(have["extra"]) >= most:
            continue  # (re-read already)
        design = _on_sources(design, run.get("groups"))
        if design.shape[1] != record["sources"]:
            continue  # (its sources are not the check's: sentences found otherwise)
        _, ids, spans, response = laid_out(model, tokenizer, examples[record["id"]], args.layout)
        if tokenizer.decode(response) != record["response"]:
            raise RuntimeError(f"{record['id']}: the model answered {tokenizer.decode(response)!r}, recorded "
                               f"{record['response']!r}")
        extra = designs.masks(len(spans), most, EXTRA_SEED, "fold_over")
        first_row = max(b for _, b in spans)
        log_p, _ = masked_rereads(handle, ids + response, len(ids), [list(range(a, b)) for a, b in spans],
                                  np.vstack([design, extra]), "reread_covariate", first_row, PER_PASS,
                                  close_up=not args.keep_positions)
        done[record["id"]] = {"id": record["id"], "spec": args.spec, "tokens": len(ids) + len(response),
                              "first_row": first_row, "sizes": [b - a for a, b in spans],
                              "steps": len(response), "extra": extra.astype(int).tolist(),
                              "reread": log_p.sum(1).tolist()}
        print(f"{record['id']}: {len(design) + len(extra)} re-reads", flush=True)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in done.values()), encoding="utf-8")
    table = summary(recorded, done, args, model)
    Path(str(args.out) + ".md").write_text(table, encoding="utf-8")
    print(table)
    return 0


def summary(recorded: list[dict], done: dict, args, model) -> str:
    from normx.evaluation.context import metrics
    from normx.methods.ablation.planning import Costs, whole_cost
    from normx.methods.ablation.surrogate_fit import covariate, fit, log_loss, spread, surrogate

    costs = Costs.of(model)

    rows: dict[str, list[float]] = {}
    for record in (r for r in recorded if done.get(r["id"], {}).get("spec") == args.spec):
        run, reread = record["methods"][args.spec], done[record["id"]]
        design, real = np.array(run["design"], bool), np.array(run["outcomes"])
        groups = run.get("groups") or [[j] for j in range(design.shape[1])]
        shares = spread(groups, reread.get("sizes") or [1] * record["sources"])
        z, extra = np.array(reread["reread"]), np.array(reread["extra"], bool)
        masks = metrics.lds_masks(record["sources"], len(record["truth"]), 0)
        truth = np.array(record["truth"])

        def lds(weights, masks=masks, truth=truth) -> float:
            return metrics.lds(weights, masks, truth)

        rows.setdefault("budgeted", []).append(lds(shares @ surrogate(design, real)))
        on_sources = _on_sources(design, run.get("groups"))
        rows.setdefault("ContextCite-32", []).append(record["methods"].get("contextcite@32", {}).get("lds", np.nan))
        whole = whole_cost(reread["tokens"] - reread["steps"], reread["steps"], costs)
        per_real = (run["passes"] - whole) / run["masks"]
        per_reread = reread_cost(reread["tokens"], reread["first_row"], reread["steps"], costs)
        for more in args.extra:
            cut = 0
            while (len(design) - cut + more) * per_reread > cut * per_real and cut < len(design) - 2:
                cut += 1
            for label, kept in (("free", len(design)), ("paid for", len(design) - cut)):
                read = np.concatenate([z[:kept], z[len(design):len(design) + more]])
                weights = fit(np.vstack([on_sources[:kept], extra[:more]]), -log_loss(read))
                found = covariate(design[:kept], -log_loss(real[:kept]), -log_loss(z[:kept]), weights, shares,
                                  args.strength)
                rows.setdefault(f"covariate, {more} more re-reads, {label}", []).append(lds(-real[0] * found))
            rows.setdefault(f"real masks left out for {more} more", []).append(cut)
    if not rows:
        return f"no {args.split} context of these records has `{args.spec}`'s masks on the check's sources\n"
    base, peer = np.array(rows["budgeted"]), np.array(rows["ContextCite-32"])
    lines = [f"{len(base)} {args.split} contexts, layout `{args.layout}`, SmolLM2-135M-Instruct, `{args.spec}`'s "
             f"masks, ridge {args.strength}; provenance {provenance()['commit'][:10]}", "",
             "| fit | LDS | − budgeted, paired (better / worse) | − ContextCite-32, paired |", "|---|---|---|---|"]
    for name, values in rows.items():
        v = np.array(values, np.float64)
        if name.startswith("real masks"):
            lines.append(f"| {name} | {v.mean():.2f} (mean) | | |")
            continue
        v, own, other = v[~np.isnan(v)], (v - base)[~np.isnan(v)], (v - peer)[~np.isnan(v - peer)]
        if not len(v):
            continue  # (ContextCite-32 where no record has it)
        versus = f"{other.mean():+.3f} ± {_error(other):.3f}" if len(other) else "—"
        lines.append(f"| {name} | {v.mean():.3f} ± {_error(v):.3f} | {own.mean():+.3f} ± {_error(own):.3f} "
                     f"({(own > 0).sum()} / {(own < 0).sum()}) | {versus} |")
    return "\n".join(lines) + "\n"


def _error(values: np.ndarray) -> float:
    """The mean's standard error."""
    return float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else 0.0


if __name__ == "__main__":
    raise SystemExit(main())
