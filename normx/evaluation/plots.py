"""PNG figures of faithfulness curves in the style of the NormXLogit paper's figures: one line per method, the
metric against the perturbation ratio K, with each method's AOPC in the legend.

matplotlib is imported lazily (``pip install 'normx[eval]'``); the figures are drawn on a plain
:class:`matplotlib.figure.Figure`, so no pyplot backend or global state is touched.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

from normx.methods import display_name

YLABELS = {
    "confidence_drop": "confidence drop  p(ŷ|x) − p(ŷ|x̃)",
    "accuracy": "accuracy (gold labels)",
    "pearson": "Pearson r with gold scores",
}
XLABELS = {
    "comprehensiveness": "K: % of tokens perturbed (most important first)",
    "sufficiency": "K: % of tokens kept (most important), the rest perturbed",
}
BETTER = {("comprehensiveness", "confidence_drop"): "higher is better",
          ("comprehensiveness", "accuracy"): "lower is better",
          ("comprehensiveness", "pearson"): "lower is better",
          ("sufficiency", "confidence_drop"): "lower is better",
          ("sufficiency", "accuracy"): "higher is better",
          ("sufficiency", "pearson"): "higher is better"}
MARKERS = "osD^v<>pP*hX"


def can_plot() -> bool:
    """Whether matplotlib is installed; if not, a warning says the figures are skipped and how to get them."""
    import importlib.util
    import warnings

    if importlib.util.find_spec("matplotlib") is not None:
        return True
    warnings.warn("matplotlib is not installed: the figures (PNG) are skipped, everything else is written; "
                  "pip install 'normx[eval]' for them", stacklevel=3)
    return False


def plot_mode(report, mode: str, path: str | Path) -> Path:
    """One PNG for ``mode`` (``"comprehensiveness"`` or ``"sufficiency"``): a panel per metric."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the faithfulness plots need matplotlib: pip install 'normx[eval]' (or matplotlib)") \
            from exc

    metrics = report.metrics
    rows = (len(report.methods) + 1) // 2  # legend rows under each panel
    fig = Figure(figsize=(5.6 * len(metrics), 4.0 + 0.2 * rows), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    ks = [100 * k for k in report.ks]
    colors = _colors(len(report.methods))
    for ax, metric in zip(axes, metrics):
        for index, method in enumerate(report.methods):
            curve = report.curve(method, mode, metric)
            if curve is None:
                continue
            value = report.aopc(method, mode, metric)
            label = f"{display_name(method)} (AOPC {value:.3f})"
            ax.plot(ks, curve, marker=MARKERS[index % len(MARKERS)], markersize=4, linewidth=1.6,
                    color=colors[index], label=label)
        ax.set_xlabel(XLABELS[mode])
        ax.set_ylabel(YLABELS.get(metric, metric))
        ax.set_xticks(ks)
        ax.set_xticklabels([f"{k:g}" for k in ks])
        ax.grid(True, alpha=0.3)
        ax.set_title(f"{mode} — {metric.replace('_', ' ')} ({BETTER.get((mode, metric), '')})", fontsize=10)
        ax.legend(fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    fig.suptitle(report.title(), fontsize=11)
    path = Path(path)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    _save_small_png(buffer, path)
    return path


def _save_small_png(buffer: io.BytesIO, path: Path) -> None:
    """A palette PNG (line plots need few colours): about a quarter of the size of the RGBA one."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow comes with matplotlib
        path.write_bytes(buffer.getvalue())
        return
    buffer.seek(0)
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(colors=256).save(path, optimize=True)


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def plot_blimp(report, metric: str, file: str | Path, title: str, label) -> Path:
    """Mean ``metric`` ("dp", "ap" or "dp_softmax"; ``title`` its name) vs layer, one line per curve (``label``:
    a curve's name in the legend), one panel per paradigm (+ "all")."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    groups = report.curves[metric]
    order = [g for g in report.paradigms if g in groups] + (["all"] if "all" in groups else [])
    if not order:
        raise ValueError(f"no {metric} curves to plot: no pair was evaluated")
    names = list(dict.fromkeys(n for g in order for n in groups[g]))
    colours = {name: colormaps["tab10"](i % 10) for i, name in enumerate(names)}
    flat = {m for m, s in report.methods.items() if s.get("layered") is False}
    columns = min(3, len(order))
    rows = math.ceil(len(order) / columns)
    fig = Figure(figsize=(4.6 * columns, 3.6 * rows))
    axes = fig.subplots(rows, columns, squeeze=False)
    layers = report.layers
    for ax, group in zip(axes.flat, order):
        for name in names:
            if name not in groups[group]:
                continue
            stats = groups[group][name]
            dashed = name in flat
            ax.plot(layers, stats["mean"], color=colours[name], linestyle="--" if dashed else "-",
                    marker=None if dashed else "o", markersize=3, linewidth=1.4, label=label(name))
        n = max(s["n"] for s in groups[group].values())
        ax.set_title(f"{group} (n={n})")
        ax.set_xlabel("layer")
        ax.set_ylabel(f"mean {metric.upper()}")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(order):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), frameon=False)
    fig.suptitle(f"BLiMP evidence alignment: {title} ({report.model}, {report.setting} LM)")
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(file, dpi=120)
    return Path(file)
