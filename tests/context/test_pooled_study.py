"""studies/context/pooled.py: several runs' records read together, each method paired by context with the reference
only where both ran; a context in two files is an error."""

from __future__ import annotations

import json

import numpy as np
import pytest

from studies.context import pooled


def _record(name: str, **lds_cost) -> dict:
    return {"id": name, "methods": {m: {"lds": lds, "cost": cost} for m, (lds, cost) in lds_cost.items()}}


def test_pooled_pairs_by_context(tmp_path, capsys):
    first = [_record("a", ref=(0.8, 20.0), mine=(0.7, 5.0)), _record("b", ref=(0.6, 22.0), mine=(0.65, 7.0))]
    first[0]["methods"]["mine"]["passes"], first[1]["methods"]["mine"]["passes"] = 4.0, 5.0  # measured 1.25, 1.4
    first[0]["methods"]["mine"]["masks"], first[1]["methods"]["mine"]["masks"] = 10, 13
    first[1]["methods"]["mine"]["first_call"] = True  # its 7.0 holds its process's first-use work
    second = [_record("c", ref=(0.9, 25.0), mine=(0.85, 5.5)), _record("d", mine=(0.1, 4.0))]  # d: no reference
    paths = []
    for i, records in enumerate((first, second)):
        paths.append(tmp_path / f"{i}.jsonl")
        paths[-1].write_text("".join(json.dumps(r) + "\n" for r in records))
    rows = {r["method"]: r for r in pooled.pooled([*first, *second], ["mine"], "ref")}
    diffs = np.array([-0.1, 0.05, -0.05])
    assert rows["mine"]["contexts"] == 3
    assert rows["mine"]["lds"] == pytest.approx(np.mean([0.7, 0.65, 0.85]))
    assert rows["mine"]["paired"] == pytest.approx(diffs.mean())
    assert rows["mine"]["paired_se"] == pytest.approx(diffs.std(ddof=1) / np.sqrt(3))
    assert rows["mine"]["cost_median"] == 5.5 and rows["mine"]["over_6"] == 1
    assert rows["mine"]["over_6_first_calls"] == 1 and rows["ref"]["over_6_first_calls"] == 0
    assert rows["mine"]["planned_median"] == 4.5 and rows["mine"]["measured_over_planned"] == pytest.approx(1.325)
    assert rows["ref"]["planned_median"] is None and rows["ref"]["masks_mean"] is None
    assert rows["mine"]["masks_mean"] == 11.5  # (of the runs that planned)
    assert rows["ref"]["lds"] == pytest.approx(np.mean([0.8, 0.6, 0.9]))
    out = tmp_path / "pooled.json"
    assert pooled.main([*map(str, paths), "--methods", "mine", "--reference", "ref", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["rows"][1]["contexts"] == 3
    shown = capsys.readouterr().out
    assert "| `mine` | 3 | 0.733 ± 0.060 | -0.033 ± 0.044 | 5.5 (5.0–7.0) | 1 (1) | 4.50 | 1.32 | 11.5 |" in shown


def test_a_context_in_two_files_is_an_error(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(_record("a", ref=(0.8, 20.0))) + "\n")
    with pytest.raises(SystemExit, match="in another of the files"):
        pooled.main([str(path), str(path), "--methods", "ref", "--reference", "ref", "--out", str(tmp_path / "o")])


def test_groups_by_kind_and_by_the_sources_found(tmp_path, capsys):
    """--by kind reads qa and claim contexts apart; --by found, by whether the first method's own sources (its
    design's columns, or its groups' sources) are fewer than the check's, as many or more."""
    records = [_record("qa-heldout-1", ref=(0.8, 20.0), mine=(0.9, 5.0)),
               _record("claim-heldout-1", ref=(0.7, 20.0), mine=(0.5, 5.0)),
               _record("claim-heldout-2", ref=(0.6, 20.0), mine=(0.6, 5.0))]
    for record, sources, design, groups in zip(records, (3, 4, 2), ([[1, 1, 1]], [[1, 1]], [[1, 1, 1]]),
                                                 (None, [[0, 1], [2, 3]], None)):
        record["sources"] = sources
        record["methods"]["mine"]["design"] = design
        if groups:
            record["methods"]["mine"]["groups"] = groups
    assert [pooled.group_of(r, "found", "mine") for r in records] == [
        "the check's sources", "the check's sources", "more sources than the check's"]  # (groups: 4 of 4)
    records[1]["methods"]["mine"]["groups"] = [[0, 1], [2]]
    assert pooled.group_of(records[1], "found", "mine") == "fewer sources than the check's"
    assert pooled.group_of(records[1], "found", "ref") == ""  # (no design: in no group)
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "o.json"
    assert pooled.main([str(path), "--methods", "mine", "--reference", "ref", "--by", "kind", "--out", str(out)]) == 0
    found = json.loads(out.read_text())
    assert found["by"] == "kind" and sorted(found["groups"]) == ["claim", "qa"]
    claim = {row["method"]: row for row in found["groups"]["claim"]}
    assert claim["mine"]["contexts"] == 2 and claim["mine"]["paired"] == pytest.approx(-0.1)
    assert "claim:\n" in capsys.readouterr().out
