"""Coverage measured against transformers itself (studies/coverage/architectures.py; docs/supported.md): a
representative sample in the default run, every architecture with ``-m slow``. A verified model's NormXLogit must
equal the reference read from the model's own outputs; a refused one must say why; the verdicts must be the ones
``normx supported`` prints (normx/models/coverage.json)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import architectures
import pytest

from normx.cli.main import main
from normx.models import coverage
from normx.models.coverage import HEADS, NOT_MEASURED, listed_architectures, not_measured

STORED = Path(__file__).resolve().parents[2] / "normx" / "models" / "coverage.json"
SAMPLE = ["GemmaForCausalLM", "Gemma2ForCausalLM", "Phi3ForCausalLM", "Olmo2ForCausalLM", "GPTNeoXForCausalLM",
          "BloomForCausalLM", "OPTForCausalLM", "CohereForCausalLM", "GraniteForCausalLM", "ApertusForCausalLM",
          "ModernBertForMaskedLM", "CamembertForMaskedLM", "AlbertForMaskedLM", "Gemma2ForSequenceClassification",
          "GPTNeoXForSequenceClassification", "ModernBertForSequenceClassification", "BigBirdForSequenceClassification",
          "BartForConditionalGeneration", "MambaForCausalLM", "XLMForSequenceClassification",
          "EuroBertForSequenceClassification", "LukeForMaskedLM"]


def stored() -> dict[tuple[str, str, str], dict]:
    """(head kind, model type, class name) -> its row (a class can be listed under two heads or model types)."""
    return {(row["head"], row["model_type"], row["class"]): row
            for row in json.loads(STORED.read_text())["architectures"]}


def _check(kind: str, model_type: str, name: str) -> None:
    """The architecture's verdict now; where the table has one (it was measured), the same. An architecture the
    installed transformers added after the table was measured is measured on the spot: never wrong scores."""
    row = stored().get((kind, model_type, name))
    result, detail = architectures.verdict(kind, model_type, name)
    assert result != architectures.WRONG, f"{name}: {detail}"
    if row is not None:
        assert result == row["verdict"], \
            f"{name}: {result} ({detail}), the table says {row['verdict']} ({row['detail']})"
    if result == architectures.VERIFIED:
        off = float(detail.rsplit(" by ", 1)[1])
        assert off <= architectures.TOLERANCE, f"{name}: NormXLogit is off the model's own outputs by {off:.3g}"
    elif result == architectures.REFUSED:
        assert len(detail) > 20, f"{name} is refused without a reason"


@pytest.mark.parametrize("name", SAMPLE)
def test_sample(name):
    _check(*next(entry for entry in architectures.architectures() if entry[2] == name))


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "model_type", "name"), architectures.architectures())
def test_every_architecture(kind, model_type, name):
    _check(kind, model_type, name)


def test_the_table_gives_no_wrong_scores_and_most_are_verified():
    rows = stored()
    built = [r for r in rows.values() if r["verdict"] != architectures.FAILS]
    share = sum(r["verdict"] == architectures.VERIFIED for r in built) / len(built)
    assert not [r["class"] for r in built if r["verdict"] == architectures.WRONG], "wrong scores"
    assert share >= 0.90, f"only {share:.0%} of the architectures that build are verified"
    assert {r["head"] for r in rows.values()} == set(HEADS)


def test_architectures_newer_than_the_table_are_reported_not_yet_measured(monkeypatch, capsys):
    """A fresh install may resolve a transformers release with architectures the table has never seen: they are
    listed as not yet measured (and checked on first use), never a failure of the test run."""
    table = json.loads(STORED.read_text())
    first = table["architectures"][0]
    fewer = {**table, "architectures": table["architectures"][1:]}
    assert (first["head"], first["model_type"], first["class"]) in set(not_measured(fewer))
    assert not_measured(table) == [e for e in listed_architectures()
                                   if (e[0], e[1], e[2]) not in {(r["head"], r["model_type"], r["class"])
                                                                  for r in table["architectures"]}]
    monkeypatch.setattr(coverage, "coverage", lambda: fewer)
    assert main(["supported", "--verdict", NOT_MEASURED]) == 0
    out = capsys.readouterr().out
    assert first["class"] in out and "has not measured" in out


def test_supported_lists_each_class_once_per_head(capsys):
    assert main(["supported"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()][:-1]
    keys = [(line[:48].strip(), line[49:73].strip(), line[74:93].strip()) for line in lines]
    assert len(keys) == len(set(keys)), "a class is listed twice with one verdict"
    assert sum(key[:2] == ("LlamaForCausalLM", "causal_lm") for key in keys) == 1


# ---- one source of the counts: README, docs/supported.md and `normx supported` -------------------------------------

ROOT = STORED.parents[2]


def test_docs_supported_is_generated_from_the_table():
    """docs/supported.md is exactly what ``studies/coverage/architectures.py --docs`` writes from coverage.json."""
    assert (ROOT / "docs" / "supported.md").read_text() == coverage.markdown(), \
        "docs/supported.md is stale: python -m studies.coverage.architectures --docs"


def test_readme_quotes_the_computed_counts():
    n = coverage.counts()
    text = " ".join((ROOT / "README.md").read_text().split())
    found = re.search(r"Of the (\d+) architectures \(class and head\) transformers [\d.]+ lists .*?\*\*(\d+) are "
                      r"verified \((\d+) %\)\*\*.*? and the (\d+) others are refused", text)
    assert found, "the README's sentence on the architecture counts is gone"
    assert [int(g) for g in found.groups()] == [n["built"], n["verified"], round(100 * n["share"]), n["refused"]]
    assert n["built"] == n["verified"] + n["refused"] + n["wrong scores"]


def test_one_row_and_one_verdict_per_class_and_head():
    rows = coverage.architecture_rows()
    keys = [(row["class"], row["head"]) for row in rows]
    assert len(keys) == len(set(keys))
    llama4 = next(row for row in rows if row["class"] == "Llama4ForCausalLM")  # two model types, two outcomes
    assert llama4["verdict"] == coverage.REFUSED and sorted(llama4["model_types"]) == ["llama4", "llama4_text"]
    assert "llama4: transformers fails" in llama4["detail"] and "llama4_text: refused" in llama4["detail"]
    heads = coverage.counts(rows)["heads"]
    assert sum(sum(c.values()) for c in heads.values()) == len(rows)


def test_details_are_whole_and_never_empty():
    for row in coverage.architecture_rows():
        detail = row["detail"]
        assert detail.strip() and not detail.rstrip().endswith(":"), f"{row['class']}: {detail!r}"
        assert len(detail.split(": ", 1)[-1].strip()) > 3, f"{row['class']}: {detail!r}"
    assert coverage.shortened("word " * 100, 23) == "word word word word …"
    assert coverage.shortened("a\n   b\n") == "a b"
    assert coverage.failure_detail(ImportError("")) == "ImportError: (no message)"
    try:
        try:
            raise ValueError("the real reason")
        except ValueError as inner:
            raise RuntimeError("Class validation error:\n    ValueError: the real reason") from inner
    except RuntimeError as exc:
        assert coverage.failure_detail(exc) == "RuntimeError: Class validation error: ValueError: the real reason"


def test_supported_prints_the_computed_counts(capsys):
    assert main(["supported"]) == 0
    out = capsys.readouterr().out
    assert coverage.summary_sentence() in " ".join(out.split())
    n = coverage.counts()
    assert f"{n['verified']} of {n['built']} architectures that build and run are verified" in out
