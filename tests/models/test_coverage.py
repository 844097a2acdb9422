"""Coverage measured against transformers itself (bench/architecture_coverage.py; docs/supported.md): a
representative sample in the default run, every architecture with ``-m slow``. A verified model's NormXLogit must
equal the reference read from the model's own outputs; a refused one must say why; the verdicts must be the ones
``normx supported`` prints (normx/models/coverage.json)."""

from __future__ import annotations

import json
from pathlib import Path

import architectures
import pytest

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
    row = stored()[kind, model_type, name]
    result, detail = architectures.verdict(kind, model_type, name)
    assert result == row["verdict"], f"{name}: {result} ({detail}), the table says {row['verdict']} ({row['detail']})"
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


def test_the_table_covers_every_architecture_and_most_are_verified():
    names = set(architectures.architectures())
    rows = stored()
    assert set(rows) == names, "normx/models/coverage.json is stale: python bench/architecture_coverage.py"
    built = [r for r in rows.values() if r["verdict"] != architectures.FAILS]
    share = sum(r["verdict"] == architectures.VERIFIED for r in built) / len(built)
    assert not [r["class"] for r in built if r["verdict"] == architectures.WRONG], "wrong scores"
    assert share >= 0.90, f"only {share:.0%} of the architectures that build are verified"
