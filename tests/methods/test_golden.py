"""Behaviour kept through refactoring: every registered method's output on every tiny family and on the default
preset equals what was stored (``tests/methods/golden/<case>/<method>.json.gz``), within a tolerance relative to
each output's scale that holds across CPUs (``tests/golden.py`` says how it was chosen).

A new method or case adds files and rewrites none: ``NORMX_UPDATE_GOLDEN=missing python -m pytest
tests/methods/test_golden.py`` writes the files that do not exist yet. A deliberate change of a method's results
rewrites that method's files, ``NORMX_UPDATE_GOLDEN=decompx,alti ...``, and its commit says why.
"""

from __future__ import annotations

import copy
import os

import golden
import pytest
from demo_support import preset_ready

import normx

UPDATE = os.environ.get("NORMX_UPDATE_GOLDEN", "")


def _ready(case: str) -> bool:
    return case != golden.PRESET or preset_ready(golden.PRESET)


@pytest.mark.parametrize("method", normx.list_methods())
@pytest.mark.parametrize("case", golden.cases())
def test_outputs_unchanged(case, method):
    if not _ready(case):
        pytest.skip(f"{case}'s adapter is not trained")
    model, tokenizer, texts = golden.build(case)
    got = golden.output(model, tokenizer, texts, method)
    file = golden.path(case, method)
    if (UPDATE == "missing" and not file.exists()) or method in UPDATE.split(","):
        golden.save(case, method, got)
        return
    if not file.exists():
        pytest.fail(f"no stored outputs at {file}; a new method or case: NORMX_UPDATE_GOLDEN=missing writes them")
    problems = golden.differences(got, golden.load(case, method))
    assert not problems, f"{method} on {case} differs from {file.name}: " + "; ".join(problems[:5])


def test_every_stored_method_is_still_registered():
    stored = {file.name.removesuffix(".json.gz") for file in golden.ROOT.glob("*/*.json.gz")}
    gone = sorted(stored - set(normx.list_methods()))
    assert not gone, f"stored outputs of methods that are no longer registered: {gone}"
    assert {file.name for file in golden.ROOT.iterdir()} == set(golden.cases())


def _stored(case: str = "BertForSequenceClassification", method: str = "normxlogit"):
    return golden.load(case, method)


def test_the_spread_between_cpus_passes():
    """Noise of the size measured between CPUs (bench/golden_spread.py: at most 7e-6 of the scale) passes."""
    want = _stored()
    got = copy.deepcopy(want)
    for result in got:
        size = golden.scale(result)
        result["scores"] = [[[v + 1e-5 * size * (-1) ** k for k, v in enumerate(row)] for row in layers]
                            for layers in result["scores"]]
        result["probabilities"] = {k: v + 1e-5 for k, v in result["probabilities"].items()}
    assert golden.differences(got, want) == []


@pytest.mark.parametrize("change", ["0.1 % on every score", "0.1 % of the scale on one token", "a probability",
                                    "a diagnostic", "the prediction", "a token"])
def test_a_small_real_change_fails(change):
    case, method = ("BertForSequenceClassification", "decompx") if change == "a diagnostic" else \
        ("BertForSequenceClassification", "normxlogit")
    want = _stored(case, method)
    got = copy.deepcopy(want)
    first = got[0]
    size = golden.scale(first)
    if change == "0.1 % on every score":
        first["scores"] = [[[v * 1.001 for v in row] for row in layers] for layers in first["scores"]]
        biggest = max(abs(v) for layers in want[0]["scores"] for row in layers for v in row)
        assert biggest * 1e-3 > golden.RTOL * size  # the largest score moves by 0.1 % of the scale
    elif change == "0.1 % of the scale on one token":
        first["scores"][0][-1][2] += 1e-3 * size
    elif change == "a probability":
        label = next(iter(first["probabilities"]))
        first["probabilities"][label] += 2e-4
    elif change == "a diagnostic":
        first["diagnostics"]["decomposition_error"][0] += 1e-3 * size
    elif change == "the prediction":
        first["prediction"] = next(label for label in first["probabilities"] if label != first["prediction"])
    else:
        first["tokens"][1] = "[UNK]"
    assert golden.differences(got, want), f"{change} went unnoticed"


def test_a_method_whose_arithmetic_changed_slightly_fails(monkeypatch):
    """A real change of a method: LogAt read from the head with its last layer's output scaled by 1.001."""
    from normx.core.forward import Pass

    real = Pass.head

    def head(self, hidden, columns=None):
        return real(self, hidden, columns) * 1.001

    monkeypatch.setattr(Pass, "head", head)
    model, tokenizer, texts = golden.build("LlamaForSequenceClassification")
    got = golden.output(model, tokenizer, texts, "logat")
    assert golden.differences(got, golden.load("LlamaForSequenceClassification", "logat"))
