"""Reading a context: every method's source scores on a context example (:mod:`normx.data.contexts`), scored by
one code path (:mod:`~normx.evaluation.context.metrics`) against the model's behaviour under held-out source masks.

Per context: the prompt is the example's user message under the tokenizer's chat template (as it is, for a
tokenizer without one); the response is the
model's own greedy answer (``max_new_tokens``, without its end-of-turn token) or a given one. A source is the
prompt's tokens whose text lies in it (the space before a sentence goes with it). A method is read as a user reads
it: ``normx.explain_generation(model, tokenizer, prompt, method=NAME, target=response_ids, chat=True)`` (the
ablation methods also get the sources' token spans), a source's score being the sum of its tokens' entries over the
response's steps (the method's default layer). ``random`` (seeded uniform scores) and ``position`` (later sources
first) are baselines that read no model; ``scores`` adds readings computed elsewhere (the peers), each a function of
the :class:`Prepared` context.

Outcomes come from part of the ablation methods' own engine (:func:`normx.methods.ablation.forwards.outcomes`):
a source is removed by leaving its tokens out, and the response's log-probability (the sum of its tokens'
log-probabilities) is read under each mask: ``masks`` held-out random masks for the LDS (each source kept with p =
0.5, seeded apart from every method's own ablations), and per method the masks without its top-1 and top-3
sources. ContextCite's outcome, the logit-probability log p - log(1 - p) of the whole response, is an increasing
function of the log-probability, so the LDS (a Spearman correlation per context) is the same on either; the drops
are reported on both. Cost: a method's wall time over the wall time of one plain forward pass on the same
sequence, run just before it (a shared machine's load drifts; the pair is measured back to back).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

import normx.evaluation.context.metrics as metrics
from normx._torch import torch
from normx.core.batch import Encoded
from normx.core.handle import model_handle
from normx.errors import InvalidInputError
from normx.explanations.generation import explain_generation
from normx.methods import get_method
from normx.methods.ablation import response_logit_probability
from normx.methods.ablation.forwards import outcomes
from normx.methods.response import ResponseContext

BASELINES = ("random", "position")
KS = (1, 3)


@dataclass
class Prepared:
    """One context ready for the methods: ``prompt`` (the user message), ``ids`` (the chat-templated prompt's ids,
    then the response's), ``prompt_length``, ``spans`` (each source's token span [start, end) in ``ids``)."""

    example: object  # normx.data.contexts.ContextExample
    prompt: str
    ids: list[int]
    prompt_length: int
    spans: list[tuple[int, int]]
    response: str
    chat: bool = True  # the prompt is under the tokenizer's chat template (False: it has none)

    @property
    def response_ids(self) -> list[int]:
        return self.ids[self.prompt_length:]


def prepare(model, tokenizer, example, max_new_tokens: int = 12, response: Sequence[int] | None = None) -> Prepared:
    """The example's prompt under the chat template, its sources' token spans, and the response (greedy unless
    given; the end-of-turn token left out)."""
    prompt = example.prompt()
    chat = bool(getattr(tokenizer, "chat_template", None))
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True) if chat else prompt
    encoded = tokenizer(text, add_special_tokens=not chat, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), list(encoded["offset_mapping"])
    start = text.find(prompt)
    if start < 0:
        raise InvalidInputError("the chat template changed the prompt's text; its sources cannot be found in it")
    spans, at, sep = [], start + prompt.index(example.context()), example.separator()
    for source in example.sources:
        first, last = at, at + len(source)
        inside = [i for i, (a, b) in enumerate(offsets) if b > a and first <= b - 1 < last]
        if not inside or inside != list(range(inside[0], inside[-1] + 1)):
            raise InvalidInputError(f"source {len(spans)} of {example.id} has no contiguous tokens")
        spans.append((inside[0], inside[-1] + 1))
        at = last + len(sep)
    if response is None:
        handle = model_handle(model)
        inputs = torch.tensor([ids], device=handle.device)
        configured = getattr(getattr(handle.model, "generation_config", None), "eos_token_id", None)
        ends = {tokenizer.eos_token_id, *(configured if isinstance(configured, list) else [configured])} - {None}
        with handle.using(), torch.no_grad():
            out = handle.model.generate(input_ids=inputs, attention_mask=torch.ones_like(inputs),
                                        max_new_tokens=max_new_tokens, do_sample=False,
                                        pad_token_id=tokenizer.eos_token_id if tokenizer.pad_token_id is None
                                        else tokenizer.pad_token_id)
        response = out[0, len(ids):].tolist()
        while response and response[-1] in ends:
            response.pop()
    response = [int(t) for t in response]
    if not response:
        raise InvalidInputError(f"the response to {example.id} is empty")
    return Prepared(example, prompt, ids + response, len(ids), spans, tokenizer.decode(response), chat)


def source_scores(generation, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """A source's score: the sum of its tokens' entries over every step's row (the method's default layer)."""
    rows = generation.rows()
    return np.array([sum(float(np.sum(row[a:b])) for row in rows) for a, b in spans], np.float64)


def read_method(model, tokenizer, prepared: Prepared, method: str, options: Mapping) -> np.ndarray:
    """The method's source scores on the prepared context, read through ``normx.explain_generation``."""
    options = dict(options)
    if get_method(method).response_only and "sources" not in options:
        options["sources"] = [list(span) for span in prepared.spans]
    generation = explain_generation(model, tokenizer, prepared.prompt, method=method, target=prepared.response_ids,
                                    chat=prepared.chat, **options)
    if list(generation.token_ids) != prepared.ids:
        raise RuntimeError("explain_generation tokenised the prompt differently from the evaluation")
    return source_scores(generation, prepared.spans)


def baseline(name: str, prepared: Prepared, seed: int, index: int) -> np.ndarray:
    n = len(prepared.spans)
    if name == "position":
        return np.arange(n, dtype=np.float64)
    return np.random.default_rng([seed, 7, index]).random(n)


def response_outcomes(model, tokenizer, prepared: Prepared, keeps: np.ndarray, batch_size: int = 8
                      ) -> tuple[np.ndarray, np.ndarray]:
    """The response's log-probability and logit-probability [masks] under each mask (bool [masks, sources]),
    through the ablation methods' engine."""
    if prepared.prompt_length >= len(prepared.ids):
        raise InvalidInputError("the response has no tokens (the model ended its answer at once): there is no "
                                "outcome to remove sources from")
    item = Encoded(text="", text_pair=None, ids=list(prepared.ids), tokens=[""] * len(prepared.ids),
                   offsets=[(0, 0)] * len(prepared.ids), segments=[0] * len(prepared.ids),
                   special=[False] * len(prepared.ids))
    ctx = ResponseContext(model_handle(model), tokenizer, prepared.prompt, item, prepared.prompt_length, {},
                          batch_size)
    members = [list(range(a, b)) for a, b in prepared.spans]
    log_p, _, _ = outcomes(ctx, members, np.asarray(keeps, bool), "masks")
    return log_p.sum(1), response_logit_probability(log_p)


def forward_seconds(model, prepared: Prepared, repeats: int = 2) -> float:
    """The faster of ``repeats`` plain forward passes over the whole sequence."""
    handle = model_handle(model)
    ids = torch.tensor([prepared.ids], device=handle.device)
    best = float("inf")
    for _ in range(repeats):
        with handle.using(), torch.no_grad():
            start = time.perf_counter()
            handle.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
            best = min(best, time.perf_counter() - start)
    return best


def timed(function: Callable[[], np.ndarray]) -> tuple[np.ndarray, float]:
    start = time.perf_counter()
    value = np.asarray(function(), np.float64)
    return value, time.perf_counter() - start


def score_context(outcome: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]], n: int, evidence: Sequence[int],
                  readings: Mapping[str, tuple[np.ndarray, float | None]], masks: int, seed: int,
                  known: dict | None = None) -> dict:
    """One context's record: the LDS outcomes (``known["lds_log_p"]`` reused when given), and per reading its
    scores, seconds, LDS, top-k drops and evidence recall. ``outcome(keeps)``: the response's log-probability and
    logit-probability [masks] under masks (bool [masks, n]: True = kept; :func:`response_outcomes` on a model);
    ``n`` sources; ``evidence``: the sources that hold the answer."""
    lds_masks = metrics.lds_masks(n, masks, seed)
    removals = {name: [metrics.removal_mask(scores, k) for k in KS] for name, (scores, _) in readings.items()}
    wanted = [np.ones(n, bool)] + ([] if known else list(lds_masks)) + [m for ms in removals.values() for m in ms]
    unique = {m.tobytes(): m for m in wanted}
    keys = list(unique)
    log_p, logit_p = outcome(np.stack([unique[k] for k in keys]))
    by_mask = {k: (float(a), float(b)) for k, a, b in zip(keys, log_p, logit_p)}
    full = by_mask[np.ones(n, bool).tobytes()]
    if known:
        lds_log_p = np.asarray(known["lds_log_p"], np.float64)
    else:
        lds_log_p = np.array([by_mask[m.tobytes()][0] for m in lds_masks])
    record = {"full_log_p": full[0], "full_logit_p": full[1], "lds_log_p": lds_log_p.tolist(), "readings": {}}
    for name, (scores, seconds) in readings.items():
        entry = {"scores": scores.tolist(), "seconds": seconds, "lds": metrics.lds(scores, lds_masks, lds_log_p)}
        for k, mask in zip(KS, removals[name]):
            entry[f"drop@{k}"] = full[0] - by_mask[mask.tobytes()][0]
            entry[f"logit_drop@{k}"] = full[1] - by_mask[mask.tobytes()][1]
            entry[f"evidence@{k}"] = metrics.evidence_at(scores, evidence, k)
        record["readings"][name] = entry
    return record
