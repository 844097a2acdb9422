"""Evidence alignment on BLiMP: do per-layer attributions point at the word that decides the target word?

For each minimal pair (see :mod:`normx.data.blimp` for the target and evidence rules) the model is asked
for the good target word against the bad one (the foil):

- **masked-LM** models (a ``...ForMaskedLM`` head): the sentence with the target word replaced by the mask
  token; scores are read at the mask, whose own position is left out of the alignment.
- **causal-LM** models: the prefix before the target word; the target is the next token. Only pairs whose
  evidence precedes the target can be scored (true of every paradigm here).

Words may split into several tokens: the target and foil are the *first* token of the good and bad word as the
tokenizer splits them in context (for a causal LM: the token that follows the prefix in the tokenized sentence,
a leading-space token included); pairs where the two coincide are skipped and counted. The evidence tokens are
found through the explanation's character offsets: by default every token of the evidence *phrase* (the
antecedent noun phrase for ``ana``, the evidence word elsewhere: the authors' definitions), or every token of the
evidence word, or only its first token (``evidence``, :data:`~normx.data.blimp.EVIDENCE`). Special tokens
stay among the ranked tokens, as in the paper's code, unless ``special_tokens="exclude"``.

Curves: for every method, the mean Dot Product and Average Precision (:mod:`~.alignment`) per layer,
per paradigm and pooled over all of them. ``logat`` gives two curves, LogAt(target) and LogAt(foil) (the head's
logit of the foil token on each token). Any registered method can be named; those that do not support the model
are reported as not applicable. Methods without per-layer scores (``random``, gradients) give one value, drawn as
a flat line.

The report is :mod:`~normx.evaluation.blimp.report`; the command, :mod:`~normx.cli.blimp`:
``normx evaluate blimp --model M --paradigms ana dna ... --out DIR`` writes ``blimp.json``, ``curves.csv``,
``summary.csv``, ``coverage.csv``, ``dp.png`` and ``ap.png``.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence

import numpy as np

from normx.core.inputs import positive_int
from normx.data import blimp as ev
from normx.data.blimp_items import Item, prepare, split_pairs
from normx.errors import InvalidInputError, NormxError
from normx.evaluation.blimp.alignment import average_precision, dot_product
from normx.evaluation.blimp.report import METRICS, BlimpReport, curve_names
from normx.explanations.explain import explain
from normx.methods import get_method, list_methods
from normx.models import HeadKind

SETTINGS = {HeadKind.MASKED_LM: "masked", HeadKind.CAUSAL_LM: "causal"}
SPLITS = ("all", "train", "dev")
SPECIAL_TOKENS = ("include", "exclude")


def positions(explanation, item: Item, mask_token: str | None, evidence: str = "phrase",
              special_tokens: str = "include") -> tuple[list[int], list[int]] | None:
    """(evidence token positions, excluded positions) in an explanation of ``item.text``; None if the evidence
    is not among its tokens (e.g. truncated). ``evidence="first"`` keeps the first token of each evidence span,
    the other settings every token; ``special_tokens="exclude"`` leaves special tokens out of the ranking."""
    found = []
    for span in item.evidence_spans:
        hits = [i for i, (a, b) in enumerate(explanation.offsets) if a < span[1] and b > span[0]
                and not explanation.special[i]]
        if not hits:
            return None
        found.extend(hits[:1] if evidence == "first" else hits)
    exclude = [i for i, t in enumerate(explanation.tokens) if mask_token is not None and t == mask_token][:1]
    if special_tokens == "exclude":
        exclude += [i for i, special in enumerate(explanation.special) if special and i not in exclude]
    return list(dict.fromkeys(found)), exclude


# ---- running the methods -----------------------------------------------------------------------------------------


def resolve_methods(names: Sequence[str] | None) -> list[str]:
    """Method names to run (default: LogAt, NormXLogit, l2, random and whichever decomposition baselines are
    registered); unknown names raise, listing the registered ones."""
    if names is None:
        # every method with per-layer scores, and the label-independent baselines (random): not the gradients
        names = [m for m in list_methods() if get_method(m).layered or not get_method(m).label_dependent]
    names = list(dict.fromkeys(names))
    if not names:
        raise InvalidInputError(f"no methods given; choose from {', '.join(list_methods())}")
    for name in names:
        get_method(name)
    return names


def _explain_batch(model, tokenizer, method, items: list[Item], seed: int) -> dict[str, list[tuple]]:
    """Scores [layers, tokens] of each item for each of the method's curves, with the explanations."""
    spec = get_method(method)
    options = {"seed": seed} if "seed" in spec.options else {}
    layer = spec.all_layers
    texts = [item.text for item in items]
    if spec.foil_curve:
        wanted = list(dict.fromkeys([i.target_id for i in items] + [i.foil_id for i in items]))
    elif spec.label_dependent:
        wanted = list(dict.fromkeys(i.target_id for i in items))
    else:
        wanted = None
    results = explain(model, tokenizer, texts, method=method, target=wanted, layer=layer,
                            batch_size=len(texts), **options)
    out: dict[str, list[tuple]] = {name: [] for name in curve_names(method)}
    for item, explanation in zip(items, results):
        if spec.foil_curve:
            target_curve, foil_curve = curve_names(method)
            out[target_curve].append((explanation, explanation.scores[wanted.index(item.target_id)]))
            out[foil_curve].append((explanation, explanation.scores[wanted.index(item.foil_id)]))
        else:
            row = 0 if wanted is None else wanted.index(item.target_id)
            out[method].append((explanation, explanation.scores[row]))
    return out


def evaluate_blimp(model, tokenizer, paradigms: Sequence[str] = ev.DEFAULT_PARADIGMS,
                   methods: Sequence[str] | None = None, *, data=None, split: str = "all",
                   limit: int | None = None, seed: int = 0, batch_size: int = 16, evidence: str = "phrase",
                   special_tokens: str = "include", progress: bool = True) -> BlimpReport:
    """Run the evidence-alignment experiment (:class:`~normx.evaluation.blimp.report.BlimpReport`).

    ``split``: ``"all"`` covered pairs, or the seeded ``"train"`` / held-out ``"dev"`` part of each paradigm
    (:func:`split_pairs`; a model fine-tuned on BLiMP, like the ``minilm-blimp`` preset, is evaluated on ``"dev"``).
    ``limit``: at most this many of those pairs per paradigm, a sample drawn with ``seed`` (kept in file order).
    ``evidence``: which tokens are the evidence, :data:`~normx.data.blimp.EVIDENCE` ("phrase": the
    authors' definitions, "word": every token of the evidence word, "first": its first token).
    ``special_tokens``: "include" ranks [CLS] / [SEP] / <s> with the words (the paper's code), "exclude" does not.
    """
    from tqdm.auto import tqdm

    from normx.models import get_adapter, unwrap_model

    base = unwrap_model(model)
    adapter = get_adapter(model)
    if adapter.kind not in SETTINGS:
        raise InvalidInputError(
            f"BLiMP alignment needs a language-model head (masked or causal); {type(base).__name__} has a "
            f"{adapter.kind} head. Use e.g. a ...ForMaskedLM or ...ForCausalLM model")
    if adapter.kind is HeadKind.MASKED_LM and tokenizer.mask_token is None:
        raise InvalidInputError(f"{type(base).__name__} is a masked LM but its tokenizer has no mask token")
    positive_int(limit, "limit", none=True)
    positive_int(batch_size, "batch_size")
    if split not in SPLITS:
        raise InvalidInputError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    if evidence not in ev.EVIDENCE:
        raise InvalidInputError(f"unknown evidence setting {evidence!r}; use one of {', '.join(ev.EVIDENCE)}")
    if special_tokens not in SPECIAL_TOKENS:
        raise InvalidInputError(f"unknown special_tokens setting {special_tokens!r}; use one of "
                                f"{', '.join(SPECIAL_TOKENS)}")
    chosen = [ev.get_paradigm(p) for p in dict.fromkeys(paradigms)]
    if not chosen:
        raise InvalidInputError(f"no paradigms given; choose from {', '.join(ev.PARADIGMS)}")
    methods = resolve_methods(methods)
    mask_token = tokenizer.mask_token if adapter.kind is HeadKind.MASKED_LM else None

    status = {m: {"status": "ok", "layered": get_method(m).layered} for m in methods}
    values: dict[str, dict[str, dict[str, list[np.ndarray]]]] = {}  # paradigm -> curve -> metric -> per-pair rows
    coverage, timings = {}, {}
    layers = list(range(adapter.num_layers(base) + 1))
    for paradigm in chosen:
        started = time.perf_counter()
        extraction = ev.extract(ev.load_rows(paradigm, data), paradigm)
        sampled = split_pairs(extraction.pairs, split)
        if limit is not None and limit < len(sampled):
            keep = sorted(random.Random(f"{seed}:{paradigm.key}").sample(range(len(sampled)), limit))
            sampled = [sampled[i] for i in keep]
        items, skipped, examples = prepare(sampled, tokenizer, adapter.kind, evidence)
        bar = tqdm(total=math.ceil(len(items) / batch_size) * len(methods), desc=f"blimp {paradigm.key}",
                   disable=not progress)
        with bar:
            per_curve, missing = _score(model, tokenizer, items, methods, status, values,
                                        (mask_token, evidence, special_tokens), batch_size, seed, bar)
        if missing:
            skipped["the evidence token is not in the model's input"] = missing
        coverage[paradigm.key] = {
            "uid": paradigm.uid, "evidence": paradigm.evidence, "pairs": extraction.total,
            "covered_by_rules": len(extraction.pairs), "not_covered": dict(extraction.skipped),
            "not_covered_examples": extraction.examples, "split": split, "sampled": len(sampled),
            "evaluated": len(items) - missing,
            "skipped_for_model": dict(skipped), "skipped_examples": examples}
        values[paradigm.key] = per_curve
        timings[paradigm.key] = round(time.perf_counter() - started, 2)

    curves = _aggregate(values, layers)
    return BlimpReport(
        model=type(base).__name__, setting=SETTINGS[adapter.kind], layers=layers,
        paradigms=[p.key for p in chosen], methods=status, coverage=coverage, curves=curves,
        summary=_summarise(curves, layers),
        settings={"split": split, "limit": limit, "seed": seed, "batch_size": batch_size, "evidence": evidence,
                  "special_tokens": special_tokens, "seconds": timings,
                  "dtype": str(next(base.parameters()).dtype).replace("torch.", ""),
                  "device": str(next(base.parameters()).device)})


def _score(model, tokenizer, items: list[Item], methods: list[str], status: dict, values: dict,
           locate: tuple, batch_size: int, seed: int, bar) -> tuple[dict, int]:
    """DP and AP rows (curve -> metric -> one array per pair) of one paradigm's items, and how many items had no
    evidence token in the model's input. A method that raises a normx error becomes "not applicable" and its
    curves are dropped everywhere (``values`` holds the paradigms done so far). ``locate``: the mask token and the
    evidence and special-token settings, as :func:`positions` takes them."""
    per_curve: dict[str, dict[str, list[np.ndarray]]] = {}
    found: dict[int, tuple[list[int], list[int]] | None] = {}
    batches = [items[i:i + batch_size] for i in range(0, len(items), batch_size)]
    for method in methods:
        normalise = "sum" if get_method(method).shares else "softmax"  # DP as the authors' code normalises
        reason = get_method(method).unsupported(model) if status[method]["status"] == "ok" else None
        if reason is not None:  # what a method supports is on the method
            status[method] = {"status": "not applicable", "reason": reason, "layered": None}
            for stored in [per_curve, *values.values()]:
                for name in curve_names(method):
                    stored.pop(name, None)
        for batch_index, batch in enumerate(batches):
            if status[method]["status"] != "ok":
                bar.update(len(batches) - batch_index)
                break
            try:
                curves = _explain_batch(model, tokenizer, method, batch, seed)
            except (NormxError, NotImplementedError) as exc:
                status[method] = {"status": "not applicable", "reason": str(exc), "layered": None}
                for stored in [per_curve, *values.values()]:
                    for name in curve_names(method):
                        stored.pop(name, None)
                bar.update(len(batches) - batch_index)
                break
            for name, rows in curves.items():
                for offset, (explanation, scores) in enumerate(rows):
                    index = batch_index * batch_size + offset
                    if index not in found:
                        found[index] = positions(explanation, batch[offset], *locate)
                    if found[index] is None:
                        continue
                    evidence_at, exclude = found[index]
                    metric_rows = per_curve.setdefault(name, {metric: [] for metric in METRICS})
                    metric_rows["dp"].append(dot_product(scores, evidence_at, exclude, normalise))
                    metric_rows["dp_softmax"].append(dot_product(scores, evidence_at, exclude))
                    metric_rows["ap"].append(average_precision(scores, evidence_at, exclude))
            bar.update(1)
    return per_curve, sum(1 for v in found.values() if v is None)


def _as_layers(rows: list[np.ndarray], layers: list[int]) -> np.ndarray:
    """[pairs, layers]; a method without per-layer scores has one column, repeated for every layer."""
    matrix = np.asarray([np.atleast_1d(r) for r in rows], dtype=np.float64)
    if matrix.shape[1] == 1 and len(layers) > 1:
        matrix = np.repeat(matrix, len(layers), axis=1)
    return matrix


def _aggregate(values: dict, layers: list[int]) -> dict:
    """metric -> group (paradigm or "all") -> curve -> {"mean", "sem", "n"} over the pairs, per layer."""
    out = {metric: {} for metric in METRICS}
    pooled: dict[str, dict[str, list[np.ndarray]]] = {}
    for paradigm, per_curve in values.items():
        for name, per_metric in per_curve.items():
            for metric, rows in per_metric.items():
                if not rows:
                    continue
                matrix = _as_layers(rows, layers)
                out[metric].setdefault(paradigm, {})[name] = _stats(matrix)
                pooled.setdefault(metric, {}).setdefault(name, []).append(matrix)
    if len(values) > 1:
        for metric, per_curve in pooled.items():
            out[metric]["all"] = {name: _stats(np.concatenate(mats)) for name, mats in per_curve.items()}
    return out


def _stats(matrix: np.ndarray) -> dict:
    n = matrix.shape[0]
    mean = matrix.mean(axis=0)
    sem = matrix.std(axis=0, ddof=1) / math.sqrt(n) if n > 1 else np.full_like(mean, np.nan)
    return {"mean": [float(v) for v in mean], "sem": [None if math.isnan(v) else float(v) for v in sem], "n": n}


def _summarise(curves: dict, layers: list[int]) -> list[dict]:
    rows = []
    for metric, groups in curves.items():
        for group, per_curve in groups.items():
            for name, stats in per_curve.items():
                mean = np.asarray(stats["mean"])
                best = int(mean.argmax())
                rows.append({"paradigm": group, "curve": name, "metric": metric, "n": stats["n"],
                             "mean_over_layers": float(mean.mean()), "best_layer": layers[best],
                             "best": float(mean[best]), "first_layer": float(mean[0]), "last_layer": float(mean[-1])})
    return rows


# ---- outputs -----------------------------------------------------------------------------------------------------


# ---- command line ------------------------------------------------------------------------------------------------


