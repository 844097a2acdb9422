"""Peers of context attribution side by side with normx's readings, scored by the same code
(:func:`normx.evaluation.context.evaluate_context`: the same contexts, prompts, responses, held-out LDS masks, drops
and evidence recall; each peer's wall time over the same plain forward pass).

Run it with the peers' virtualenv (context-cite 0.0.4, at2 0.0.1, flashtrace 0.1.1 beside the same torch and
transformers as normx's; ``/work/peers-venv`` here) and normx on its path, from the repository root::

    PYTHONPATH=. PEERS_PYTHON -m studies.context.peers --data DATA --length 300 --limit 8 --out OUT

Peers (each given the exact sources, the chat-templated prompt and normx's response, each checked to explain the
response's ids):

- ``ContextCiter@32`` / ``@64`` / ``@128``: context-cite's ``ContextCiter`` (its masks, forwards on re-rendered
  text, LASSO), ``num_ablations`` 32 / 64 / 128; its partitioner is one of ours over the given sources (the package's
  default asks nltk for punkt data, which is not here offline), joining kept sources as the context joins them;
  the response is given by seeding its output cache (``_cache["output"]``), as its API has no argument for it;
- ``AT2 (average attention)``: at2's ``AT2Attributor`` with an untrained ``AT2ScoreEstimator`` (every (layer, head)
  weight 1/(L·H): the package's own attention baseline); the sources are its documents. Its trained estimators are
  on the hub only (for other models);
- ``AT2 (trained)``: the same attributor with the estimator at2's own trainer fitted for SmolLM2
  (``studies.context.at2_train``: 40 training contexts, not the authors' 4,000), given by ``--at2-estimator
  FILE`` (its ``score_estimator.pt``); a rerun with another estimator wants another ``--out`` (a finished context's
  supplied readings are reused as they are);
- ``FlashTrace``: flashtrace's ``FlashTrace(...).trace`` (method "flashtrace", hops 1, ``recompute_attention`` since
  the model runs sdpa), given the whole chat-templated prompt (``use_chat_template=False``) and the response text; a
  source's score is the sum of its prompt tokens' scores.

LXT's AttnLRP is not run: normx's ``attnlrp`` equals LXT's to 3.5e-6 (studies/parity/attnlrp.py) and LXT needs its
own virtualenv with an older transformers. ``--methods`` adds normx readings to the same run (default: contextcite@32,
random, position, as anchors shared with ``normx evaluate context``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from studies.settings import add_data_option, data_folder, provenance, version

PEERS = ("ContextCiter@32", "ContextCiter@64", "ContextCiter@128", "AT2 (average attention)", "AT2 (trained)",
         "FlashTrace")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.context.peers", description=__doc__.split("\n\n")[0])
    add_data_option(parser)
    parser.add_argument("--out", type=Path, required=True, help="output folder (report.json, table.md, "
                        "contexts.jsonl: finished contexts, reused by a rerun)")
    parser.add_argument("--length", type=int, default=300)
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--kinds", default="qa,claim,copy,instruction")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--methods", default="contextcite@32,random,position")
    parser.add_argument("--masks", type=int, default=32)
    parser.add_argument("--at2-estimator", type=Path, default=None, help="the trained AT2 estimator's "
                        "score_estimator.pt (studies.context.at2_train), for the peer 'AT2 (trained)'")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)

    import torch

    import normx
    from normx.data.contexts import context_examples
    from normx.evaluation.context import evaluate_context

    torch.set_num_threads(args.threads)
    peers = [p for p in args.peers.split(",") if p]
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        raise SystemExit(f"unknown peers {unknown}; known: {PEERS}")
    if "AT2 (trained)" in peers and (args.at2_estimator is None or not args.at2_estimator.is_file()):
        raise SystemExit("'AT2 (trained)' reads the estimator file given by --at2-estimator "
                         "(studies.context.at2_train)")
    examples = context_examples(args.kinds.split(","), "heldout", args.length, args.limit, 0, data_folder(args.data))
    model, tokenizer = normx.load_model("smollm2")
    readers = {name: reader(name, model, tokenizer, args.at2_estimator) for name in peers}
    start = time.time()
    report = evaluate_context(model, tokenizer, examples, [m for m in args.methods.split(",") if m], scores=readers,
                              masks=args.masks, out=args.out, settings={"model": "smollm2"})
    report.settings.update(
        command="PYTHONPATH=. PEERS_PYTHON -m studies.context.peers " + " ".join(argv or sys.argv[1:]),
        versions={name: version(name) for name in ("context-cite", "at2", "flashtrace", "torch", "transformers")},
        threads=torch.get_num_threads(), seconds=round(time.time() - start, 1), **provenance())
    if "AT2 (trained)" in peers:
        report.settings["at2_estimator"] = str(args.at2_estimator.resolve())
    report.write(args.out)
    print(report.table())
    print(json.dumps({"contexts": len(report.records), "seconds": report.settings["seconds"]}))
    return 0


def reader(name: str, model, tokenizer, at2_estimator: Path | None = None):
    """The function of a prepared context that returns the peer's score per source."""
    if name.startswith("ContextCiter@"):
        return lambda prepared: context_cite(model, tokenizer, prepared, int(name.partition("@")[2]))
    if name.startswith("AT2"):
        from at2 import AT2ScoreEstimator

        estimator = (AT2ScoreEstimator.load(at2_estimator, device="cpu") if name == "AT2 (trained)"
                     else AT2ScoreEstimator(at2_extractor(model)))
        return lambda prepared: at2_scores(model, tokenizer, prepared, estimator)
    return lambda prepared: flashtrace(model, tokenizer, prepared)


def source_ranges(example) -> list[tuple[int, int]]:
    """Each source's characters in the example's context text."""
    ranges, at = [], 0
    for source in example.sources:
        ranges.append((at, at + len(source)))
        at += len(source) + len(example.separator())
    return ranges


def context_cite(model, tokenizer, prepared, ablations: int) -> np.ndarray:
    from context_cite import ContextCiter
    from context_cite.context_partitioner import BaseContextPartitioner

    example = prepared.example

    class GivenSources(BaseContextPartitioner):
        """The example's own sources; a mask's context joins the kept ones as the example joins them."""

        @property
        def num_sources(self):
            return len(example.sources)

        def split_context(self):
            return None

        def get_source(self, index):
            return example.sources[index]

        def get_context(self, mask=None):
            keep = None if mask is None else {i for i, kept in enumerate(mask) if kept}
            return example.context(keep)

    citer = ContextCiter(model, tokenizer, example.context(), example.query, num_ablations=ablations,
                         partitioner=GivenSources(example.context()), prompt_template="Context: {context}\n\nQuery: "
                         "{query}")
    _, prompt = citer._get_prompt_ids(return_prompt=True)
    citer._cache["output"] = prompt + prepared.response
    if list(citer._response_ids) != prepared.response_ids:
        raise RuntimeError(f"{example.id}: ContextCite tokenises the response to other ids "
                           f"({list(citer._response_ids)} != {prepared.response_ids})")
    return np.asarray(citer.get_attributions(as_dataframe=False, verbose=False), np.float64)


def at2_extractor(model):
    """at2's attention features for SmolLM2 (a Llama): one per (layer, head)."""
    from at2 import AT2FeatureExtractor

    base = model.base_model if hasattr(model, "base_model") else model
    return AT2FeatureExtractor(num_layers=len(base.layers), num_heads=model.config.num_attention_heads,
                               model_type="llama")


def at2_task(model, tokenizer, context: str, query: str, ranges):
    """at2's own context-attribution task (its chat-templated "Context: ...\n\nQuery: ..." prompt) whose sources are
    the given character ranges of the context, one document each: normx's sources (:func:`source_ranges`)."""
    from at2.tasks import SimpleContextAttributionTask

    class GivenSources(SimpleContextAttributionTask):
        def _get_document_ranges(self):
            start = self.prompt.index(self.context)
            return [(start + a, start + b) for a, b in ranges]

    return GivenSources(context=context, query=query, model=model, tokenizer=tokenizer, source_type="document")


def at2_scores(model, tokenizer, prepared, estimator) -> np.ndarray:
    from at2 import AT2Attributor

    example = prepared.example
    task = at2_task(model, tokenizer, example.context(), example.query, source_ranges(example))
    task.set_generation(prepared.response)
    ids = task.get_tokens()["input_ids"]
    start, end = task.target_token_range
    if list(ids[start:end]) != prepared.response_ids or task.num_sources != len(example.sources):
        raise RuntimeError(f"{example.id}: AT2 reads other response ids or sources than the evaluation")
    return np.asarray(AT2Attributor(task, estimator).get_attribution_scores(), np.float64)


def flashtrace(model, tokenizer, prepared) -> np.ndarray:
    from flashtrace import FlashTrace

    text = tokenizer.decode(prepared.ids[:prepared.prompt_length])
    result = FlashTrace(model, tokenizer, recompute_attention=True, use_chat_template=False).trace(
        prompt=text, target=prepared.response, hops=1)
    joined, spans, at = "".join(result.prompt_tokens), [], 0
    for token in result.prompt_tokens:
        spans.append((at, at + len(token)))
        at += len(token)
    scores = []
    base = joined.find(prepared.example.context())
    if base < 0:
        raise RuntimeError(f"{prepared.example.id}: FlashTrace's prompt tokens do not hold the context")
    for a, b in source_ranges(prepared.example):
        first, last = base + a, base + b
        scores.append(sum(float(s) for (x, y), s in zip(spans, result.scores) if y > x and first <= y - 1 < last))
    return np.asarray(scores, np.float64)


if __name__ == "__main__":
    raise SystemExit(main())
