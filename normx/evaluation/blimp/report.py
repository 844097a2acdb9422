"""The BLiMP evidence-alignment report: curves (mean Dot Product / Average Precision per layer, per paradigm and
pooled), coverage and settings, written as JSON, CSV and figures."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from normx.evaluation.plots import can_plot, plot_blimp
from normx.methods import display_name, get_method

# dp: the authors' normalisation (shares divided by their sum, other scores through a softmax); dp_softmax: a
# softmax for every method (what normx reported before)
METRICS = {"dp": "Dot Product", "ap": "Average Precision", "dp_softmax": "Dot Product (softmax for every method)"}


def curve_names(method: str) -> list[str]:
    """The curves a method gives: a method with ``Method.foil_curve`` (LogAt) gives its score for the target and for
    the foil on each token; the others one."""
    return [f"{method}_target", f"{method}_foil"] if get_method(method).foil_curve else [method]


def curve_label(curve: str) -> str:
    """A curve's name in figures: the method's display name, with (target) / (foil) for LogAt's two curves."""
    for side in ("target", "foil"):
        if curve.endswith(f"_{side}"):
            return f"{display_name(curve.removesuffix(f'_{side}'))}({side})"
    return display_name(curve)


@dataclass
class BlimpReport:
    """What :func:`normx.evaluation.blimp.run.evaluate_blimp` measured.

    ``curves[metric][group][curve]`` holds ``{"mean", "sem", "n"}`` per layer (``group``: a paradigm, or ``"all"``
    pooled); ``summary`` one row per (group, curve, metric); ``methods[name]`` its status (``"ok"`` or ``"not
    applicable"`` with a reason); ``coverage[paradigm]`` how many pairs the rules covered and the model could
    score; ``settings`` the split, sample, seed, timings, dtype and device.
    """

    model: str
    setting: str  # "masked" | "causal"
    layers: list[int]
    paradigms: list[str]
    methods: dict
    coverage: dict
    curves: dict
    summary: list[dict]
    settings: dict

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> BlimpReport:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})

    def write(self, out: str | Path, plots: bool = True) -> list[Path]:
        """``blimp.json`` (everything), ``curves.csv``, ``summary.csv``, ``coverage.csv`` and, with ``plots``,
        ``dp.png`` / ``ap.png`` (mean alignment vs layer, one line per method, one panel per paradigm)."""
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        written = [folder / "blimp.json", folder / "curves.csv", folder / "summary.csv", folder / "coverage.csv"]
        written[0].write_text(json.dumps(self.to_dict(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        with open(written[1], "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["paradigm", "curve", "metric", "layer", "mean", "sem", "n"])
            for metric, groups in self.curves.items():
                for group, per_curve in groups.items():
                    for name, stats in per_curve.items():
                        for layer, mean, sem in zip(self.layers, stats["mean"], stats["sem"]):
                            writer.writerow([group, name, metric, layer, f"{mean:.6f}",
                                             "" if sem is None else f"{sem:.6f}", stats["n"]])
        _write_rows(written[2], self.summary)
        _write_rows(written[3], [
            {"paradigm": key, "uid": c["uid"], "pairs": c["pairs"], "covered_by_rules": c["covered_by_rules"],
             "split": c["split"], "sampled": c["sampled"], "evaluated": c["evaluated"],
             "skipped_for_model": "; ".join(f"{k}: {v}" for k, v in c["skipped_for_model"].items())}
            for key, c in self.coverage.items()])
        if plots and can_plot():
            for metric, title in METRICS.items():
                written.append(plot_blimp(self, metric, folder / f"{metric}.png", title, curve_label))
        return written

    def table(self) -> str:
        """The pooled (or single-paradigm) mean over layers and best layer of each curve, as plain text."""
        group = "all" if len(self.paradigms) > 1 else self.paradigms[0]
        rows = [r for r in self.summary if r["paradigm"] == group]
        if not rows:
            return ""
        lines = [f"{group}: {'curve':<16} {'metric':<6} {'mean':>7} {'best':>7} {'@layer':>6} {'last':>7}"]
        for r in sorted(rows, key=lambda r: (r["metric"], r["curve"])):
            lines.append(f"{'':<{len(group) + 2}}{r['curve']:<16} {r['metric']:<6} {r['mean_over_layers']:7.3f} "
                         f"{r['best']:7.3f} {r['best_layer']:>6} {r['last_layer']:7.3f}")
        return "\n".join(lines)


def _write_rows(file: Path, rows: list[dict]) -> None:
    with open(file, "w", newline="", encoding="utf-8") as handle:
        if not rows:
            return
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: f"{v:.6f}" if isinstance(v, float) else v for k, v in row.items()})
