"""Faithfulness of explanations of generated text: per generation step, delete the top-K % of the tokens before the
generated one by score, run the model again on what is left (teacher forcing: the same ids, fewer of them) and
measure how far the probability of the generated token drops (comprehensiveness); keep only the top-K % for
sufficiency. AOPC is the mean drop over K = 10 ... 90 %.

The ranking and the deletion are the classification protocol's (:mod:`normx.evaluation.faithfulness.perturbation`):
signed scores, descending; ``int(n * K)`` tokens of the n before the generated one; the token the prediction is read
at (the one just before the generated token) is never deleted, as a decoder classifier's pooled token is not.
Every input is token ids, never re-encoded text.

Position-controlled protocol (``keep_recent=W``): on short prompts the tokens just before the generated one carry
most of the prediction, so a ranking that reads no model (``recency``: latest first) scores high on the standard
protocol, and a method's number there mixes "found the evidence" with "put the nearest tokens first". With
``keep_recent`` the W tokens just before the generated one (the one the prediction is read at among them) are never
deleted and always kept, and only the earlier ("far") tokens are ranked (each method's own order, restricted to
them) and deleted: ``int(m * K)`` of the m far tokens (comprehensiveness), or all far tokens but those
(sufficiency). Every method then deletes from the same far span, so a ranking can win only by ordering the far
context well; steps with fewer than ``min_far`` far tokens are left out of that protocol (``far_steps`` counts the
rest). The result's modes ``far_comprehensiveness`` / ``far_sufficiency`` hold it beside the standard two.
``position_correlation`` reports, per method, the mean over steps of the Spearman correlation of a step's scores with
the tokens' positions (1: the recency ranking itself), how much of a ranking is position alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from normx._torch import torch
from normx.core.handle import model_handle
from normx.core.inputs import collate, pad_token_id
from normx.errors import InvalidInputError
from normx.evaluation.faithfulness.metrics import K_VALUES, aopc
from normx.evaluation.faithfulness.perturbation import MODES, Item, perturb, ranking
from normx.explanations.generation import explain_generation

# rows computed elsewhere: a function of the protocol's generations, or explained generations (``rows()``)
SuppliedRows = Callable[[list], Sequence[Sequence[np.ndarray]]] | Sequence
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
    far_steps: int = 0  # steps in the position-controlled modes (``keep_recent``)
    position_correlation: dict[str, float] = field(default_factory=dict)

    def standard_error(self, method: str, mode: str) -> float:
        values = np.asarray([v for v in self.per_step[method][mode] if v is not None], dtype=np.float64)
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
                "aopc": self.aopc, "per_step": self.per_step, "curves": self.curves, "settings": self.settings,
                "far_steps": self.far_steps, "position_correlation": self.position_correlation}


def generation_faithfulness(model, tokenizer, prompts: Sequence[str], methods: Sequence[str] = DEFAULT_METHODS, *,
                            max_new_tokens: int = 8, method_options: Mapping[str, Mapping] | None = None,
                            batch_size: int = 32, progress: bool = True, keep_recent: int | None = None,
                            min_far: int = 4, ks: Sequence[float] | None = None,
                            rows: Mapping[str, SuppliedRows] | None = None) -> GenerationFaithfulness:
    """Generate greedily after each prompt once, explain every step with each method (the same ids), and measure
    the AOPC of each method's rankings (see the module docstring).

    ``method_options[name]`` are the options of ``name``; with a ``"method"`` entry, ``name`` is only a label and
    that registered method is run (so one method can be measured at several settings: ``{"normxlogit@15":
    {"method": "normxlogit", "layer": 15}}``). ``keep_recent``: also run the position-controlled protocol with
    that many tokens before the generated one held fixed (module docstring), on steps with ``min_far`` or more
    tokens before them. ``ks``: the ratios (default K = 10 ... 90 %; a coarser grid makes a cheaper AOPC, e.g. for
    choosing settings).

    ``rows``: rankings computed elsewhere (another library's attributions), scored beside ``methods`` by the same
    protocol on the same steps, each under its name (after the methods). A value is either a function given the
    protocol's greedy generations (:class:`~normx.explanations.generation_result.Generation` objects: ``prompt``,
    ``token_ids``, ``prompt_length``, ``steps``) that returns, per generation, one row per step (step t: a score for
    each of the ``prompt_length + t`` tokens before the generated one), or a list of objects with ``token_ids`` and
    ``rows()`` (e.g. :func:`normx.explain_generation`'s results), whose ids must be the protocol's."""
    from tqdm.auto import tqdm

    prompts = list(prompts)
    if not prompts:
        raise InvalidInputError("prompts is empty; give at least one prompt")
    if keep_recent is not None and (isinstance(keep_recent, bool) or not isinstance(keep_recent, int)
                                    or keep_recent < 1):
        raise InvalidInputError(f"keep_recent must be a whole number >= 1 (tokens held fixed), got {keep_recent!r}")
    if isinstance(min_far, bool) or not isinstance(min_far, int) or min_far < 1:
        raise InvalidInputError(f"min_far must be a whole number >= 1, got {min_far!r}")
    supplied = dict(rows or {})
    both = sorted(set(supplied) & set(methods))
    if both:
        raise InvalidInputError(f"rows names {both}, which are also among methods; give each name once")
    options = {name: dict((method_options or {}).get(name, {})) for name in methods}
    registered = {name: options[name].pop("method", name) for name in methods}
    first = explain_generation(model, tokenizer, prompts, max_new_tokens=max_new_tokens)
    given = {name: supplied_rows(name, value, first) for name, value in supplied.items()}
    targets = [g.token_ids[g.prompt_length:] for g in first]
    handle = model_handle(model)
    ks = tuple(k for k in K_VALUES if 0 < k < 1) if ks is None else tuple(float(k) for k in ks)
    if not ks or not all(0 < k < 1 for k in ks):
        raise InvalidInputError(f"ks must be ratios strictly between 0 and 1, got {ks!r}")
    pad = pad_token_id(tokenizer)
    steps = [(i, g, t) for i, g in enumerate(first) for t in range(g.steps) if g.prompt_length + t >= 2]
    originals = [_item(g, t) for _, g, t in steps]  # (a prefix of one token has nothing to delete: left out)
    probability = _Probabilities(handle, pad, batch_size)
    base = probability(originals, [g.token_ids[g.prompt_length + t] for _, g, t in steps])
    far = [] if keep_recent is None else \
        [s for s, item in enumerate(originals) if len(item.ids) - keep_recent >= min_far]
    result = {"aopc": {}, "per_step": {}, "curves": {}}
    correlation = {}
    for name in tqdm([*methods, *given], desc="methods", disable=not progress):
        if name in given:
            by_prompt = given[name]
        else:
            by_prompt = [g.rows() for g in explain_generation(model, tokenizer, prompts, method=registered[name],
                                                              target=targets, **options[name])]
        rows = [by_prompt[i][t] for i, _, t in steps]
        orders = [ranking(row, item) for row, item in zip(rows, originals)]
        correlation[name] = _position_correlation(rows)
        variants, wanted = [], []
        for (_, g, t), item, order in zip(steps, originals, orders):
            variants += [perturb(item, order, k, mode, "delete") for mode in MODES for k in ks]
            wanted += [g.token_ids[g.prompt_length + t]] * (len(MODES) * len(ks))
        for s in far:  # the far span only: the last keep_recent tokens are never ranked, so never perturbed
            item, order = originals[s], orders[s]
            distant = order[order < len(item.ids) - keep_recent]
            variants += [perturb(item, distant, k, mode, "delete", special_tokens="exclude") for mode in MODES
                         for k in ks]
            wanted += [steps[s][1].token_ids[len(item.ids)]] * (len(MODES) * len(ks))
        runs = len(steps) + len(far)
        drops = np.concatenate([base, base[far]])[:, None, None] - \
            probability(variants, wanted).reshape(runs, len(MODES), len(ks))
        result["aopc"][name], result["per_step"][name], result["curves"][name] = {}, {}, {}
        parts = [("", slice(0, len(steps)))] + ([("far_", slice(len(steps), runs))] if keep_recent else [])
        for prefix, part in parts:
            for m, mode in enumerate(MODES):
                per_step = [aopc(row, ks, within=None) for row in drops[part, m]]
                if prefix:  # one entry per step, None where the step has too few far tokens
                    full: list = [None] * len(steps)
                    for s, value in zip(far, per_step):
                        full[s] = value
                    result["per_step"][name][prefix + mode] = full
                else:
                    result["per_step"][name][mode] = per_step
                result["aopc"][name][prefix + mode] = float(np.mean(per_step)) if per_step else float("nan")
                result["curves"][name][prefix + mode] = drops[part, m].mean(0).tolist() if per_step else []
    settings = {"max_new_tokens": max_new_tokens, "method_options": options, "methods_run": registered,
                **({"supplied_rows": list(given)} if given else {}),
                "perturbation": "delete", "model_class": handle.name, "keep_recent": keep_recent,
                "min_far": min_far, "step_prompts": [i for i, _, _ in steps],
                "ranking": "signed scores, descending; the token before the generated one is never deleted"}
    return GenerationFaithfulness([*methods, *given], ks, len(prompts), len(steps), settings=settings,
                                  far_steps=len(far), position_correlation=correlation, **result)


def supplied_rows(name: str, value, generations) -> list[list[np.ndarray]]:
    """The rows given for ``name`` (see :func:`generation_faithfulness`'s ``rows``), checked against the
    protocol's ``generations``: one row per step, row t with ``prompt_length + t`` finite scores, computed on the
    protocol's ids."""
    if callable(value):
        given = value(list(generations))
    else:
        given = list(value)
        if len(given) != len(generations):
            raise InvalidInputError(f"rows[{name!r}] holds {len(given)} generations; the protocol has "
                                    f"{len(generations)} prompts")
        for i, (theirs, ours) in enumerate(zip(given, generations)):
            if list(getattr(theirs, "token_ids", ())) != list(ours.token_ids):
                raise InvalidInputError(f"rows[{name!r}], prompt {i}: computed on other ids than the protocol's "
                                        f"greedy generation {list(ours.token_ids)}")
        given = [g.rows() for g in given]
    given = list(given)
    if len(given) != len(generations):
        raise InvalidInputError(f"rows[{name!r}] gave rows for {len(given)} generations; the protocol has "
                                f"{len(generations)}")
    out = []
    for i, (by_step, g) in enumerate(zip(given, generations)):
        by_step = [np.asarray(r, dtype=np.float64) for r in by_step]
        if len(by_step) != g.steps or any(r.shape != (g.prompt_length + t,) for t, r in enumerate(by_step)):
            raise InvalidInputError(
                f"rows[{name!r}], prompt {i}: give one row per generated token ({g.steps}), row t with "
                f"{g.prompt_length} + t scores; got rows of {[r.shape for r in by_step]}")
        if not all(np.isfinite(r).all() for r in by_step):
            raise InvalidInputError(f"rows[{name!r}], prompt {i}: the rows hold NaN or infinite scores")
        out.append(by_step)
    return out


def _position_correlation(rows: Sequence[np.ndarray]) -> float:
    """The mean over rows (of three or more scores) of the Spearman correlation of the scores with the positions
    (ties get their mean rank; a constant row counts 0)."""
    values = []
    for row in rows:
        if len(row) < 3:
            continue
        ranks = _mean_ranks(np.nan_to_num(np.asarray(row, dtype=np.float64), nan=-np.inf))
        ranks -= ranks.mean()
        positions = np.arange(len(row), dtype=np.float64) - (len(row) - 1) / 2
        scale = np.sqrt((ranks ** 2).sum() * (positions ** 2).sum())
        values.append(float((ranks * positions).sum() / scale) if scale > 0 else 0.0)
    return float(np.mean(values)) if values else float("nan")


def _mean_ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(len(values), dtype=np.float64)
    for value in np.unique(values):  # ties: their mean rank
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


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
