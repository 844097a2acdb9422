"""explain_generation's per-step computations other than the one-pass readings (:mod:`normx.explanations.generation`):

- :func:`from_one_pass`: a method with ``Method.steps`` (the gradient methods, AttnLRP) computes every step of a
  sequence from ONE forward pass over it, one backward pass per batch of steps (:mod:`normx.methods.step_gradients`);
- :func:`model_free`: a method that reads no model (``Method.model_free``: random, random_types, recency,
  recency_first) scores each step's prefix from its ids alone, with no forward pass; the Generation then has no
  model outputs: its probabilities are NaN and its predictions -1;
- :func:`per_prefix`: any other method runs one forward (and backward) pass per step on its prefix, the prefixes
  batched as rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from normx._torch import torch
from normx.core.batch import id_tensor
from normx.core.inputs import Encoded, batches
from normx.explanations.explain import Plan, attribute_batch
from normx.explanations.generation_reading import step_readings
from normx.explanations.generation_response import response_level
from normx.methods import Context


def from_one_pass(plan: Plan, tokenizer, prompts: list[str], items: list[Encoded], lengths: list[int],
                  batch_size: int):
    """Every step of each sequence from one forward pass over it (``Method.steps``)."""
    scores, probabilities, predictions, shown, diagnostics, _ = response_level(
        plan, tokenizer, prompts, items, lengths, batch_size, steps=True)
    return scores, probabilities, predictions, shown, diagnostics


@dataclass
class _Ids:
    """What a model-free method reads of a pass: the ids and the attention mask (``Context.run.inputs``)."""

    inputs: dict[str, torch.Tensor]


def model_free(plan: Plan, tokenizer, items: list[Encoded], lengths: list[int], batch_size: int):
    """Each step's row from its prefix's ids alone (``Method.model_free``): no forward pass."""
    scores, probabilities, predictions, shown, diagnostics = [], [], [], [], []
    for item, length in zip(items, lengths):
        n, total = len(item.ids) - length, len(item.ids)
        matrix = np.full((1, n, total), np.nan, np.float32)
        if n:
            ids = torch.zeros((n, total - 1), dtype=torch.long)
            mask = torch.zeros_like(ids)
            for t in range(n):
                ids[t, :length + t] = id_tensor(item.ids[:length + t])
                mask[t, :length + t] = 1
            ctx = Context(_Ids({"input_ids": ids, "attention_mask": mask}), plan.labels,
                          torch.zeros((n, 1), dtype=torch.long), None, options=plan.options)
            rows = plan.method.compute(ctx)[:, 0, 0].float().numpy()  # [n, T - 1]
            for t in range(n):
                matrix[0, t, :length + t] = rows[t, :length + t]
        scores.append(matrix)
        probabilities.append(np.full(n, np.nan, np.float32))
        predictions.append([-1] * n)
        shown.append([])
        diagnostics.append({})
    return scores, probabilities, predictions, shown, diagnostics


def per_prefix(plan: Plan, tokenizer, items: list[Encoded], lengths: list[int], batch_size: int):
    """One pass (and backward pass) per generated token, on its prefix, the prefixes batched as rows."""
    prefixes = [(i, p) for i, (item, length) in enumerate(zip(items, lengths)) for p in range(length, len(item.ids))]
    found = {}
    batch_size = plan.handle.rows_per_pass(batch_size)
    for start in range(0, len(prefixes), batch_size):
        chunk = prefixes[start:start + batch_size]
        encoded = [_prefix(items[i], p) for i, p in chunk]
        (_, inputs), = batches(encoded, len(encoded), tokenizer, plan.handle.device)
        columns = torch.tensor([[items[i].ids[p]] for i, p in chunk], device=inputs["input_ids"].device)
        out = attribute_batch(plan, inputs, columns)
        mask = inputs["attention_mask"].bool().cpu().numpy()
        probs, top, alternatives = step_readings(plan.labels, out.logits, [items[i].ids[p] for i, p in chunk])
        for r, (i, p) in enumerate(chunk):
            found[i, p] = (out.scores[r, 0][:, np.flatnonzero(mask[r])].cpu().numpy(), probs[r], top[r],
                           alternatives[r], {name: float(value[r, 0]) for name, value in out.diagnostics.items()})
    scores, probabilities, predictions, shown, diagnostics = [], [], [], [], []
    for i, (item, length) in enumerate(zip(items, lengths)):
        steps = range(length, len(item.ids))
        matrix = np.full((len(plan.layers), len(steps), len(item.ids)), np.nan, np.float32)
        for t, p in enumerate(steps):
            matrix[:, t, :p] = found[i, p][0]
        scores.append(matrix)
        probabilities.append(np.array([found[i, p][1] for p in steps], np.float32))
        predictions.append([found[i, p][2] for p in steps])
        shown.append([found[i, p][3] for p in steps])
        names = found[i, steps[0]][4] if len(steps) else {}
        diagnostics.append({name: [found[i, p][4][name] for p in steps] for name in names})
    return scores, probabilities, predictions, shown, diagnostics


def _prefix(item: Encoded, p: int) -> Encoded:
    return Encoded(text=item.text[:item.offsets[p - 1][1]], text_pair=None, ids=item.ids[:p],
                   tokens=item.tokens[:p], offsets=item.offsets[:p], segments=item.segments[:p],
                   special=item.special[:p])
