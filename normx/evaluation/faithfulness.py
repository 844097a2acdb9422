"""Faithfulness of attributions: AOPC comprehensiveness and sufficiency, as in the NormXLogit paper.

For every method, each example's tokens are ranked by the method's scores for the model's predicted label (signed,
higher = more important; label-independent methods: their scores), then perturbed at K = 0, 10, ..., 100 %
(:mod:`normx.evaluation.perturbation` has the exact protocol: the pooled token is never ranked, masking with the
mask token or deleting, ``int(n * K)`` tokens). The model's own forward is run on every perturbed input; the curves
are, per K:

- classification: the **confidence drop** ``p(ŷ|x) − p(ŷ|x̃)`` averaged over examples (ŷ: the prediction on the
  unperturbed input) and the **accuracy** of the perturbed predictions against the gold labels;
- regression: the **Pearson** correlation of the perturbed predictions with the gold scores.

The AOPC of a curve is its mean over K = 10 ... 90 % (the reported figure). Comprehensiveness perturbs the most
important tokens (a faithful ranking gives a high confidence drop, a low accuracy / Pearson); sufficiency keeps
only the top K and perturbs the rest (low confidence drop, high accuracy / Pearson).

Library: :func:`evaluate` -> :class:`FaithfulnessReport` (``.write(folder)``: summary.json, curves.csv,
summary.csv, comprehensiveness.png, sufficiency.png). Command line: ``normx evaluate faithfulness``.

User data files (``--data PATH``): a TSV file with a header row (tab-separated, no quoting) or a JSONL file (one
object per line) with the fields ``text``, optionally ``text_pair`` (sentence-pair models) and ``label`` (a label
name or class index of the model, or a number for regression models; without labels there is no accuracy curve).
"""

from __future__ import annotations

import csv
import json
import math
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import data as glue
from ..adapters import get_adapter, unwrap_model
from ..errors import InvalidInputError, NormxError, PairNotSupportedError, UnsupportedModelError
from ..inputs import encode, pad_token_id, resolve_max_length
from ..method_flags import add_method_flags, given_options, option_words
from ..methods import get_method, list_methods
from ..targets import LabelSpace
from .commands import add_names_argument, names, output_folder
from .perturbation import (
    K_VALUES,
    MODES,
    SPECIAL_TOKENS,
    STRATEGIES,
    Item,
    Perturber,
    check_choice,
    resolve_strategy,
)

CLASSIFICATION_METRICS = ("confidence_drop", "accuracy")
REGRESSION_METRICS = ("pearson",)
DATA_SUFFIXES = (".tsv", ".jsonl")


# ---- data ------------------------------------------------------------------------------------------------------------

def load_examples(source: str, data_dir: str | None = None, limit: int | None = None) -> list[glue.Example]:
    """Examples from a GLUE task name (its ``"dev"`` split: :func:`normx.data.load`) or a user TSV / JSONL file
    (see the module docstring); the first ``limit`` of them."""
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise InvalidInputError(f"limit must be a positive integer or None, got {limit!r}")
    if source in glue.TASKS:
        examples = glue.load(source, "dev", data_dir)
    else:
        examples = read_examples(source)
    return examples[:limit] if limit is not None else examples


def read_examples(path: str | Path) -> list[glue.Example]:
    file = Path(path).expanduser()
    if not file.is_file():
        raise InvalidInputError(f"--data {str(path)!r} is neither a task ({', '.join(glue.TASKS)}) nor an existing "
                                f"file ({' or '.join(DATA_SUFFIXES)})")
    if file.suffix not in DATA_SUFFIXES:
        raise InvalidInputError(f"data file {file} has the suffix {file.suffix!r}; use a TSV (.tsv, with a header "
                                "row) or JSONL (.jsonl) file with the fields text, text_pair (optional), label")
    rows = _rows(file)  # (line number, row)
    examples, unlabelled = [], []
    for number, row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise InvalidInputError(f"{file}:{number}: no `text` field (the fields are text, text_pair, label)")
        pair = row.get("text_pair") or None
        label = row.get("label")
        if label in (None, ""):
            label = None
            unlabelled.append(number)
        examples.append(glue.Example(row["text"], pair, label))
    if not examples:
        raise InvalidInputError(f"data file {file} has no examples")
    if unlabelled and len(unlabelled) < len(examples):  # a few missing labels would silently drop the accuracy
        raise InvalidInputError(f"{file}:{unlabelled[0]}: no label, but other examples have one"
                                + (f" ({len(unlabelled)} without: lines {', '.join(map(str, unlabelled[:5]))}"
                                   + (", ..." if len(unlabelled) > 5 else "") + ")" if len(unlabelled) > 1 else "")
                                + "; give every example a label, or none")
    return examples


def _rows(file: Path) -> list[tuple[int, object]]:
    """(line number, row) of a TSV (by header) or JSONL file; clear errors for files that are not UTF-8 text."""
    rows = []
    try:
        with open(file, encoding="utf-8", newline="") as handle:
            if file.suffix == ".tsv":
                reader = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
                try:
                    for row in reader:
                        rows.append((reader.line_num, row))
                except csv.Error as exc:
                    raise InvalidInputError(f"{file}:{reader.line_num + 1}: not a TSV line ({exc})") from None
            else:
                for number, line in enumerate(handle, 1):
                    if line.strip():
                        try:
                            rows.append((number, json.loads(line)))
                        except json.JSONDecodeError as exc:
                            raise InvalidInputError(f"{file}:{number} is not valid JSON: {exc}") from None
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{file} is not UTF-8 text (an undecodable byte at offset {exc.start}); give a "
                                "UTF-8 TSV or JSONL file") from None
    return rows


def gold_labels(examples: Sequence, labels: LabelSpace, task: str | None = None) -> np.ndarray | None:
    """Gold labels as model columns (classification) or floats (regression); None when any example has none.

    Integer labels of a GLUE task are mapped through the task's label names to the model's labels of the same
    name, so a model whose labels are ordered differently is still scored right.
    """
    raw = [getattr(e, "label", None) for e in examples]
    if any(value is None for value in raw):
        if labels.regression:
            raise InvalidInputError("a regression model is scored by the Pearson correlation with gold scores, but "
                                    "some examples have no label")
        return None
    if labels.regression:
        try:
            return np.array([float(v) for v in raw], dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"regression labels must be numbers: {exc}") from exc
    names = [name.lower() for name in labels.names]
    task_names = glue.LABELS.get(task) if task in glue.LABELS else None
    out = []
    for value in raw:
        if isinstance(value, str):
            text = value.strip()
            if text.lower() in names:
                out.append(names.index(text.lower()))
                continue
            if not text.lstrip("-").isdigit():
                raise InvalidInputError(f"label {value!r} is not a label of this model; its labels are "
                                        f"{labels.names} (or indices 0..{len(names) - 1})")
            value = int(text)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise InvalidInputError(f"label {value!r} is neither a label name nor a class index")
        if task_names is not None and 0 <= value < len(task_names) and task_names[value].lower() in names:
            out.append(names.index(task_names[value].lower()))
        elif 0 <= value < len(names):
            out.append(int(value))
        else:
            raise InvalidInputError(f"label {value} is out of range: the model has {len(names)} labels {labels.names}")
    return np.array(out, dtype=np.int64)


# ---- metrics ---------------------------------------------------------------------------------------------------------

def aopc(curve: Sequence[float], ks: Sequence[float] = K_VALUES) -> float:
    """The area over the perturbation curve as reported: the mean of ``curve`` over 0 < K < 1 (K = 10 ... 90 %)."""
    values = [v for v, k in zip(curve, ks) if 0 < k < 1]
    if len(values) == 0 or len(curve) != len(ks):
        raise InvalidInputError(f"need one value per K ({len(ks)}) and at least one K strictly between 0 and 1")
    return float(np.mean(values))


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's r; NaN when either side is constant (e.g. every input perturbed to the same sequence)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    dx, dy = x - x.mean(), y - y.mean()
    denominator = math.sqrt(float((dx * dx).sum()) * float((dy * dy).sum()))
    return float((dx * dy).sum() / denominator) if denominator > 0 else float("nan")


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def classification_values(original: np.ndarray, perturbed: np.ndarray, gold: np.ndarray | None
                          ) -> dict[str, np.ndarray]:
    """Per-example values [N, K] from the logits of the original inputs [N, C] and the perturbed ones [N, K, C]:
    the confidence drop and (with gold labels) whether the perturbed prediction is right (0 / 1)."""
    p0 = softmax(original)
    predicted = p0.argmax(-1)
    rows = np.arange(len(predicted))
    probs = softmax(perturbed)
    values = {"confidence_drop": p0[rows, predicted][:, None] - probs[rows, :, predicted]}
    if gold is not None:
        values["accuracy"] = (probs.argmax(-1) == gold[:, None]).astype(np.float64)
    return values


def classification_curves(original: np.ndarray, perturbed: np.ndarray, gold: np.ndarray | None
                          ) -> dict[str, np.ndarray]:
    """Per-K curves (the per-example values averaged over examples)."""
    return {metric: values.mean(0) for metric, values in classification_values(original, perturbed, gold).items()}


def standard_error(values: np.ndarray, ks: Sequence[float] = K_VALUES) -> float:
    """The standard error of the AOPC over examples: per-example AOPCs (rows of ``values`` [N, K] averaged over
    0 < K < 1), their standard deviation / sqrt(N). NaN for a single example."""
    middle = [j for j, k in enumerate(ks) if 0 < k < 1]
    per_example = np.asarray(values, dtype=np.float64)[:, middle].mean(1)
    if len(per_example) < 2:
        return float("nan")
    return float(per_example.std(ddof=1) / math.sqrt(len(per_example)))


def regression_curves(perturbed: np.ndarray, gold: np.ndarray) -> dict[str, np.ndarray]:
    predictions = perturbed[..., 0]  # [N, K]
    return {"pearson": np.array([pearson(predictions[:, j], gold) for j in range(predictions.shape[1])])}


# ---- the report ------------------------------------------------------------------------------------------------------

@dataclass
class MethodResult:
    """One method's outputs: the logits of every perturbed input and the curves derived from them."""

    name: str
    logits: dict[str, np.ndarray]  # mode -> [N, K, C]
    curves: dict[str, dict[str, list[float]]]  # mode -> metric -> one value per K
    errors: dict[str, dict[str, float]] = field(default_factory=dict)  # mode -> metric -> standard error of AOPC
    options: dict = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # explain / perturb


@dataclass
class FaithfulnessReport:
    """The faithfulness of several methods on one model and data set."""

    settings: dict
    ks: tuple[float, ...]
    regression: bool
    original: dict  # the unperturbed model: accuracy or Pearson, mean confidence
    results: dict[str, MethodResult]
    skipped: dict[str, str] = field(default_factory=dict)  # method -> why it was not evaluated

    @property
    def methods(self) -> list[str]:
        return list(self.results)

    @property
    def metrics(self) -> list[str]:
        first = next(iter(self.results.values()), None)
        if first is None:
            return []
        return list(first.curves["comprehensiveness"])

    def curve(self, method: str, mode: str = "comprehensiveness", metric: str | None = None) -> list[float] | None:
        metric = metric or self.metrics[0]
        return self.results[method].curves[mode].get(metric)

    def aopc(self, method: str, mode: str = "comprehensiveness", metric: str | None = None) -> float:
        """The AOPC (mean over K = 10 ... 90 %) of one curve; ``metric`` defaults to the confidence drop
        (classification) or Pearson (regression)."""
        curve = self.curve(method, mode, metric)
        if curve is None:
            raise InvalidInputError(f"no {metric!r} curve; metrics: {self.metrics}")
        return aopc(curve, self.ks)

    def title(self) -> str:
        s = self.settings
        return f"{s.get('model', s.get('model_class'))} on {s.get('data', 'data')} ({s['examples']} examples)"

    def summary_rows(self) -> list[dict]:
        rows = []
        for method, result in self.results.items():
            for mode in MODES:
                for metric in result.curves[mode]:
                    rows.append({"method": method, "mode": mode, "metric": metric,
                                 "aopc": _json_float(self.aopc(method, mode, metric)),
                                 "standard_error": _json_float(result.errors.get(mode, {}).get(metric)),
                                 "examples": self.settings["examples"],
                                 "explain_seconds": result.seconds.get("explain"),
                                 "perturb_seconds": result.seconds.get("perturb")})
        return rows

    def to_dict(self) -> dict:
        methods = {}
        for method, result in self.results.items():
            methods[method] = {
                "options": _plain(result.options),
                "aopc": {mode: {metric: _json_float(self.aopc(method, mode, metric)) for metric in result.curves[mode]}
                         for mode in MODES},
                "aopc_standard_error": {mode: {metric: _json_float(value) for metric, value in errors.items()}
                                        for mode, errors in result.errors.items()},
                "curves": {mode: {metric: [_json_float(v) for v in values] for metric, values in curves.items()}
                           for mode, curves in result.curves.items()},
                "seconds": result.seconds,
            }
        return {"settings": _plain(self.settings), "ks": list(self.ks), "original": _plain(self.original),
                "methods": methods, "skipped": dict(self.skipped)}

    @classmethod
    def from_dict(cls, data: Mapping) -> FaithfulnessReport:
        """A report read back from :meth:`to_dict` / ``summary.json`` (curves and AOPCs; no logits), e.g. to plot
        or tabulate stored results."""
        results = {}
        for name, method in data["methods"].items():
            errors = {mode: {metric: math.nan if value is None else value for metric, value in metrics.items()}
                      for mode, metrics in method.get("aopc_standard_error", {}).items()}
            curves = {mode: {metric: [math.nan if v is None else v for v in values] for metric, values in
                             metrics.items()} for mode, metrics in method["curves"].items()}
            results[name] = MethodResult(name, {}, curves, errors, dict(method.get("options", {})),
                                         dict(method.get("seconds", {})))
        return cls(dict(data["settings"]), tuple(data["ks"]), bool(data["settings"]["regression"]),
                   dict(data["original"]), results, dict(data.get("skipped", {})))

    def write(self, folder: str | Path, plots: bool = True) -> list[Path]:
        """Write summary.json, curves.csv, summary.csv and (``plots``) comprehensiveness.png / sufficiency.png."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        written = [out / "summary.json", out / "curves.csv", out / "summary.csv"]
        written[0].write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        with open(written[1], "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["method", "mode", "metric", "k_percent", "value"])
            for method, result in self.results.items():
                for mode, curves in result.curves.items():
                    for metric, values in curves.items():
                        for k, value in zip(self.ks, values):
                            writer.writerow([method, mode, metric, round(100 * k), _csv_float(value)])
        with open(written[2], "w", newline="", encoding="utf-8") as handle:
            rows = self.summary_rows()
            fields = ["method", "mode", "metric", "aopc", "standard_error", "examples", "explain_seconds",
                      "perturb_seconds"]
            writer = csv.DictWriter(handle, fieldnames=fields)
            writer.writeheader()
            for row in rows:
                writer.writerow({k: _csv_float(v) if k in ("aopc", "standard_error") else v for k, v in row.items()})
        if plots and self.results:
            from .plots import plot_mode

            written += [plot_mode(self, mode, out / f"{mode}.png") for mode in MODES]
        return written


# ---- the evaluation ----------------------------------------------------------------------------------------------

def evaluate(model, tokenizer, examples: Sequence, methods: str | Sequence[str] | None = None, *,
             task: str | None = None, ks: Sequence[float] = K_VALUES, special_tokens: str = "include",
             perturbation: str = "auto", batch_size: int = 16, eval_batch_size: int = 64,
             max_length: int | None = None, method_options: Mapping[str, Mapping] | None = None,
             progress: bool = True, skip_unsupported: bool = False, data: str | None = None
             ) -> FaithfulnessReport:
    """AOPC comprehensiveness and sufficiency of ``methods`` on ``examples``.

    Args:
        model, tokenizer: a sequence-classification model normx supports (PEFT-wrapped or not) and its tokenizer.
        examples: :class:`normx.data.Example` objects (``text``, ``pair``, ``label``) or plain texts (no labels:
            no accuracy curve); :func:`load_examples` reads task data and user files.
        methods: method names (default: every registered method, ``normx.list_methods()``).
        task: the GLUE task the examples come from, to map its label indices to the model's labels by name.
        ks: perturbation ratios (default 0, 0.1, ..., 1); the AOPC averages those strictly between 0 and 1.
        special_tokens: ``"include"`` (the authors' protocol: special tokens other than the pooled one are ranked
            and perturbed like words) or ``"exclude"`` (never perturbed).
        perturbation: ``"auto"`` (mask when the tokenizer has a mask token, else delete), ``"mask"``, ``"delete"``.
        batch_size: texts per :func:`normx.explain` batch; ``eval_batch_size``: perturbed inputs per forward pass.
        max_length: input length cap in tokens (default: what the model accepts); longer inputs are truncated.
        method_options: ``{method: {option: value}}``, e.g. ``{"random": {"seed": 1}}``.
        skip_unsupported: record (instead of raising) methods that cannot explain this model.
        data: a description of the data for the report (e.g. ``"sst2"`` or a path).
    """
    import normx

    base = unwrap_model(model)
    adapter = get_adapter(model)
    if adapter.kind != "sequence_classification":
        raise UnsupportedModelError(
            f"faithfulness is measured on classification / regression heads; {type(base).__name__} is a "
            f"{adapter.kind.replace('_', ' ')} model. Use a *ForSequenceClassification model (see `normx models`).")
    labels = LabelSpace(adapter.kind, base.config, tokenizer)
    examples = [glue.Example(e, None, None) if isinstance(e, str) else e for e in examples]
    if not examples:
        raise InvalidInputError("examples is empty; give at least one example")
    names = _method_names(methods)
    options = _method_options(names, method_options)
    ks = _check_ks(ks)
    check_choice("special_tokens", special_tokens, SPECIAL_TOKENS)
    strategy = resolve_strategy(perturbation, tokenizer.mask_token_id)
    for name, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidInputError(f"{name} must be a positive integer, got {value!r}")
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

    limit = resolve_max_length(max_length, tokenizer, base)
    encoded = encode(tokenizer, texts, pairs, limit, "warn")
    runner = Perturber(model, strategy, tokenizer.mask_token_id, ks, special_tokens, pad_id=pad_token_id(tokenizer),
                       padding_side=adapter.padding_side(tokenizer), position_ids=adapter.decoder,
                       batch_size=eval_batch_size, progress=progress)
    original = runner.logits([_item(e, 0) for e in encoded], desc="original inputs")
    predicted = original.argmax(-1)

    skipped: dict[str, str] = {}
    for name in list(names):  # what a method supports is on the method: no need to try it
        reason = get_method(name).unsupported(adapter)
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
        explanations = _explain(normx, model, tokenizer, texts, pairs, name, options[name], batch_size, limit,
                                progress)
        explain_seconds = time.perf_counter() - start
        items = _aligned_items(encoded, explanations, items, name)
        if not labels.regression:
            mismatches = max(mismatches, sum(e.labels[0] != labels.names[p] for e, p in zip(explanations, predicted)))
        start = time.perf_counter()
        perturbed = runner.perturbed_logits(items, [e.token_scores() for e in explanations],
                                            desc=f"perturbed inputs {name}")
        curves, errors = {}, {}
        for mode, logits in perturbed.items():
            if labels.regression:
                values = regression_curves(logits, gold)
                errors[mode] = {metric: float("nan") for metric in values}  # Pearson is not a per-example mean
            else:
                per_example = classification_values(original, logits, gold)
                values = {metric: v.mean(0) for metric, v in per_example.items()}
                errors[mode] = {metric: standard_error(v, ks) for metric, v in per_example.items()}
            curves[mode] = {metric: [float(v) for v in curve] for metric, curve in values.items()}
        results[name] = MethodResult(name, perturbed, curves, errors, options[name],
                                     {"explain": round(explain_seconds, 2),
                                      "perturb": round(time.perf_counter() - start, 2)})

    settings = _settings(model, base, adapter, labels, tokenizer, examples, ks, special_tokens, strategy, limit,
                         batch_size, eval_batch_size, data, task, mismatches, encoded)
    return FaithfulnessReport(settings, ks, labels.regression, _original(labels, original, gold), results, skipped)


def _explain(normx, model, tokenizer, texts, pairs, name, options, batch_size, max_length, progress):
    explanations = []
    chunks = range(0, len(texts), batch_size)
    if progress:
        from tqdm.auto import tqdm

        chunks = tqdm(chunks, desc=f"explain {name}", dynamic_ncols=True, leave=False)
    for start in chunks:
        chunk_pairs = None if pairs is None else pairs[start:start + batch_size]
        explanations += normx.explain(model, tokenizer, texts[start:start + batch_size], method=name,
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


def _method_names(methods) -> list[str]:
    if methods is None or methods == "all":
        return list_methods()
    names = [methods] if isinstance(methods, str) else list(methods)
    if not names:
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


def _settings(model, base, adapter, labels, tokenizer, examples, ks, special_tokens, strategy, limit, batch_size,
              eval_batch_size, data, task, mismatches, encoded) -> dict:
    import torch

    import normx

    param = next(base.parameters(), None)
    return {
        "model_class": type(base).__name__, "family": adapter.family, "peft": base is not model,
        "regression": labels.regression, "labels": labels.names, "data": data, "task": task,
        "examples": len(examples), "truncated": sum(bool(e.warnings) for e in encoded),
        "ks": list(ks), "aopc_ks": [k for k in ks if 0 < k < 1], "special_tokens": special_tokens,
        "perturbation": strategy, "mask_token": tokenizer.mask_token if strategy == "mask" else None,
        "ranking": "signed scores for the predicted label (label-independent methods: their scores), descending; "
                   "the pooled token is never ranked",
        "max_length": limit, "batch_size": batch_size, "eval_batch_size": eval_batch_size,
        "explained_label_mismatches": mismatches,
        "dtype": None if param is None else str(param.dtype).replace("torch.", ""),
        "device": None if param is None else str(param.device),
        "normx": normx.__version__, "torch": torch.__version__, "python": platform.python_version(),
        "machine": platform.machine(),
    }


def _json_float(value):
    return None if value is None or not math.isfinite(value) else float(value)


def _csv_float(value):
    return "" if value is None or not math.isfinite(value) else f"{value:.6f}"


def _plain(value):
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return _json_float(value)
    if isinstance(value, np.generic):
        return _plain(value.item())
    return value


# ---- command line ------------------------------------------------------------------------------------------------

def add_parser(subparsers):
    parser = subparsers.add_parser(
        "faithfulness", help="AOPC comprehensiveness / sufficiency of attribution methods on a model and data set",
        description="Rank each example's tokens by each method's attributions, perturb the top K% (comprehensiveness)"
                    " or all but the top K% (sufficiency) for K = 0..100%, and report the confidence drop and "
                    "accuracy (Pearson for regression) curves and their AOPC (mean over K = 10..90%).")
    parser.add_argument("--model", required=True, help="a preset name (`normx models`), a model folder or a hub id")
    parser.add_argument("--data", required=True,
                        help=f"a task ({', '.join(glue.TASKS)}: its dev split, from --data-dir or $NORMX_DATA) or a "
                             "TSV / JSONL file with the fields text, text_pair (optional), label")
    parser.add_argument("--data-dir", default=None, help="the GLUE data folder (default: $NORMX_DATA)")
    add_names_argument(parser, "--methods", "method names (`normx methods`), or all (the default)")
    parser.add_argument("--limit", type=int, default=None, help="evaluate the first N examples")
    parser.add_argument("--out", required=True, help="output folder for summary.json, curves.csv, summary.csv, PNGs")
    parser.add_argument("--special-tokens", default="include", choices=SPECIAL_TOKENS,
                        help="include: [SEP] etc. are ranked and perturbed like words (the authors' protocol); "
                             "exclude: never perturbed. The pooled token is never perturbed.")
    parser.add_argument("--perturbation", default="auto", choices=STRATEGIES,
                        help="auto: replace by the mask token if the tokenizer has one, else delete")
    parser.add_argument("--batch-size", type=int, default=16, help="texts per explain batch")
    parser.add_argument("--eval-batch-size", type=int, default=64, help="perturbed inputs per forward pass")
    parser.add_argument("--max-length", type=int, default=None, help="truncate inputs to this many tokens")
    add_method_flags(parser)
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG figures")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)
    return parser


def run(args) -> int:
    import normx

    methods = names(args.methods)
    if methods == ["all"] or not methods:
        methods = None
    chosen = _method_names(methods)
    given = given_options(args)
    method_options = {m: {k: v for k, v in given.items() if k in get_method(m).options} for m in chosen}
    unused = sorted(set(given) - {k for opts in method_options.values() for k in opts})
    if unused:
        raise InvalidInputError(f"option(s) {', '.join('--' + u.replace('_', '-') for u in unused)} given, but none "
                                f"of the methods {chosen} takes them")
    examples = load_examples(args.data, args.data_dir, args.limit)
    output_folder(args.out)
    model, tokenizer = normx.load_model(args.model)
    report = evaluate(model, tokenizer, examples, chosen, task=args.data if args.data in glue.TASKS else None,
                      special_tokens=args.special_tokens, perturbation=args.perturbation, batch_size=args.batch_size,
                      eval_batch_size=args.eval_batch_size, max_length=args.max_length,
                      method_options={m: o for m, o in method_options.items() if o}, progress=not args.no_progress,
                      skip_unsupported=methods is None, data=args.data)
    report.settings["model"] = args.model
    report.settings["command"] = _command(args)
    report.write(args.out, plots=not args.no_plots)
    print(format_table(report))
    print(f"wrote {args.out}/summary.json, curves.csv, summary.csv" + ("" if args.no_plots else
          ", comprehensiveness.png, sufficiency.png"))
    return 0


def format_table(report: FaithfulnessReport) -> str:
    """A plain-text table of the AOPCs, one row per method."""
    columns = [(mode, metric) for mode in MODES for metric in report.metrics]
    heads = [f"{'comp' if mode == 'comprehensiveness' else 'suff'} {metric}" for mode, metric in columns]
    lines = [f"{'method':<22}" + "".join(f"{h:>22}" for h in heads)]
    for method in report.methods:
        cells = []
        for mode, metric in columns:
            value = report.aopc(method, mode, metric)
            error = report.results[method].errors.get(mode, {}).get(metric, float("nan"))
            text = "n/a" if not math.isfinite(value) else f"{value:.4f}" + (f" ±{error:.4f}" if math.isfinite(error)
                                                                            else "")
            cells.append(f"{text:>22}")
        lines.append(f"{method:<22}" + "".join(cells))
    original = ", ".join(f"{k} {v:.4f}" for k, v in report.original.items())
    lines.append(f"AOPC over K = 10..90% (± standard error over examples); {report.settings['examples']} examples; "
                 f"unperturbed: {original}")
    for method, why in report.skipped.items():
        lines.append(f"skipped {method}: {why}")
    return "\n".join(lines)


def _command(args) -> str:
    parts = ["normx evaluate faithfulness", f"--model {args.model}", f"--data {args.data}"]
    if args.data_dir:
        parts.append(f"--data-dir {args.data_dir}")
    parts.append(f"--methods {','.join(names(args.methods) or ['all'])}")
    if args.limit is not None:
        parts.append(f"--limit {args.limit}")
    if args.special_tokens != "include":
        parts.append(f"--special-tokens {args.special_tokens}")
    if args.perturbation != "auto":
        parts.append(f"--perturbation {args.perturbation}")
    if args.max_length is not None:
        parts.append(f"--max-length {args.max_length}")
    parts += option_words(args)
    parts.append(f"--out {args.out}")
    return " ".join(parts)


__all__ = ["FaithfulnessReport", "MethodResult", "aopc", "classification_curves", "classification_values",
           "evaluate", "format_table", "gold_labels", "load_examples", "pearson", "read_examples", "regression_curves",
           "standard_error"]
