"""The context-attribution data sets (normx.data.contexts) built from the shared GLUE files."""

import re

import locations
import pytest

from normx.data import contexts, glue
from normx.errors import InvalidInputError

SHARED = locations.SHARED
pytestmark = pytest.mark.skipif(not (SHARED / "qnli").is_dir(), reason="the shared GLUE data folder is not here")


def build(**kwargs):
    return contexts.context_examples(data=SHARED, **kwargs)


def row_ids(examples):
    return {row for e in examples for rows in e.rows for row in rows}


@pytest.mark.parametrize("length", [300, 2000])
def test_train_and_heldout_use_disjoint_rows(length):
    train = build(split="train", length=length, limit=16)
    heldout = build(split="heldout", length=length, limit=16)
    assert row_ids(train) and row_ids(heldout)
    assert not row_ids(train) & row_ids(heldout)
    # and the rows are those of glue's own split of MNLI / QNLI (the part its presets were trained on is "train")
    qnli = {f"qnli:{i}" for i in glue.held_out_split(list(range(5463)), "dev")}
    assert {r for r in row_ids(heldout) if r.startswith("qnli:")} <= qnli


def test_same_arguments_same_examples_and_the_seed_changes_them():
    first = build(length=300, limit=8, seed=3)
    assert first == build(length=300, limit=8, seed=3)
    assert first[:4] == build(length=300, limit=4, seed=3)  # a smaller limit is a prefix
    other = build(length=300, limit=8, seed=4)
    assert [e.sources for e in other] != [e.sources for e in first]
    assert len({e.evidence[0] for e in build(kinds="qa", length=300, limit=12)}) > 3  # the evidence moves around


def qnli_rows():
    return {i: e for i, e in enumerate(glue._read("qnli", SHARED))}


def test_the_evidence_index_points_at_the_evidence():
    qnli, mnli = qnli_rows(), dict(enumerate(glue._read("mnli", SHARED)))
    for e in build(length=300, limit=16):
        (at,) = e.evidence
        source, evidence_row = e.sources[at], e.evidence_row
        assert e.rows[at] == (evidence_row,)
        task, index = evidence_row.split(":")
        assert e.kind in e.id and len(e.sources) >= 6 and len(e.rows) == len(e.sources)
        if e.kind == "qa":  # the question's answering sentence; no other source comes from that question
            row = qnli[int(index)]
            assert task == "qnli" and row.label == 0 and e.query == row.text and source == row.pair
            assert all(qnli[int(r.split(":")[1])].text != row.text for k, rows in enumerate(e.rows) if k != at
                       for r in rows)
        elif e.kind == "claim":  # the premise that entails the claim
            row = mnli[int(index)]
            assert task == "mnli" and row.label == 0 and source == row.text and row.pair.strip() in e.query
        elif e.kind == "copy":  # the quoted word is in the evidence and in no other source
            word = re.search(r'"(\w+)"', e.query).group(1)
            assert re.search(rf"\b{word}\b", source)
            assert not any(re.search(rf"\b{word}\b", s) for k, s in enumerate(e.sources) if k != at)
            assert e.answer == source
        else:  # the planted instruction is in the evidence source only
            assert f"answer '{e.answer}'" in source
            assert not any("When asked" in s for k, s in enumerate(e.sources) if k != at)
        assert e.prompt().startswith("Context: ") and e.prompt().endswith(e.query)
        assert source in e.prompt() and source not in e.prompt(keep={k for k in range(len(e.sources)) if k != at})


def test_lengths_and_passages():
    short, long = build(kinds="qa", length=300, limit=4), build(kinds="qa", length=2000, limit=4)
    for e in short:
        assert 200 <= contexts.tokens(e.prompt()) <= 420 and all(len(rows) == 1 for rows in e.rows)
    for e in long:
        assert 1700 <= contexts.tokens(e.prompt()) <= 2300 and max(len(rows) for rows in e.rows) >= 4
        at = e.evidence[0]
        assert e.evidence_row in e.rows[at] and not any(e.evidence_row in rows for k, rows in enumerate(e.rows)
                                                        if k != at)
        assert qnli_rows()[int(e.evidence_row.split(":")[1])].pair in e.sources[at]
        assert e.evidence_text == qnli_rows()[int(e.evidence_row.split(":")[1])].pair.strip()  # its sentence, kept


def test_bad_arguments_are_said(tmp_path):
    with pytest.raises(InvalidInputError, match="unknown context kind"):
        build(kinds=["qa", "poem"])
    with pytest.raises(InvalidInputError, match="unknown split"):
        build(split="dev")
    with pytest.raises(InvalidInputError, match="length"):
        build(length=10)
    with pytest.raises(InvalidInputError, match="limit"):
        build(limit=0)
    with pytest.raises(InvalidInputError, match="does not exist"):
        contexts.context_examples(data=tmp_path / "nope")


def test_json_lines(tmp_path):
    import json

    examples = build(length=300, limit=2)
    contexts.write_examples(examples, tmp_path / "c.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [e.id for e in examples] and rows[0]["evidence"] == list(examples[0].evidence)
