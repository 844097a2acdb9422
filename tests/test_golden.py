"""Behaviour kept through refactoring: every method's output on every tiny family and on the default preset equals
what was stored before (scores to 1e-6).

The stored outputs (``tests/golden/*.json``) were made by this file at the commit that added it, before the
"one home for each concern" redesign; a refactoring must leave them as they are. A deliberate change of results
regenerates them with ``NORMX_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py`` and says why in its commit.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest
import tiny
from demo_support import preset_ready

import normx

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("NORMX_UPDATE_GOLDEN") == "1"
ATOL = 1e-6
OPTIONS = {"integrated_gradients": {"n_steps": 4}, "value_zeroing": {"internal_batch_size": 16}}


def outputs(model, tokenizer, texts: list[str]) -> dict:
    """{method: [result dicts] | {"error": class name}} for every registered method, every layer where it has
    layers, the predicted label."""
    out = {}
    for method in normx.list_methods():
        layered = normx.methods.get_method(method).layered
        try:
            results = normx.explain(model, tokenizer, texts, method=method, layer="all" if layered else None,
                                    **OPTIONS.get(method, {}))
        except normx.NormxError as exc:
            out[method] = {"error": type(exc).__name__}
            continue
        out[method] = [{"tokens": r.tokens, "labels": r.labels, "layers": r.layers, "prediction": r.prediction,
                        "probabilities": r.probabilities, "scores": np.asarray(r.scores, dtype=np.float64).tolist(),
                        "diagnostics": r.diagnostics}
                       for r in results]
    return out


def compare(got, want, where: str = "") -> list[str]:
    """Paths where ``got`` differs from ``want`` (floats: by more than ATOL, relative for large values)."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return [f"{where}: keys {sorted(got) if isinstance(got, dict) else got} != {sorted(want)}"]
        return [d for key in want for d in compare(got[key], want[key], f"{where}.{key}")]
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [f"{where}: {got!r:.80} != {want!r:.80}"]
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in compare(g, w, f"{where}[{i}]")]
    if isinstance(want, float) and isinstance(got, (int, float)):
        return [] if abs(got - want) <= ATOL * max(1.0, abs(want)) else [f"{where}: {got} != {want}"]
    return [] if got == want else [f"{where}: {got!r} != {want!r}"]


def check(name: str, got: dict) -> None:
    file = GOLDEN / f"{name}.json.gz"
    got = json.loads(json.dumps(got))  # the same types as read back
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        with open(file, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as handle:
            handle.write(json.dumps(got).encode())  # mtime 0: the same outputs give the same bytes
        return
    if not file.exists():
        pytest.fail(f"no stored outputs at {file}; make them with NORMX_UPDATE_GOLDEN=1")
    with gzip.open(file, "rt", encoding="utf-8") as handle:
        want = json.load(handle)
    missing = sorted(set(want) - set(got))
    assert not missing, f"methods stored in {file.name} are gone: {missing}"
    differences = compare({method: got[method] for method in want}, want)  # methods added later: not compared
    assert not differences, f"{len(differences)} differences from {file.name}, e.g. " + "; ".join(differences[:5])


@pytest.mark.parametrize("case_id", [case.id for case in tiny.CASES])
def test_tiny_families_unchanged(case_id):
    model, tokenizer = tiny.build(case_id)
    check(case_id, outputs(model, tokenizer, tiny.texts_for(tiny.CASE_BY_ID[case_id], tokenizer)))


@pytest.mark.skipif(not preset_ready("minilm-sst2"), reason="minilm-sst2's adapter is not trained")
def test_default_preset_unchanged():
    model, tokenizer = normx.load_model("minilm-sst2")
    check("minilm-sst2", outputs(model, tokenizer, ["a gripping, beautifully acted film",
                                                    "the plot was predictable and the jokes fell flat"]))
