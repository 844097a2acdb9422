"""Faithfulness of explanations of generated text: per generation step, delete the top-K % of the tokens before the
generated one by score, run the model again on what is left (teacher forcing: the same ids, fewer of them) and
measure how far the probability of the generated token drops (comprehensiveness); keep only the top-K % for
sufficiency. AOPC is the mean drop over K = 10 ... 90 %.

The ranking and the deletion are the classification protocol's (:mod:`normx.evaluation.faithfulness.perturbation`):
signed scores, descending; ``int(n * K)`` tokens of the n before the generated one; the token the prediction is read
at (the one just before the generated token) is never deleted, as a decoder classifier's pooled token is not.
Every input is token ids, never re-encoded text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from normx._torch import torch
from normx.core.handle import model_handle
from normx.core.inputs import collate, pad_token_id
from normx.errors import InvalidInputError
from normx.evaluation.faithfulness.metrics import K_VALUES, aopc
from normx.evaluation.faithfulness.perturbation import MODES, Item, perturb, ranking
from normx.explanations.generation import explain_generation

DEFAULT_METHODS = ("normxlogit", "gradient_x_input", "integrated_gradients", "attention", "norm_attention", "recency",
                   "random")


@dataclass
class GenerationFaithfulness:
    """AOPC of each method's generation-step rankings: ``aopc[method][mode]`` the mean over steps,
    ``per_step[method][mode]`` each step's AOPC (in the order of the prompts and their steps), ``curves[method][mode]``
    the mean probability drop at each K."""

    methods: list[str]
    ks: tuple[float, ...]
    prompts: int
    steps: int
    aopc: dict[str, dict[str, float]]
    per_step: dict[str, dict[str, list[float]]]
    curves: dict[str, dict[str, list[float]]]
    settings: dict = field(default_factory=dict)

    def standard_error(self, method: str, mode: str) -> float:
        values = np.asarray(self.per_step[method][mode])
        return float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")

    def table(self) -> str:
        """A Markdown table: each method's comprehensiveness (higher is more faithful) and sufficiency (lower is
        more faithful) AOPC, with standard errors over the steps."""
        lines = ["| method | comprehensiveness AOPC ↑ | sufficiency AOPC ↓ |", "|---|---|---|"]
        for method in self.methods:
            cells = [f"{self.aopc[method][mode]:.3f} ± {self.standard_error(method, mode):.3f}" for mode in MODES]
            lines.append(f"| {method} | {cells[0]} | {cells[1]} |")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"methods": self.methods, "ks": list(self.ks), "prompts": self.prompts, "steps": self.steps,
                "aopc": self.aopc, "per_step": self.per_step, "curves": self.curves, "settings": self.settings}


def generation_faithfulness(model, tokenizer, prompts: Sequence[str], methods: Sequence[str] = DEFAULT_METHODS, *,
                            max_new_tokens: int = 8, method_options: Mapping[str, Mapping] | None = None,
                            batch_size: int = 32, progress: bool = True) -> GenerationFaithfulness:
    """Generate greedily after each prompt once, explain every step with each method (the same ids), and measure
    the AOPC of each method's rankings (see the module docstring)."""
    from tqdm.auto import tqdm

    prompts = list(prompts)
    if not prompts:
        raise InvalidInputError("prompts is empty; give at least one prompt")
    options = {name: dict((method_options or {}).get(name, {})) for name in methods}
    first = explain_generation(model, tokenizer, prompts, max_new_tokens=max_new_tokens)
    targets = [g.token_ids[g.prompt_length:] for g in first]
    handle = model_handle(model)
    ks = tuple(k for k in K_VALUES if 0 < k < 1)
    pad = pad_token_id(tokenizer)
    steps = [(i, g, t) for i, g in enumerate(first) for t in range(g.steps) if g.prompt_length + t >= 2]
    originals = [_item(g, t) for _, g, t in steps]  # (a prefix of one token has nothing to delete: left out)
    probability = _Probabilities(handle, pad, batch_size)
    base = probability(originals, [g.token_ids[g.prompt_length + t] for _, g, t in steps])
    result = {"aopc": {}, "per_step": {}, "curves": {}}
    for name in tqdm(methods, desc="methods", disable=not progress):
        explained = explain_generation(model, tokenizer, prompts, method=name, target=targets, **options[name])
        variants, wanted = [], []
        for (i, g, t), item in zip(steps, originals):
            order = ranking(explained[i].rows()[t], item)
            variants += [perturb(item, order, k, mode, "delete") for mode in MODES for k in ks]
            wanted += [g.token_ids[g.prompt_length + t]] * (len(MODES) * len(ks))
        drops = base[:, None, None] - probability(variants, wanted).reshape(len(steps), len(MODES), len(ks))
        result["aopc"][name], result["per_step"][name], result["curves"][name] = {}, {}, {}
        for m, mode in enumerate(MODES):
            per_step = [aopc(row, ks, within=None) for row in drops[:, m]]
            result["per_step"][name][mode] = per_step
            result["aopc"][name][mode] = float(np.mean(per_step))
            result["curves"][name][mode] = drops[:, m].mean(0).tolist()
    settings = {"max_new_tokens": max_new_tokens, "method_options": options, "perturbation": "delete",
                "model_class": handle.name, "ranking": "signed scores, descending; the token before the generated "
                                                       "one is never deleted"}
    return GenerationFaithfulness(list(methods), ks, len(prompts), len(steps), settings=settings, **result)


def _item(generation, t: int) -> Item:
    """Step ``t``'s prefix (the tokens before the generated one); its last token is where the prediction is read."""
    p = generation.prompt_length + t
    return Item(tuple(generation.token_ids[:p]), tuple(generation.special[:p]), p - 1)


@dataclass
class _Probabilities:
    """The model's probability of a given next token after each item (right-padded batches, read at the item's
    last token), items run once each."""

    handle: object
    pad: int | None
    batch_size: int
    cache: dict = field(default_factory=dict)

    def __call__(self, items: Sequence[Item], tokens: Sequence[int]) -> np.ndarray:
        keys = [(item.key(), token) for item, token in zip(items, tokens)]
        todo = list({key: (item, token) for key, item, token in zip(keys, items, tokens)
                     if key not in self.cache}.items())
        todo.sort(key=lambda entry: len(entry[1][0].ids))
        handle = self.handle
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start:start + self.batch_size]
            batch = collate([item for _, (item, _) in chunk], self.pad, handle.device)
            last = torch.tensor([item.pooled for _, (item, _) in chunk], device=handle.device)
            wanted = torch.tensor([token for _, (_, token) in chunk], device=handle.device)
            with handle.using(), torch.no_grad():
                logits = handle.model(**batch, use_cache=False).logits
                rows = torch.arange(len(chunk), device=handle.device)
                probs = torch.softmax(logits[rows, last].float(), -1)[rows, wanted]
            self.cache.update(zip([key for key, _ in chunk], probs.cpu().tolist()))
        return np.array([self.cache[key] for key in keys], dtype=np.float64)
