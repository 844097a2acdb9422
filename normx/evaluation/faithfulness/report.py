"""The faithfulness report: curves and AOPCs per method, written as JSON, CSV and figures, read back, and shown as a
plain-text table."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from normx.errors import InvalidInputError
from normx.evaluation.faithfulness.metrics import PARTIAL, aopc, mean_and_error
from normx.evaluation.faithfulness.perturbation import MODES
from normx.evaluation.plots import can_plot, plot_mode


@dataclass
class MethodResult:
    """One method's outputs: the logits of every perturbed input and the curves derived from them."""

    name: str
    logits: dict[str, np.ndarray]  # mode -> [N, K, C]
    curves: dict[str, dict[str, list[float]]]  # mode -> metric -> one value per K
    errors: dict[str, dict[str, float]] = field(default_factory=dict)  # mode -> metric -> standard error of AOPC
    options: dict = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # explain / perturb
    examples: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # mode -> metric -> per-example AOPC


@dataclass
class FaithfulnessReport:
    """The faithfulness of several methods on one model and data set."""

    settings: dict
    ks: tuple[float, ...]
    regression: bool
    original: dict  # the unperturbed model: accuracy or Pearson, mean confidence
    results: dict[str, MethodResult]
    skipped: dict[str, str] = field(default_factory=dict)  # method -> why it was not evaluated

    @property
    def methods(self) -> list[str]:
        return list(self.results)

    @property
    def metrics(self) -> list[str]:
        first = next(iter(self.results.values()), None)
        if first is None:
            return []
        return list(first.curves["comprehensiveness"])

    def curve(self, method: str, mode: str = "comprehensiveness", metric: str | None = None) -> list[float] | None:
        metric = metric or self.metrics[0]
        return self.results[method].curves[mode].get(metric)

    def aopc(self, method: str, mode: str = "comprehensiveness", metric: str | None = None,
             within: tuple[float, float] | None = None) -> float:
        """The AOPC (mean over K = 10 ... 90 %, or over ``within``) of one curve; ``metric`` defaults to the
        confidence drop (classification) or Pearson (regression)."""
        curve = self.curve(method, mode, metric)
        if curve is None:
            raise InvalidInputError(f"no {metric!r} curve; metrics: {self.metrics}")
        return aopc(curve, self.ks, within)

    def difference(self, method: str, other: str, mode: str = "comprehensiveness", metric: str | None = None
                   ) -> tuple[float, float]:
        """The paired difference of two methods' AOPCs on the same examples: (mean of method − other over the
        examples, its standard error). Tighter than the two AOPCs' own standard errors, since both methods were
        measured on the same examples. Classification only (Pearson r has no per-example values)."""
        metric = metric or self.metrics[0]
        rows = []
        for name in (method, other):
            if name not in self.results:
                raise InvalidInputError(f"no method {name!r} in this report; it has {', '.join(self.methods)}")
            values = self.results[name].examples.get(mode, {}).get(metric)
            if values is None:
                raise InvalidInputError(
                    f"no per-example {metric!r} AOPCs for {name!r} ({mode}): regression reports have none (Pearson r "
                    "is not a per-example mean), and reports written before they were stored lack them")
            rows.append(np.asarray(values, dtype=np.float64))
        return mean_and_error(rows[0] - rows[1])

    def title(self) -> str:
        s = self.settings
        return f"{s.get('model', s.get('model_class'))} on {s.get('data', 'data')} ({s['examples']} examples)"

    def summary_rows(self) -> list[dict]:
        rows = []
        for method, result in self.results.items():
            for mode in MODES:
                for metric in result.curves[mode]:
                    rows.append({"method": method, "mode": mode, "metric": metric,
                                 "aopc": _json_float(self.aopc(method, mode, metric)),
                                 "aopc_10_40": _json_float(self._partial(method, mode, metric)),
                                 "standard_error": _json_float(result.errors.get(mode, {}).get(metric)),
                                 "examples": self.settings["examples"],
                                 "explain_seconds": result.seconds.get("explain"),
                                 "perturb_seconds": result.seconds.get("perturb")})
        return rows

    def _partial(self, method: str, mode: str, metric: str) -> float | None:
        """The partial AOPC over K = 10 ... 40 % (None when the K grid has none there)."""
        try:
            return self.aopc(method, mode, metric, PARTIAL)
        except InvalidInputError:
            return None

    def to_dict(self) -> dict:
        methods = {}
        for method, result in self.results.items():
            methods[method] = {
                "options": _plain(result.options),
                "aopc": {mode: {metric: _json_float(self.aopc(method, mode, metric)) for metric in result.curves[mode]}
                         for mode in MODES},
                "aopc_standard_error": {mode: {metric: _json_float(value) for metric, value in errors.items()}
                                        for mode, errors in result.errors.items()},
                "curves": {mode: {metric: [_json_float(v) for v in values] for metric, values in curves.items()}
                           for mode, curves in result.curves.items()},
                "seconds": result.seconds,
                "aopc_per_example": {mode: {metric: [_json_float(v) for v in values] for metric, values in
                                            metrics.items()} for mode, metrics in result.examples.items()},
            }
        return {"settings": _plain(self.settings), "ks": list(self.ks), "original": _plain(self.original),
                "methods": methods, "skipped": dict(self.skipped)}

    @classmethod
    def from_dict(cls, data: Mapping) -> FaithfulnessReport:
        """A report read back from :meth:`to_dict` / ``summary.json`` (curves and AOPCs; no logits), e.g. to plot
        or tabulate stored results."""
        results = {}
        for name, method in data["methods"].items():
            errors = {mode: {metric: math.nan if value is None else value for metric, value in metrics.items()}
                      for mode, metrics in method.get("aopc_standard_error", {}).items()}
            curves = {mode: {metric: [math.nan if v is None else v for v in values] for metric, values in
                             metrics.items()} for mode, metrics in method["curves"].items()}
            examples = {mode: {metric: [math.nan if v is None else v for v in values] for metric, values in
                               metrics.items()} for mode, metrics in method.get("aopc_per_example", {}).items()}
            results[name] = MethodResult(name, {}, curves, errors, dict(method.get("options", {})),
                                         dict(method.get("seconds", {})), examples)
        return cls(dict(data["settings"]), tuple(data["ks"]), bool(data["settings"]["regression"]),
                   dict(data["original"]), results, dict(data.get("skipped", {})))

    def write(self, folder: str | Path, plots: bool = True) -> list[Path]:
        """Write summary.json, curves.csv, summary.csv and (``plots``) comprehensiveness.png / sufficiency.png."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        written = [out / "summary.json", out / "curves.csv", out / "summary.csv"]
        written[0].write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        with open(written[1], "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["method", "mode", "metric", "k_percent", "value"])
            for method, result in self.results.items():
                for mode, curves in result.curves.items():
                    for metric, values in curves.items():
                        for k, value in zip(self.ks, values):
                            writer.writerow([method, mode, metric, round(100 * k), _csv_float(value)])
        with open(written[2], "w", newline="", encoding="utf-8") as handle:
            rows = self.summary_rows()
            fields = ["method", "mode", "metric", "aopc", "aopc_10_40", "standard_error", "examples", "explain_seconds",
                      "perturb_seconds"]
            writer = csv.DictWriter(handle, fieldnames=fields)
            writer.writeheader()
            for row in rows:
                writer.writerow({k: _csv_float(v) if k in ("aopc", "aopc_10_40", "standard_error") else v
                                 for k, v in row.items()})
        if plots and self.results and can_plot():
            written += [plot_mode(self, mode, out / f"{mode}.png") for mode in MODES]
        return written


def format_table(report: FaithfulnessReport) -> str:
    """A plain-text table of the AOPCs, one row per method."""
    columns = [(mode, metric) for mode in MODES for metric in report.metrics]
    heads = [f"{'comp' if mode == 'comprehensiveness' else 'suff'} {metric}" for mode, metric in columns]
    lines = [f"{'method':<22}" + "".join(f"{h:>22}" for h in heads)]
    for method in report.methods:
        cells = []
        for mode, metric in columns:
            value = report.aopc(method, mode, metric)
            error = report.results[method].errors.get(mode, {}).get(metric, float("nan"))
            text = "n/a" if not math.isfinite(value) else f"{value:.4f}" + (f" ±{error:.4f}" if math.isfinite(error)
                                                                            else "")
            cells.append(f"{text:>22}")
        lines.append(f"{method:<22}" + "".join(cells))
    original = ", ".join(f"{k} {v:.4f}" for k, v in report.original.items())
    lines.append(f"AOPC over K = 10..90% (± standard error over examples); {report.settings['examples']} examples; "
                 f"unperturbed: {original}")
    for method, why in report.skipped.items():
        lines.append(f"skipped {method}: {why}")
    return "\n".join(lines)


def _json_float(value):
    return None if value is None or not math.isfinite(value) else float(value)


def _csv_float(value):
    return "" if value is None or not math.isfinite(value) else f"{value:.6f}"


def _plain(value):
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return _json_float(value)
    if isinstance(value, np.generic):
        return _plain(value.item())
    return value
