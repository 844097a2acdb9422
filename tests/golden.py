"""Golden outputs: what every registered method gives on every tiny family (``tiny.CASES``) and on the default preset,
stored one file per case and method (``tests/methods/golden/<case>/<method>.json.gz``), and the comparison that
decides whether an output is unchanged.

**The tolerance.** float32 kernels differ in the last digits from one CPU to another (instruction sets, thread
counts, MKL / oneDNN code paths), so an output is compared relative to its own scale: a score may differ from the
stored one by at most ``RTOL`` x the largest |score| of the same text (its explanation's scale); a method's
diagnostics (in the same units: a logit's) likewise; probabilities by ``RTOL`` (their scale is 1); a regression
prediction by ``RTOL`` x its own size. Tokens, labels, layers and the predicted label must be equal.
``bench/golden_spread.py`` measures the spread this has to absorb: the stored outputs recomputed under other kernel
paths (AVX2 / no-AVX ATen, MKL and oneDNN paths, one or two threads) differ by at most 7.0e-6 of their scale
(docs/golden.md has the run); ``RTOL`` = 1e-4 leaves a 14x margin, and a change that moves one output by 0.1 % of
its scale still fails (``tests/methods/test_golden.py`` shows it).
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
RTOL = 1e-4
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
            a, b = _numbers(g[part]), _numbers(w[part])
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


def differences(got, want, rtol: float = RTOL) -> list[str]:
    """Why ``got`` is not ``want`` within ``rtol`` of each output's scale (empty: it is)."""
    worst, problems = deviation(got, want)
    if worst > rtol:
        problems.append(f"an output differs by {worst:.3g} of its scale (allowed: {rtol:g})")
    return problems


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
