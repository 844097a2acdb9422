"""Context methods read as a user reads them, on layouts no method was fitted on: LDS against real source removals
and cost in plain forward passes (#56's check, rebuilt).

Each context (built from the shared GLUE files, ``normx.data.contexts``) is laid out with no chat template:

- ``sentences``: ``"Context: s1 s2 ... sk\\nQuestion: q\\nAnswer:"``, one sentence a source (~300 tokens);
- ``passages``: ``"Context:\\n\\np1\\n\\n...\\n\\np8\\n\\nQuestion: q\\nAnswer:"``, the evidence passage and seven
  others of 4 sentences each, one passage a source (~1,000-1,450 tokens);
- ``documents``: the same with every passage of a context built to ``--length`` tokens (10-17 passages at 2,000).

SmolLM2's greedy answer (8 new tokens, the end-of-text token left out) is the response. Every method runs as
``normx.explain_generation(model, tokenizer, prompt, method=NAME, target=response_ids, **options)``, with no options
unless the method spec gives some (``contextcite:n_ablations=32``); a source's score is the sum of its tokens' rows
over the steps. LDS: Spearman, over 32 random masks (``normx.evaluation.context.metrics.lds_masks``, each source
kept with probability 0.5), between the sum of the kept sources' scores and the response's log-probability with the
removed sources' tokens left out (whole forward passes). Cost: the method's wall time over the mean of two plain
forward passes (``model(input_ids=ids)``, logits at every position) timed right before and right after it, one run
each, ``--threads`` torch threads (records before 2026-11-29 have ``"timing"`` unset: the faster of two forward passes
timed before the context's first method). The process's first call also does its first-use work (imports, the
model's checks, the tokenizer's tables: ``"first_call"`` in its record). ``--retime`` runs the methods a record
already has again, timed so, keeps the first timing as ``cost_first`` and checks that the scores are the recorded
ones (the methods are deterministic).

    python -m studies.context.budget --layout sentences --split heldout --count 16 --data DATA --out FILE
    python -m studies.context.budget --layout passages --split heldout --count 6 --data DATA --out FILE
    python -m studies.context.budget --layout documents --length 2000 --split heldout --count 6 --data DATA \\
        --methods "budgeted contextcite@32 calibrated_attention random position" --out FILE
    python -m studies.context.budget --layout passages --split heldout --count 6 --data DATA \\
        --methods "budgeted:seed=0" --retime --out FILE   # FILE holds those records: their cost timed again
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from studies.settings import add_data_option, data_folder, provenance

METHODS = ("budgeted", "budgeted:sources=given", "budgeted:budget=fast", "contextcite@32", "calibrated_attention",
           "random", "position")
HEADS = {"sentences": ("Context: ", " ", "\nQuestion: {query}\nAnswer:"),
         "passages": ("Context:\n\n", "\n\n", "\n\nQuestion: {query}\nAnswer:")}
HEADS["documents"] = HEADS["passages"]
_CALLED: list[str] = []  # the methods called so far in this process (its first call does the first-use work)


def layout(example, how: str) -> tuple[str, list[tuple[int, int]]]:
    """The prompt and each source's character span in it."""
    sources = list(example.sources)
    if how == "passages":
        evidence = example.evidence[0]
        chosen = sorted([*[i for i in range(len(sources)) if i != evidence][:7], evidence])
        sources = [sources[i] for i in chosen]
    head, sep, tail = HEADS[how]
    text, spans = head, []
    for i, source in enumerate(sources):
        text += sep if i else ""
        spans.append((len(text), len(text) + len(source)))
        text += source
    return text + tail.format(query=example.query), spans


def laid_out(model, tokenizer, example, how: str) -> tuple[str, list[int], list[tuple[int, int]], list[int]]:
    """(the prompt, its ids, each source's token span, SmolLM2's greedy answer: 8 new tokens, the end-of-text token
    left out; empty where the model ends its answer at once)."""
    import torch

    prompt, chars = layout(example, how)
    encoded = tokenizer(prompt, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), encoded["offset_mapping"]
    spans = []
    for a, b in chars:
        inside = [i for i, (x, y) in enumerate(offsets) if y > x and a <= y - 1 < b]
        spans.append((inside[0], inside[-1] + 1))
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones_like(torch.tensor([ids])),
                             max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    response = out[0, len(ids):].tolist()
    while response and response[-1] == tokenizer.eos_token_id:
        response.pop()
    return prompt, ids, spans, response


def parse(spec: str) -> tuple[str, dict]:
    name, _, rest = spec.partition(":")
    options = {}
    for part in filter(None, rest.split(",")):
        key, _, value = part.partition("=")
        options[key] = int(value) if value.lstrip("-").isdigit() else value
    return name, options


def call_of(spec: str, spans: list[tuple[int, int]]) -> tuple[str, dict]:
    """The method name and options a spec calls, with the check's own token ``spans`` where it asks for them."""
    name, options = parse(spec)
    if name.startswith("contextcite@"):  # ContextCite's estimator given the check's own sources
        name, options = "contextcite", {"n_ablations": int(name.split("@")[1]), "sources": spans, **options}
    if options.get("sources") == "given":  # the check's own sources, as explain_context gives them
        options["sources"] = [list(span) for span in spans]
    return name, options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.context.budget", description=__doc__.split("\n\n")[0])
    add_data_option(parser)
    parser.add_argument("--out", type=Path, required=True, help="the JSON lines to write (one per context), and "
                        "FILE.md the table")
    parser.add_argument("--layout", choices=tuple(HEADS), default="sentences")
    parser.add_argument("--split", choices=("train", "heldout"), default="heldout")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=16)
    parser.add_argument("--kinds", default="qa,claim")
    parser.add_argument("--methods", default=",".join(METHODS).replace(",", " "), help="space-separated specs")
    parser.add_argument("--masks", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--length", type=int, default=2000, help="documents: the tokens a context is built to")
    parser.add_argument("--retime", action="store_true", help="time the methods the records in --out have again, "
                        "between two forward passes, and check their scores")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    import normx
    from normx.data.contexts import context_examples
    from normx.evaluation.context import metrics
    from normx.evaluation.context.readings import Prepared, response_outcomes

    torch.set_num_threads(args.threads)
    model, tokenizer = normx.load_model("smollm2")
    length = {"sentences": 300, "passages": 2000}.get(args.layout, args.length)
    examples = context_examples(args.kinds.split(","), args.split, length, args.first + args.count, 0,
                                data_folder(args.data))[args.first:]
    specs = args.methods.split()
    done = {}
    if args.out.exists():
        for line in args.out.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            done[record["id"]] = record
    for example in examples:
        if args.retime != (example.id in done and all(s in done[example.id]["methods"] for s in specs)):
            continue  # (retiming: only the contexts recorded with every method asked for)
        prompt, ids, spans, response = laid_out(model, tokenizer, example, args.layout)
        if not response:  # the model ended its answer at once: no outcome to remove sources from
            print(f"{example.id}: the model answered nothing; left out", flush=True)
            continue
        whole = ids + response
        masks = metrics.lds_masks(len(spans), args.masks, 0)
        kept = done.get(example.id, {})
        if kept.get("truth") is not None and len(kept["truth"]) == len(masks):  # the real removals, measured before
            truth = np.asarray(kept["truth"])
        else:
            prepared = Prepared(example, prompt, whole, len(ids), spans, tokenizer.decode(response), chat=False)
            truth = response_outcomes(model, tokenizer, prepared, masks)[0]
        record = done.get(example.id) or {  # (a recorded context keeps the forward timed when it was first run)
            "id": example.id, "tokens": len(whole), "sources": len(spans), "response": tokenizer.decode(response),
            "forward_s": min(_forward_seconds(model, whole) for _ in range(2)), "methods": {}}
        forward = record["forward_s"]
        if record["response"] != tokenizer.decode(response):
            raise RuntimeError(f"{example.id}: the model answered {tokenizer.decode(response)!r}, recorded "
                               f"{record['response']!r}")
        record["truth"] = [float(v) for v in truth]
        for spec in specs:
            if spec in record["methods"] and not args.retime:
                continue
            name, options = call_of(spec, spans)
            if args.retime and name in ("random", "position"):
                continue  # (no call to time)
            scores, took, settings, around = _run(model, tokenizer, prompt, name, options, response, whole, spans,
                                                  forward, len(done))
            recorded = record["methods"].get(spec)
            scale = 1e-3 * (np.abs(scores).max() + 1e-12)  # (float rounding differs between CPUs)
            if recorded is not None and not np.allclose(scores, recorded["scores"], rtol=1e-3, atol=scale):
                raise RuntimeError(f"{example.id} {spec}: scores {scores.tolist()} where {recorded['scores']} were "
                                   "recorded; a deterministic method read otherwise")
            timing = {"cost": took / float(np.mean(around)), "timing": "bracketed", "forward_around_s": around}
            if recorded is not None:
                timing["cost_first"] = recorded.get("cost_first", recorded["cost"])
            record["methods"][spec] = {"lds": metrics.lds(scores, masks, truth), "scores": scores.tolist(),
                                       **settings, **timing}
            print(f"{example.id} {spec}: LDS {record['methods'][spec]['lds']:.3f} cost "
                  f"{record['methods'][spec]['cost']:.2f}", flush=True)
        done[example.id] = record
        args.out.write_text("".join(json.dumps(r) + "\n" for r in done.values()), encoding="utf-8")
    table = summary([done[e.id] for e in examples if e.id in done], specs, args)
    Path(str(args.out) + ".md").write_text(table, encoding="utf-8")
    print(table)
    return 0

def _forward_seconds(model, ids: list[int]) -> float:
    """One plain forward pass over ``ids`` (logits at every position), timed."""
    import torch

    started = time.perf_counter()
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]))
    return time.perf_counter() - started


def _run(model, tokenizer, prompt: str, name: str, options: dict, response: list[int], whole: list[int],
         spans: list[tuple[int, int]], forward: float, seed: int) -> tuple:
    """(source scores, the call's seconds, its settings, the forward passes' seconds right before and after it)
    of one method as a user calls it (``random`` and ``position``: no call)."""
    import numpy as np

    import normx

    if name in ("random", "position"):
        scores = (np.arange(len(spans), dtype=float) if name == "position"
                  else np.random.default_rng([0, 7, seed]).random(len(spans)))
        return scores, 0.0, {}, [forward, forward]
    before = _forward_seconds(model, whole)
    first = not _CALLED
    _CALLED.append(name)
    started = time.perf_counter()
    generation = normx.explain_generation(model, tokenizer, prompt, method=name, target=response, **options)
    took = time.perf_counter() - started
    around = [before, _forward_seconds(model, whole)]
    if list(generation.token_ids) != whole:
        raise RuntimeError(f"{name} read other ids")
    rows = np.nan_to_num(np.asarray(generation.scores[0], np.float64))
    scores = np.array([rows[:, a:b].sum() for a, b in spans])
    settings = {k: generation.settings.get(k) for k in ("masks", "passes", "shared_prefix", "prior", "prior_scores",
                                                        "prior_shared", "design", "outcomes", "groups", "rereading")
                if k in generation.settings}
    if first:  # its time holds the process's first-use work (imports, the model's checks, the tokenizer's tables)
        settings["first_call"] = True
    return scores, took, settings, around


def summary(records: list[dict], specs: list[str], args) -> str:
    import numpy as np

    lines = [f"{len(records)} {args.split} contexts, layout `{args.layout}`, SmolLM2-135M-Instruct (fp32, "
             f"{args.threads} threads); provenance {provenance()['commit'][:10]}", "",
             "| method | LDS | cost (× a forward) | masks |", "|---|---|---|---|"]
    for spec in specs:
        got = [r["methods"][spec] for r in records if spec in r["methods"]]
        if not got:
            continue
        lds = np.array([g["lds"] for g in got])
        cost = np.array([g["cost"] for g in got])
        masks = [g["masks"] for g in got if "masks" in g]
        lines.append(f"| `{spec}` | {lds.mean():.3f} ± {lds.std(ddof=1) / np.sqrt(len(lds)) if len(lds) > 1 else 0:.3f}"
                     f" | {cost.mean():.2f} | {f'{np.mean(masks):.1f}' if masks else '—'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
