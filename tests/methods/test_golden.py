"""Behaviour kept through refactoring: every registered method's output on every tiny family and on the default
preset equals what was stored (``tests/methods/golden/<case>/<method>.json.gz``), within a tolerance relative to
each output's scale that holds across CPUs (``tests/golden.py`` says how it was chosen).

A new method or case adds files and rewrites none: ``NORMX_UPDATE_GOLDEN=missing python -m pytest
tests/methods/test_golden.py`` writes the files that do not exist yet, and ``python -m studies.golden.spread --out
tests/methods/golden/spread.json --methods NAME`` measures their spread (a stored file without one fails). A
deliberate change of a method's results rewrites that method's files, ``NORMX_UPDATE_GOLDEN=decompx,alti ...``, and
its commit says why.

With ``NORMX_GOLDEN_RECORD=FILE`` the comparison is not asserted: each case appends its deviation from the stored
file (and the kernel path it ran on) to FILE as one JSON line, which is how ``python -m studies.golden.spread``
measures.
"""

from __future__ import annotations

import copy
import json
import math
import os

import golden
import pytest
import torch
from demo_support import preset_ready

import normx

UPDATE = os.environ.get("NORMX_UPDATE_GOLDEN", "")
RECORD = os.environ.get("NORMX_GOLDEN_RECORD", "")


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
    if RECORD:
        want = golden.load(case, method)
        _record(case, method, *golden.deviation(got, want), refused=isinstance(want, dict))
        return
    rtol = golden.tolerance(case, method)
    if rtol is None:
        pytest.fail(f"{file} has no measured spread in {golden.SPREAD.name}: python -m studies.golden.spread --out "
                    f"{golden.SPREAD} --methods {method} measures it")
    problems = golden.differences(got, golden.load(case, method), rtol)
    assert not problems, f"{method} on {case} differs from {file.name}: " + "; ".join(problems[:5])


def _record(case: str, method: str, worst: float, problems: list[str], refused: bool) -> None:
    line = {"case": case, "method": method, "deviation": worst, "problems": problems, "refused": refused,
            "capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}
    with open(RECORD, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")


def test_every_stored_file_has_a_measured_spread():
    """Each stored file has its spread measured (so a method cannot land with files measured on no machine), no
    entry outlives its file, and every tolerance stays below ``CEILING`` (a larger spread is an unstable
    computation to find, as AttnLRP's conservation was: docs/golden.md)."""
    stored = {(file.parent.name, file.name.removesuffix(".json.gz")) for file in golden.ROOT.glob("*/*.json.gz")}
    measured = {(case, method) for case, methods in golden.spreads().items() for method in methods}
    assert not sorted(stored - measured)[:10], f"stored outputs without a measured spread in {golden.SPREAD.name}"
    assert not sorted(measured - stored)[:10], f"spreads in {golden.SPREAD.name} of outputs no longer stored"
    wide = {(case, method): golden.tolerance(case, method) for case, method in stored
            if golden.tolerance(case, method) > golden.CEILING}
    assert not wide, f"spreads above {golden.CEILING / golden.MARGIN:g} of the scale: {wide}"


def test_every_stored_method_is_still_registered():
    stored = {file.name.removesuffix(".json.gz") for file in golden.ROOT.glob("*/*.json.gz")}
    gone = sorted(stored - set(normx.list_methods()))
    assert not gone, f"stored outputs of methods that are no longer registered: {gone}"
    assert {file.name for file in golden.ROOT.iterdir() if file.is_dir()} == set(golden.cases())


def _stored(case: str = "BertForSequenceClassification", method: str = "normxlogit"):
    return golden.load(case, method)


@pytest.mark.parametrize("factor", [0.9, 1.1])
def test_the_tolerance_is_the_measured_spread_with_its_margin(factor):
    """Noise just under a case's tolerance (MARGIN x the spread measured between kernel paths) passes, just over
    it fails."""
    case, method = "BertForSequenceClassification", "normxlogit"
    rtol = golden.tolerance(case, method)
    want = _stored(case, method)
    got = copy.deepcopy(want)
    noise = factor * rtol
    for result in got:
        size = golden.scale(result)
        result["scores"] = [[[v + noise * size * (-1) ** k for k, v in enumerate(row)] for row in layers]
                            for layers in result["scores"]]
        result["probabilities"] = {k: v + noise for k, v in result["probabilities"].items()}
    assert bool(golden.differences(got, want, rtol)) == (factor > 1)


def _implied_logit(result: dict) -> float:
    return result["diagnostics"]["relevance_sum"][0] / result["diagnostics"]["conservation"][0]


def test_a_ratio_diagnostic_is_compared_as_the_logit_it_implies():
    """AttnLRP's conservation on the tiny Qwen2 classifier's third text divides by a logit of 0.005 (among logits
    of about 3): the logit's last-digit noise moves the ratio by 1e-3 of the scale (found on an Intel Xeon), which
    passes; a change of 0.1 % of the scale in the logit it implies fails. The implied logit is the model's own."""
    case = "Qwen2ForSequenceClassification"
    want = golden.load(case, "attnlrp")
    rtol = golden.tolerance(case, "attnlrp")
    model, tokenizer, texts = golden.build(case)
    for text, result in zip(texts, want):
        with torch.no_grad():
            logits = model(**tokenizer(text, return_tensors="pt")).logits[0]
        target = model.config.label2id[result["prediction"]]
        assert math.isclose(_implied_logit(result), float(logits[target]), rel_tol=0, abs_tol=1e-5)
    third = want[2]
    size = golden.scale(third)
    assert abs(_implied_logit(third)) < 0.01 < size
    noisy, changed = copy.deepcopy(want), copy.deepcopy(want)
    total = third["diagnostics"]["relevance_sum"][0]
    noisy[2]["diagnostics"]["conservation"][0] = total / (_implied_logit(third) + 1e-6)  # the logit's noise
    assert abs(noisy[2]["diagnostics"]["conservation"][0] - third["diagnostics"]["conservation"][0]) > 1e-3 * size
    assert golden.differences(noisy, want, rtol) == []
    changed[2]["diagnostics"]["conservation"][0] = total / (_implied_logit(third) + 1e-3 * size)
    assert golden.differences(changed, want, rtol)


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
        assert biggest * 1e-3 > golden.CEILING * size  # the largest score moves by 0.1 % of the scale
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
    assert golden.differences(got, want, golden.tolerance(case, method)), f"{change} went unnoticed"


def test_a_method_whose_arithmetic_changed_slightly_fails(monkeypatch):
    """A real change of a method: LogAt read from the head with its last layer's output scaled by 1.001."""
    from normx.core.forward import Pass

    real = Pass.head

    def head(self, hidden, columns=None):
        return real(self, hidden, columns) * 1.001

    monkeypatch.setattr(Pass, "head", head)
    model, tokenizer, texts = golden.build("LlamaForSequenceClassification")
    got = golden.output(model, tokenizer, texts, "logat")
    assert golden.differences(got, golden.load("LlamaForSequenceClassification", "logat"),
                              golden.tolerance("LlamaForSequenceClassification", "logat"))
