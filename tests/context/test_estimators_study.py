"""studies/context/estimators.py: the recorded masks refitted; on outcomes linear in the log of the loss every fit
that does not shrink reads them exactly, and the runs it cannot refit (groups, a prior) are left out."""

from __future__ import annotations

import json

import numpy as np
import pytest

from normx.evaluation.context import metrics
from normx.methods.ablation import budgeted, designs
from studies.context import estimators


def _record(effects: np.ndarray, spec: str, **extra) -> dict:
    sources = len(effects)
    design = np.vstack([np.ones((1, sources), bool), designs.masks(sources, 16, 0, "fold_over")])
    masks = metrics.lds_masks(sources, 32, 0)
    loss = lambda keep: np.exp(-1.0 - keep @ effects)  # noqa: E731 (the loss falls as the sources are kept)
    return {"id": spec, "sources": sources, "truth": (-loss(masks)).tolist(),
            "methods": {spec: {"design": design.astype(int).tolist(), "outcomes": (-loss(design)).tolist(), **extra}}}


def test_linear_outcomes_are_read_exactly_and_runs_it_cannot_refit_are_left_out(tmp_path):
    effects = np.array([0.9, 0.1, -0.2, 0.4, 0.0, 0.05, 0.3, -0.1])
    records = [_record(effects, "a"), _record(effects, "b", groups=[[0, 1]]), _record(effects, "c", prior_scores=[1])]
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out.json"
    assert estimators.main(["--records", str(path), "--out", str(out)]) == 0
    found = json.loads(out.read_text())["summary"]
    assert found["all"]["runs"] == 1 and "surplus 6+" in found  # (16 masks, 8 sources)
    design = np.array(records[0]["methods"]["a"]["design"], bool)
    exact = metrics.lds(budgeted.surrogate(design, np.array(records[0]["methods"]["a"]["outcomes"])),
                        metrics.lds_masks(8, 32, 0), np.array(records[0]["truth"]))
    assert found["all"]["fits"]["huber"]["lds"] == pytest.approx(exact) and exact > 0.99
    assert found["all"]["fits"]["lasso 0.003"]["lds"] > 0.95
    assert found["all"]["fits"]["huber"]["paired"] == 0.0
