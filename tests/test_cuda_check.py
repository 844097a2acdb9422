"""studies/parity/cuda_check.py (normx on a device against normx on the CPU) in its dry run: the CPU against itself,
every check passing; a device copy whose weights differ fails the float32 checks; the comparison's own rules."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from studies.parity import cuda_check


def test_the_dry_run_passes_every_check_and_writes_them(tmp_path):
    out = tmp_path / "check.json"
    assert cuda_check.main(["--device", "cpu", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    names = [check["name"] for check in record["checks"]]
    methods = len(cuda_check.ENCODER_METHODS) + len(cuda_check.DECODER_METHODS)
    assert len(names) == len(set(names)) == 3 * methods + 1  # float32, bfloat16, float16 per method; generate
    assert all(check["ok"] for check in record["checks"]), [c for c in record["checks"] if not c["ok"]]
    assert record["summary"] == f"SUMMARY cuda_check on cpu: {len(names)} PASS, 0 FAIL"
    assert "encoder decompx cpu bfloat16 ~ float32" in names and "decoder generate cpu float32 == cpu float32" in names
    assert record["tolerances"]["half"] == cuda_check.HALF_RTOL and record["versions"]["torch"] == torch.__version__


def test_a_device_copy_with_other_weights_fails_the_float32_checks(monkeypatch):
    def perturbed(model, device, dtype=torch.float32):
        changed = copy.deepcopy(model).to(device=device, dtype=dtype).eval()
        with torch.no_grad():
            next(changed.parameters()).mul_(1.05)  # the word embeddings, 5% larger
        return changed

    monkeypatch.setattr(cuda_check, "on", perturbed)
    checks = cuda_check.Checks()
    cuda_check.encoder_checks(checks, "cpu")
    fp32 = [r for r in checks.results if "float32 == cpu float32" in r.name]
    assert len(fp32) == len(cuda_check.ENCODER_METHODS)
    assert not any(r.ok for r in fp32), [r.name for r in fp32 if r.ok]
    assert all("max |diff|" in r.detail or "predictions" in r.detail for r in fp32)
    assert "FAIL" in cuda_check.summary(checks, "cpu")


def test_the_comparison_rules():
    assert cuda_check.gap([1.0, np.nan, 3.0], [1.5, np.nan, 2.0]) == (1.0, 2.0)
    with pytest.raises(AssertionError, match="NaN at other positions"):
        cuda_check.gap([1.0, 2.0], [1.0, np.nan])
    with pytest.raises(AssertionError, match="non-finite"):
        cuda_check.gap([np.inf, 2.0], [1.0, 2.0])
    with pytest.raises(AssertionError, match="shape"):
        cuda_check.gap([1.0], [1.0, 2.0])
    assert "of max" in cuda_check.assert_near([1.0, 2.0001], [1.0, 2.0], 1e-4, "scores")
    with pytest.raises(AssertionError, match="scores: max"):
        cuda_check.assert_near([1.0, 2.01], [1.0, 2.0], 1e-4, "scores")


def test_a_check_that_raises_is_a_fail_and_the_others_run():
    checks = cuda_check.Checks()
    checks.run("fine", lambda: "ok")
    checks.run("wrong", lambda: (_ for _ in ()).throw(AssertionError("too far")))
    checks.run("broken", lambda: 1 / 0)
    assert [(r.name, r.ok) for r in checks.results] == [("fine", True), ("wrong", False), ("broken", False)]
    assert checks.results[1].detail == "AssertionError: too far"
    assert cuda_check.summary(checks, "cpu") == "SUMMARY cuda_check on cpu: 1 PASS, 2 FAIL (wrong, broken)"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_a_cuda_device_torch_cannot_see_is_refused(capsys):
    with pytest.raises(SystemExit) as stop:
        cuda_check.main(["--device", "cuda"])
    assert stop.value.code == 2 and "sees no CUDA device" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cuda_check.main(["--device", "tpu"])
