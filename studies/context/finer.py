"""Which sentence the answer came from, inside passages: ``budgeted``'s finer stage (``finer="sentences"``) against
the passages alone and against sentences as the sources from the start, at the same budget, by planted evidence.

The contexts are ``studies.context.budget``'s passages (8 passages of ~4 sentences, ~1,000-1,450 tokens, the
question after them; held out; the ``qa`` kind, whose evidence is one answering sentence in one passage). Each
method runs as a user calls it (``normx.explain_generation(model, tokenizer, prompt, method="budgeted",
target=answer_ids, **options)``); a sentence's score is the sum of its tokens' rows. Read: the evidence sentence's
rank among the context's sentences (1 = top; the others as ``split_text`` finds them, the evidence the example's
own ``evidence_text``, found in its passage), the share of contexts where it is first, and where its passage is
first.

    python -m studies.context.finer --data DATA --count 8 --out FILE
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from studies.context.budget import layout
from studies.settings import add_data_option, data_folder, provenance

SPECS = ("passages", "passages, then sentences", "sentences")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.context.finer", description=__doc__.split("\n\n")[0])
    add_data_option(parser)
    parser.add_argument("--out", type=Path, required=True, help="the JSON lines to write (one per context), and "
                        "FILE.md the table")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--budget", default="balanced")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    import normx
    from normx.data.contexts import context_examples
    from normx.methods.ablation.sources import split_text

    torch.set_num_threads(args.threads)
    model, tokenizer = normx.load_model("smollm2")
    examples = context_examples(["qa"], "heldout", 2000, args.first + args.count, 0, data_folder(args.data))
    records, skipped = [], []
    for example in examples[args.first:]:
        prompt, chars = layout(example, "passages")
        shown = example.sources[example.evidence[0]]  # (the layout keeps 8 of the passages, this one among them)
        evidence = next(k for k, (a, b) in enumerate(chars) if prompt[a:b] == shown)
        a, b = chars[evidence]
        at = prompt.find(example.evidence_text, a, b) if example.evidence_text else -1
        if at < 0:
            skipped.append(example.id)
            continue
        target = (at, at + len(example.evidence_text))  # the evidence sentence; every other unit a sentence found
        sentences = [target] + [(a + x, a + y) for a, b in chars for x, y in split_text(prompt[a:b], "sentences")
                                if a + y <= target[0] or a + x >= target[1]]
        truth = 0
        encoded = tokenizer(prompt, return_offsets_mapping=True)
        ids, offsets = list(encoded["input_ids"]), encoded["offset_mapping"]

        def tokens_of(span, offsets=offsets):
            return [i for i, (x, y) in enumerate(offsets) if y > x and span[0] <= y - 1 < span[1]]

        with torch.no_grad():
            given = torch.tensor([ids])
            out = model.generate(input_ids=given, attention_mask=torch.ones_like(given), max_new_tokens=8,
                                 do_sample=False, pad_token_id=tokenizer.eos_token_id)
        response = out[0, len(ids):].tolist()
        while response and response[-1] == tokenizer.eos_token_id:
            response.pop()
        if not response:  # the model ended its answer at once: nothing to explain
            skipped.append(example.id)
            continue
        record = {"id": example.id, "tokens": len(ids) + len(response), "sentences": len(sentences),
                  "evidence_sentence": truth, "evidence_passage": evidence, "response": tokenizer.decode(response),
                  "methods": {}}
        spans = [[found[0], found[-1] + 1] for found in map(tokens_of, sentences)]
        for name, options in zip(SPECS, ({}, {"finer": "sentences"}, {"sources": spans})):
            started = time.perf_counter()
            generation = normx.explain_generation(model, tokenizer, prompt, method="budgeted", target=response,
                                                  budget=args.budget, **options)
            took = time.perf_counter() - started
            found_rows = np.nan_to_num(np.asarray(generation.scores[0], np.float64))
            scores = np.array([found_rows[:, tokens_of(span)].sum() for span in sentences])
            passages = np.array([found_rows[:, tokens_of(span)].sum() for span in chars])
            rank = 1 + int((scores > scores[truth]).sum())
            record["methods"][name] = {"rank": rank, "top": rank == 1,
                                       "passage_top": int(passages.argmax()) == evidence, "seconds": took,
                                       "passes": generation.settings.get("passes"),
                                       "masks": generation.settings.get("masks"),
                                       "refined": generation.settings.get("refined", {}).get("sources")}
            print(f"{example.id} {name}: rank {rank} of {len(sentences)}, passage first "
                  f"{record['methods'][name]['passage_top']}, {took:.1f} s", flush=True)
        records.append(record)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    lines = [f"{len(records)} held-out `qa` passage contexts (8 passages, {args.budget} budget), "
             f"SmolLM2-135M-Instruct; {len(skipped)} left out (no answer, or the evidence sentence not found in its "
             "passage: "
             f"{', '.join(skipped) or 'none'}); "
             f"provenance {provenance()['commit'][:10]}", "",
             "| sources | evidence sentence first | its rank (median, mean) | evidence passage first | passes |",
             "|---|---|---|---|---|"]
    for name in SPECS:
        got = [r["methods"][name] for r in records]
        ranks = np.array([g["rank"] for g in got])
        lines.append(f"| {name} | {sum(g['top'] for g in got)} of {len(got)} | {np.median(ranks):g}, "
                     f"{ranks.mean():.1f} | {sum(g['passage_top'] for g in got)} of {len(got)} | "
                     f"{np.median([g['passes'] for g in got]):.2f} |")
    table = "\n".join(lines) + "\n"
    Path(str(args.out) + ".md").write_text(table, encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
