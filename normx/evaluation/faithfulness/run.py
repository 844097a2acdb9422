"""Faithfulness of attributions: AOPC comprehensiveness and sufficiency, as in the NormXLogit paper.

For every method, each example's tokens are ranked by the method's scores for the model's predicted label (signed,
higher = more important; label-independent methods: their scores), then perturbed at K = 0, 10, ..., 100 %
(:mod:`~normx.evaluation.faithfulness.perturbation` has the exact protocol: the pooled token is never ranked, masking
with the mask token or deleting, ``int(n * K)`` tokens). The model's own forward is run on every perturbed input; the
curves are, per K:

- classification: the **confidence drop** ``p(ŷ|x) − p(ŷ|x̃)`` averaged over examples (ŷ: the prediction on the
  unperturbed input) and the **accuracy** of the perturbed predictions against the gold labels;
- regression: the **Pearson** correlation of the perturbed predictions with the gold scores.

The AOPC of a curve is its mean over K = 10 ... 90 % (the reported figure). Comprehensiveness perturbs the most
important tokens (a faithful ranking gives a high confidence drop, a low accuracy / Pearson); sufficiency keeps only the
top K and perturbs the rest (low confidence drop, high accuracy / Pearson).

This module runs the evaluation: :func:`evaluate` -> :class:`~normx.evaluation.faithfulness.report.FaithfulnessReport`
(``.write(folder)``: summary.json, curves.csv, summary.csv, comprehensiveness.png, sufficiency.png). The data is read by
:mod:`~.examples`, the curves computed by :mod:`~.metrics`, the report kept by :mod:`~.report`; the command line
(``normx evaluate faithfulness``) is :mod:`normx.cli.faithfulness`.
"""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from normx._version import __version__
from normx.core.handle import ModelHandle, model_handle
from normx.core.inputs import encode, positive_int, resolve_max_length
from normx.core.labels import LabelSpace
from normx.data import glue
from normx.errors import InvalidInputError, NormxError, PairNotSupportedError, UnsupportedModelError
from normx.evaluation.faithfulness.examples import gold_labels
from normx.evaluation.faithfulness.metrics import (
    classification_values,
    example_aopcs,
    pearson,
    regression_curves,
    softmax,
    standard_error,
)
from normx.evaluation.faithfulness.perturbation import (
    K_VALUES,
    SPECIAL_TOKENS,
    Item,
    Perturber,
    check_choice,
    resolve_strategy,
)
from normx.evaluation.faithfulness.report import FaithfulnessReport, MethodResult
from normx.explanations.explain import explain, model_settings
from normx.methods import get_method, list_methods
from normx.models import HeadKind

# regression heads: LogAt / NormXLogit rank the tokens whose head output is farthest from the prediction first (the
# paper's formula, the default) or closest first (its stated intuition)
RANKINGS = ("farthest", "closest")


@dataclass(frozen=True)
class SuppliedScores:
    """A ranking computed elsewhere (another library's attributions), given to :func:`evaluate` among its
    ``methods`` and scored by the same protocol under ``name``: ``scores`` is one array per example, a score per
    token of the example as the tokenizer encodes it (special tokens included, as ``normx.explain`` covers it), for
    the model's predicted label; or a function ``scores(examples, predicted)`` returning them (``predicted``: the
    label name the model predicts for each example, the one a ranking must explain)."""

    name: str
    scores: Callable[[list, list[str]], Sequence[np.ndarray]] | Sequence[np.ndarray]


def evaluate(model, tokenizer, examples: Sequence, methods: str | Sequence[str] | None = None, *,
             task: str | None = None, ks: Sequence[float] = K_VALUES, special_tokens: str = "include",
             perturbation: str = "auto", batch_size: int = 16, eval_batch_size: int = 64,
             max_length: int | None = None, method_options: Mapping[str, Mapping] | None = None,
             progress: bool = True, skip_unsupported: bool = False, regression_ranking: str = "farthest"
             ) -> FaithfulnessReport:
    """AOPC comprehensiveness and sufficiency of ``methods`` on ``examples``.

    Args:
        model, tokenizer: a sequence-classification model normx supports (PEFT-wrapped or not) and its tokenizer.
        examples: :class:`normx.data.glue.Example` objects (``text``, ``pair``, ``label``) or plain texts (no labels:
            no accuracy curve); :func:`load_examples` reads task data and user files.
        methods: method names (default: every registered method, ``normx.list_methods()``), and
            :class:`SuppliedScores` (rankings computed elsewhere, scored after the methods).
        task: the GLUE task the examples come from, to map its label indices to the model's labels by name.
        ks: perturbation ratios (default 0, 0.1, ..., 1); the AOPC averages those strictly between 0 and 1.
        special_tokens: ``"include"`` (the authors' protocol: special tokens other than the pooled one are ranked
            and perturbed like words) or ``"exclude"`` (never perturbed).
        perturbation: ``"auto"`` (mask when the tokenizer has a mask token, else delete), ``"mask"``, ``"delete"``.
        batch_size: texts per :func:`normx.explain` batch; ``eval_batch_size``: perturbed inputs per forward pass.
        max_length: input length cap in tokens (default: what the model accepts); longer inputs are truncated.
        method_options: ``{method: {option: value}}``, e.g. ``{"random": {"seed": 1}}``.
        skip_unsupported: record (instead of raising) methods that cannot explain this model.
        regression_ranking: regression models only: LogAt / NormXLogit rank tokens ``"farthest"`` from the
            prediction first (the paper's formula; default) or ``"closest"`` first. The report's ``data`` setting
            is the task (the command line records the file it read).
    """
    handle = model_handle(model)
    base, adapter = handle.base, handle.adapter
    if adapter.kind is not HeadKind.SEQUENCE_CLASSIFICATION:
        raise UnsupportedModelError(
            f"faithfulness is measured on classification / regression heads; {type(base).__name__} is a "
            f"{adapter.kind.replace('_', ' ')} model. Use a *ForSequenceClassification model (see `normx models`).")
    labels = LabelSpace(adapter.kind, base.config, tokenizer)
    examples = [glue.Example(e, None, None) if isinstance(e, str) else e for e in examples]
    if not examples:
        raise InvalidInputError("examples is empty; give at least one example")
    supplied = [m for m in ([] if methods is None or isinstance(methods, str) else methods)
                if isinstance(m, SuppliedScores)]
    names = _method_names([m for m in methods if not isinstance(m, SuppliedScores)] if supplied else methods,
                          allow_empty=bool(supplied))
    taken = [m.name for m in supplied if m.name in names] + [n for n, _ in _repeated([m.name for m in supplied])]
    if taken:
        raise InvalidInputError(f"supplied scores named {taken}: each name once, and none a method's")
    options = _method_options(names, method_options)
    ks = _check_ks(ks)
    check_choice("special_tokens", special_tokens, SPECIAL_TOKENS)
    check_choice("regression_ranking", regression_ranking, RANKINGS)
    strategy = resolve_strategy(perturbation, tokenizer.mask_token_id)
    positive_int(batch_size, "batch_size")
    positive_int(eval_batch_size, "eval_batch_size")
    texts = [e.text for e in examples]
    pairs = [e.pair for e in examples]
    if any(p is not None for p in pairs):
        if any(p is None for p in pairs):
            raise InvalidInputError("some examples have a text_pair and some do not; give all or none")
        if getattr(base.config, "normx_inputs", "pair") == "single":
            raise PairNotSupportedError(f"the examples are text pairs, but {type(base).__name__} takes single texts")
    else:
        pairs = None
    gold = gold_labels(examples, labels, task)

    limit = resolve_max_length(max_length, tokenizer, handle)
    encoded = encode(tokenizer, texts, pairs, limit, "warn")
    runner = Perturber(model, strategy, tokenizer.mask_token_id, ks, special_tokens, batch_size=eval_batch_size,
                       progress=progress)
    original = runner.logits([_item(e, 0) for e in encoded], desc="original inputs")
    predicted = original.argmax(-1)

    skipped: dict[str, str] = {}
    for name in list(names):  # what a method supports is on the method: no need to try it
        reason = get_method(name).unsupported(model)
        if reason is None:
            continue
        if not skip_unsupported:
            raise UnsupportedModelError(f"{name}: {reason}")
        skipped[name] = reason
        names.remove(name)
        print(f"normx: skipping {name}: {reason}", file=sys.stderr)

    items: list[Item] | None = None
    results: dict[str, MethodResult] = {}
    mismatches = 0
    for name in names:
        start = time.perf_counter()
        explanations = _explain(model, tokenizer, texts, pairs, name, options[name], batch_size, limit,
                                progress)
        explain_seconds = time.perf_counter() - start
        items = _aligned_items(encoded, explanations, items, name)
        if not labels.regression:
            mismatches = max(mismatches, sum(e.labels[0] != labels.names[p] for e, p in zip(explanations, predicted)))
        start = time.perf_counter()
        sign = -1.0 if labels.regression and regression_ranking == "closest" and get_method(name).regression_distance \
            else 1.0
        perturbed = runner.perturbed_logits(items, [sign * e.token_scores() for e in explanations],
                                            desc=f"perturbed inputs {name}")
        results[name] = _method_result(name, perturbed, labels, original, gold, ks, options[name],
                                       {"explain": round(explain_seconds, 2),
                                        "perturb": round(time.perf_counter() - start, 2)})

    for given in supplied:
        start = time.perf_counter()
        scores = _supplied(given, examples, [labels.names[p] for p in predicted] if not labels.regression
                           else [labels.names[0]] * len(examples), encoded)
        items = items or [_item(e, _pooled(handle, e, tokenizer)) for e in encoded]
        perturbed = runner.perturbed_logits(items, scores, desc=f"perturbed inputs {given.name}")
        results[given.name] = _method_result(given.name, perturbed, labels, original, gold, ks, {"supplied": True},
                                             {"explain": 0.0, "perturb": round(time.perf_counter() - start, 2)})

    settings = _settings(handle, labels, encoded, {
        "data": task, "task": task, "ks": list(ks), "special_tokens": special_tokens, "perturbation": strategy,
        "mask_token": tokenizer.mask_token if strategy == "mask" else None, "max_length": limit,
        "batch_size": batch_size, "eval_batch_size": eval_batch_size, "explained_label_mismatches": mismatches,
        "regression_ranking": regression_ranking if labels.regression else None})
    return FaithfulnessReport(settings, ks, labels.regression, _original(labels, original, gold), results, skipped)


def _method_result(name, perturbed, labels, original, gold, ks, options, seconds) -> MethodResult:
    curves, errors, examples = {}, {}, {}
    for mode, logits in perturbed.items():
        if labels.regression:
            values = regression_curves(logits, gold)
            errors[mode] = {metric: float("nan") for metric in values}  # Pearson is not a per-example mean
        else:
            per_example = classification_values(original, logits, gold)
            values = {metric: v.mean(0) for metric, v in per_example.items()}
            errors[mode] = {metric: standard_error(v, ks) for metric, v in per_example.items()}
            examples[mode] = {metric: example_aopcs(v, ks).tolist() for metric, v in per_example.items()}
        curves[mode] = {metric: [float(v) for v in curve] for metric, curve in values.items()}
    return MethodResult(name, perturbed, curves, errors, options, seconds, examples)


def _supplied(given: SuppliedScores, examples, predicted: list[str], encoded) -> list[np.ndarray]:
    """``given``'s scores, one finite array per example over its encoded tokens."""
    scores = given.scores(list(examples), predicted) if callable(given.scores) else given.scores
    scores = [np.asarray(s, dtype=np.float64) for s in scores]
    if len(scores) != len(encoded):
        raise InvalidInputError(f"{given.name}: scores for {len(scores)} examples, but there are {len(encoded)}")
    for index, (values, enc) in enumerate(zip(scores, encoded)):
        if values.shape != (len(enc.ids),):
            raise InvalidInputError(f"{given.name}, example {index}: give one score per token of the encoded "
                                    f"example ({len(enc.ids)}: {enc.tokens}); got shape {values.shape}")
        if not np.isfinite(values).all():
            raise InvalidInputError(f"{given.name}, example {index}: the scores hold NaN or infinite values")
    return scores


def _pooled(handle: ModelHandle, encoded, tokenizer) -> int:
    """The position the model's prediction is read at for one encoded example (the adapter's pooling)."""
    import torch

    ids = torch.tensor([list(encoded.ids)])
    return int(handle.adapter.pooled_positions(handle.base.config, {"input_ids": ids,
                                                                     "attention_mask": torch.ones_like(ids)},
                                               tokenizer.mask_token_id)[0])


def _repeated(names: list[str]) -> list[tuple[str, int]]:
    return [(n, names.count(n)) for n in dict.fromkeys(names) if names.count(n) > 1]


def _explain(model, tokenizer, texts, pairs, name, options, batch_size, max_length, progress):
    explanations = []
    chunks = range(0, len(texts), batch_size)
    if progress:
        from tqdm.auto import tqdm

        chunks = tqdm(chunks, desc=f"explain {name}", dynamic_ncols=True, leave=False)
    for start in chunks:
        chunk_pairs = None if pairs is None else pairs[start:start + batch_size]
        explanations += explain(model, tokenizer, texts[start:start + batch_size], method=name,
                                      text_pair=chunk_pairs, batch_size=batch_size, max_length=max_length,
                                      **options)
    return explanations


def _aligned_items(encoded, explanations, items: list[Item] | None, method: str) -> list[Item]:
    """The inputs as :class:`Item` with their pooled positions, after checking that every explanation covers
    exactly the tokens that are perturbed (same ids -> same tokens, same length, same pooled token)."""
    out = []
    for index, (enc, exp) in enumerate(zip(encoded, explanations)):
        pooled = int(exp.pooled)
        if list(exp.tokens) != list(enc.tokens) or exp.scores.shape[-1] != len(enc.ids):
            raise NormxError(f"method {method!r}: the explanation of example {index} covers the tokens "
                             f"{exp.tokens} but the perturbed input has {enc.tokens}; they must align")
        if items is not None and items[index].pooled != pooled:
            raise NormxError(f"method {method!r}: example {index} is pooled at token {pooled}, not "
                             f"{items[index].pooled} as for the other methods")
        out.append(_item(enc, pooled))
    return out


def _item(encoded, pooled: int) -> Item:
    return Item(tuple(encoded.ids), tuple(encoded.special), pooled, {k: tuple(v) for k, v in encoded.extra.items()})


def _method_names(methods, allow_empty: bool = False) -> list[str]:
    if methods is None or methods == "all":
        return list_methods()
    names = [methods] if isinstance(methods, str) else list(methods)
    if not names and not allow_empty:
        raise InvalidInputError("methods is empty; give at least one method name (or None for all)")
    for name in names:
        get_method(name)  # raises UnknownMethodError listing the registered methods
    return list(dict.fromkeys(names))


def _method_options(names: list[str], given: Mapping[str, Mapping] | None) -> dict[str, dict]:
    given = dict(given or {})
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise InvalidInputError(f"method_options names {unknown}, which are not among the evaluated methods {names}")
    return {name: get_method(name).resolve_options(dict(given.get(name, {}))) for name in names}


def _check_ks(ks) -> tuple[float, ...]:
    try:
        values = tuple(float(k) for k in ks)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"ks must be numbers in [0, 1], got {ks!r}") from exc
    if not values or any(not 0 <= k <= 1 for k in values) or list(values) != sorted(set(values)):
        raise InvalidInputError(f"ks must be increasing, distinct ratios in [0, 1], got {ks!r}")
    if not any(0 < k < 1 for k in values):
        raise InvalidInputError(f"ks needs at least one ratio strictly between 0 and 1 for the AOPC, got {ks!r}")
    return values


def _original(labels: LabelSpace, original: np.ndarray, gold) -> dict:
    if labels.regression:
        return {"pearson": pearson(original[:, 0], gold)}
    probs = softmax(original)
    out = {"mean_confidence": float(probs.max(-1).mean())}
    if gold is not None:
        out["accuracy"] = float((probs.argmax(-1) == gold).mean())
    return out


def _settings(handle: ModelHandle, labels: LabelSpace, encoded, protocol: dict) -> dict:
    """The report's settings: the model's, the protocol's (``protocol``: data, ks, perturbation, batch sizes...),
    the software's."""
    import torch

    settings = model_settings(handle)
    return {
        "model_class": settings["model_class"], "family": handle.adapter.family, "peft": settings["peft"],
        "regression": labels.regression, "labels": labels.names, "examples": len(encoded),
        "truncated": sum(bool(e.warnings) for e in encoded), **protocol,
        "aopc_ks": [k for k in protocol["ks"] if 0 < k < 1],
        "ranking": "signed scores for the predicted label (label-independent methods: their scores), descending; "
                   "the pooled token is never ranked",
        "dtype": settings["dtype"], "device": settings["device"],
        "normx": __version__, "torch": torch.__version__, "python": platform.python_version(),
        "machine": platform.machine(),
    }
