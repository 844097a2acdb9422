"""Golden outputs: what every registered method gives on every tiny family (``tiny.CASES``) and on the default preset,
stored one file per case and method (``tests/methods/golden/<case>/<method>.json.gz``), and the comparison that
decides whether an output is unchanged.

**The tolerance.** float32 kernels differ in the last digits from one CPU to another (instruction sets, thread
counts, MKL / oneDNN code paths), so an output is compared relative to its own scale: a score may differ from the
stored one by at most ``rtol`` x the largest |score| of the same text (its explanation's scale); a method's
diagnostics in logit units likewise (a ratio of two such numbers, AttnLRP's conservation = relevance_sum / the
explained logit, through the logit it implies: ``RATIOS``); probabilities by ``rtol`` (their scale is 1); a
regression prediction by ``rtol`` x its own size. Tokens, labels, layers and the predicted label must be equal.

``rtol`` is per case and method, derived from a measurement: ``python -m studies.golden.spread`` recomputes every stored
output under other kernel paths (ATen's AVX-512 / AVX2 / no-AVX kernels, MKL's and oneDNN's paths, MKL's
conditional-numerical-reproducibility mode, one or two threads) and records the largest deviation per file in
``SPREAD`` (``tests/methods/golden/spread.json``); ``rtol`` = ``MARGIN`` x that spread, at least ``FLOOR``
(:func:`tolerance`). A stored file without a measured spread fails the tests (docs/golden.md has the run).
"""

from __future__ import annotations

import functools
import gzip
import json
import math
from pathlib import Path

import numpy as np
import tiny

import normx

ROOT = Path(__file__).parent / "methods" / "golden"
SPREAD = ROOT / "spread.json"  # written by studies/golden/spread.py --out
MARGIN = 10  # rtol = MARGIN x the measured spread ...
FLOOR = 1e-5  # ... and at least FLOOR
CEILING = 1e-4  # a spread whose rtol would exceed this is an unstable computation to fix, not a tolerance to widen
# diagnostics that are a ratio: {ratio: its numerator}, the denominator being the explained logit (AttnLRP's
# conservation = relevance_sum / logit, normx/methods/decoder/lrp/method.py). Near a zero logit the ratio moves
# with the logit's last digits (Qwen2's third text: a logit of 0.005 among logits of 3, +1 ulp on every embedding
# moves its conservation by 1.1 % of the scale), so it is compared as the logit it implies: numerator / ratio.
RATIOS = {"conservation": "relevance_sum"}
OPTIONS = {"integrated_gradients": {"n_steps": 4}, "value_zeroing": {"internal_batch_size": 16}}
PRESET = "minilm-sst2"
PRESET_TEXTS = ["a gripping, beautifully acted film", "the plot was predictable and the jokes fell flat"]


def cases() -> list[str]:
    return [case.id for case in tiny.CASES] + [PRESET]


@functools.cache
def build(case: str):
    """``(model, tokenizer, texts)`` of a case (shared objects: do not modify them)."""
    if case == PRESET:
        model, tokenizer = normx.load_model(PRESET)
        return model, tokenizer, PRESET_TEXTS
    model, tokenizer = tiny.build(case)
    return model, tokenizer, tiny.texts_for(tiny.CASE_BY_ID[case], tokenizer)


def output(model, tokenizer, texts: list[str], method: str):
    """What is stored of one method on one case: a list of result dicts (every layer where it has layers, the
    predicted label), or ``{"error": class name}`` for a model the method refuses."""
    spec = normx.methods.get_method(method)
    try:
        results = normx.explain(model, tokenizer, texts, method=method, layer=spec.all_layers,
                                **OPTIONS.get(method, {}))
    except normx.NormxError as exc:
        return {"error": type(exc).__name__}
    out = [{"tokens": r.tokens, "labels": r.labels, "layers": r.layers, "prediction": r.prediction,
            "probabilities": r.probabilities, "scores": np.asarray(r.scores, dtype=np.float64).tolist(),
            "diagnostics": r.diagnostics} for r in results]
    return json.loads(json.dumps(out))  # the types read back from a file


def path(case: str, method: str) -> Path:
    return ROOT / case / f"{method}.json.gz"


def load(case: str, method: str):
    with gzip.open(path(case, method), "rt", encoding="utf-8") as handle:
        return json.load(handle)


def save(case: str, method: str, value) -> None:
    file = path(case, method)
    file.parent.mkdir(parents=True, exist_ok=True)
    with open(file, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as handle:
        handle.write(json.dumps(value).encode())  # mtime 0: the same outputs give the same bytes


def scale(result: dict) -> float:
    """The largest finite |score| of one text's result (1 where it has none above 0)."""
    values = np.abs(np.asarray(result["scores"], dtype=np.float64))
    values = values[np.isfinite(values)]
    return float(values.max()) if values.size and values.max() > 0 else 1.0


def deviation(got, want) -> tuple[float, list[str]]:
    """(the largest difference of ``got`` from ``want`` as a fraction of its scale, the exact mismatches: different
    tokens, labels, layers, predicted label, missing keys, NaN where a number was)."""
    worst, problems = 0.0, []
    if isinstance(want, dict) and "error" in want:
        return 0.0, [] if got == want else [f"{got!r:.80} != {want!r}"]
    if not isinstance(got, list) or len(got) != len(want):
        return 0.0, [f"{got!r:.80} != {want!r:.80}"]
    for i, (g, w) in enumerate(zip(got, want)):
        size = scale(w)
        for key in ("tokens", "labels", "layers"):
            if g[key] != w[key]:
                problems.append(f"[{i}].{key}: {g[key]} != {w[key]}")
        if isinstance(w["prediction"], str) or isinstance(g["prediction"], str):
            if g["prediction"] != w["prediction"]:
                problems.append(f"[{i}].prediction: {g['prediction']!r} != {w['prediction']!r}")
        else:
            worst = max(worst, _relative(g["prediction"], w["prediction"], max(abs(w["prediction"]), 1e-12)))
        for part, unit in (("scores", size), ("probabilities", 1.0), ("diagnostics", size)):
            a, b = (_numbers(_logit_units(x[part]) if part == "diagnostics" else x[part]) for x in (g, w))
            if [k for k, _ in a] != [k for k, _ in b]:
                problems.append(f"[{i}].{part}: the entries differ")
                continue
            for (key, x), (_, y) in zip(a, b):
                if isinstance(x, str) or isinstance(y, str):
                    if x != y:
                        problems.append(f"[{i}].{part}{key}: {x!r} != {y!r}")
                elif (x is None) != (y is None) or (x is not None and math.isnan(x) != math.isnan(y)):
                    problems.append(f"[{i}].{part}{key}: {x} != {y}")
                elif x is not None and not math.isnan(x):
                    worst = max(worst, _relative(x, y, unit))
    return worst, problems


def spreads() -> dict[str, dict[str, dict]]:
    """``{case: {method: {"spread": the largest deviation measured, "where": its configuration}}}`` as
    ``python -m studies.golden.spread`` recorded it in ``SPREAD`` (empty without the file)."""
    if not SPREAD.exists():
        return {}
    return json.loads(SPREAD.read_text(encoding="utf-8"))["spread"]


def tolerance(case: str, method: str) -> float | None:
    """``rtol`` of one stored file: ``MARGIN`` x its measured spread, at least ``FLOOR`` (None: never measured)."""
    entry = spreads().get(case, {}).get(method)
    return None if entry is None else max(MARGIN * entry["spread"], FLOOR)


def differences(got, want, rtol: float) -> list[str]:
    """Why ``got`` is not ``want`` within ``rtol`` of each output's scale (empty: it is)."""
    worst, problems = deviation(got, want)
    if worst > rtol:
        problems.append(f"an output differs by {worst:.3g} of its scale (allowed: {rtol:g})")
    return problems


def _logit_units(diagnostics: dict) -> dict:
    """``diagnostics`` with each ratio of ``RATIOS`` replaced by the explained logit it implies (numerator / ratio,
    element by element; a NaN ratio, AttnLRP's for a logit of exactly 0, or a zero one stays as it is)."""
    out = dict(diagnostics)
    for ratio, numerator in RATIOS.items():
        if ratio in out and numerator in out:
            out[ratio] = _implied(out[numerator], out[ratio])
    return out


def _implied(numerator, ratio):
    if isinstance(ratio, list) and isinstance(numerator, list) and len(ratio) == len(numerator):
        return [_implied(n, r) for n, r in zip(numerator, ratio)]
    if isinstance(ratio, (int, float)) and isinstance(numerator, (int, float)) and ratio and math.isfinite(ratio):
        return numerator / ratio
    return ratio


def _relative(x: float, y: float, unit: float) -> float:
    return abs(x - y) / unit


def _numbers(value, key: str = "") -> list[tuple[str, float | None]]:
    """Every number in a nested list / dict, with its path, in a fixed order (None for JSON null)."""
    if isinstance(value, dict):
        return [item for k in sorted(value) for item in _numbers(value[k], f"{key}.{k}")]
    if isinstance(value, list):
        return [item for i, v in enumerate(value) for item in _numbers(v, f"{key}[{i}]")]
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return [(key, None if value is None else float(value))]
    return [(key, value)]  # strings (none expected): compared by the key list and equality below
