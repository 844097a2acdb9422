"""The generation benchmark's tables (bench/test_generation_lengths.py) from a pytest-benchmark JSON: per model and
method, at each length, the time per instance, the peak memory and the max batch, each beside the plain forward;
and the long-context row (peak memory of the tiny long Llama by length, and its growth). Used by bench/report.py,
which writes them between ``<!-- bench-lengths:start -->`` and ``<!-- bench-lengths:end -->``. Several runs read
together (bench/report.py's ``load``, in the order given): a later run's entry replaces an earlier one's for the
same model, method and length, so a rerun of some cases is written beside the old JSON and named after it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

START, END = "<!-- bench-lengths:start -->", "<!-- bench-lengths:end -->"
LEVELS = ("generation", "long_context")
METHOD_ORDER = ("forward", "normxlogit", "norm_attention", "attention", "alti_logit", "gradient_x_input", "attnlrp",
                "random")


def commit_ids(commit: dict) -> str:
    """The run's commit (several runs: each), 10 characters each."""
    return ", ".join(c[:10] for c in str(commit.get("id", "?")).split(", "))


def _time(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.1f} ms"


def _mib(value: int | None) -> str:
    return "–" if value is None else f"{value / 1024**2:,.0f} MiB"


def _order(method: str) -> int:
    return METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def entries(data: dict, level: str) -> list[dict]:
    return [b["extra_info"] for b in data["benchmarks"] if b.get("extra_info", {}).get("level") == level]


def _time_cell(x: dict) -> str:
    if x.get("out_of_memory"):
        return "out of memory"
    if x["method"] == "forward":
        return _time(statistics.median(x["forward_seconds"]))
    ratio = x.get("ratio_to_forward")
    return _time(statistics.median(x["seconds"])) + ("" if ratio is None else f" ({ratio:.2f}×)")


def _memory_cell(x: dict) -> str:
    peak, forward = x.get("peak_bytes"), x.get("forward_peak_bytes")
    if x.get("out_of_memory"):
        return "out of memory"
    if x["method"] == "forward" or not forward:
        return _mib(peak)
    return f"{_mib(peak)} ({peak / forward:.2f}×)"


def _batch_cell(x: dict, forward: dict | None) -> str:
    if "max_batch" not in x:
        return "not searched" if x.get("search_skipped") else "–"
    cell = f"{x['max_batch']}" + (" (cap)" if x["max_batch"] == x.get("max_batch_cap") else "")
    if x["method"] != "forward" and forward and forward.get("max_batch"):
        cell += f" ({x['max_batch'] / forward['max_batch']:.2f}×)"
    per_instance = (x.get("batch_seconds") or {}).get(str(x["max_batch"]))
    return cell + ("" if per_instance is None else f" · {_time(per_instance)}")


def generation_tables(infos: list[dict]) -> list[str]:
    by_model: dict[str, dict] = defaultdict(dict)
    for x in infos:  # in the runs' order: a later entry of a (model, method, length) replaces an earlier one
        by_model[x["model"]][(x["method"], x["L"])] = x
    lines = []
    for model, cases in by_model.items():
        lengths = sorted({key[1] for key in cases})
        methods = sorted({key[0] for key in cases}, key=_order)
        header = ["method", *(f"{length:,} tokens" for length in lengths)]
        some = next(iter(cases.values()))
        budget = next((x["budget_bytes"] for x in cases.values() if "budget_bytes" in x), None)
        tables = [
            (f"time per instance, all {some['steps']} steps (× the plain forward, interleaved)",
             lambda x, _f: _time_cell(x)),
            ("peak memory (× the plain forward's, in the same process)", lambda x, _f: _memory_cell(x)),
            (f"max batch under {_mib(budget)} (× the forward's) · time per instance there", _batch_cell),
        ]
        for title, cell in tables:
            rows = []
            for method in methods:
                row = [method]
                for length in lengths:
                    x = cases.get((method, length))
                    row.append("–" if x is None else cell(x, cases.get(("forward", length))))
                rows.append(row)
            lines += [f"**{model}**, {title}", "", *_table(header, rows), ""]
        skipped = sorted({(x["method"], x["L"], x["search_skipped"]) for x in cases.values() if "search_skipped" in x},
                         key=lambda k: (_order(k[0]), k[1]))
        if skipped:
            lines += ["Not searched (a search costs about 2 × cap rounds): "
                      + "; ".join(f"{m} at {length:,}: {why}" for m, length, why in skipped) + ".", ""]
    return lines


def long_context_tables(infos: list[dict]) -> list[str]:
    """One table per model: the entries of its methods together (one entry per method when each ran alone); a
    later entry's figures and growth of a method replace an earlier one's."""
    merged: dict[str, dict] = {}
    for x in infos:
        into = merged.setdefault(x["model"], {**x, "figures": {}, "growth": {}})
        into["figures"].update(x["figures"])
        ran = {method: ratio for method, ratio in x["growth"].items() if method in x["figures"]}
        into["growth"] = {**x["growth"], **into["growth"], **ran}
    lines = []
    for model, x in merged.items():
        lengths = x["lengths"]
        header = ["method", *(f"{length:,} tokens" for length in lengths), f"{lengths[-1]:,} / {lengths[-2]:,}"]
        figures = x["figures"]
        if "forward" in figures:  # the forward's own case
            forward = [figures["forward"][str(length)]["peak_bytes"] for length in lengths]
        else:  # the forward measured beside the first method
            forward = [next(iter(figures.values()))[str(length)]["forward_peak_bytes"] for length in lengths]
        rows = [["forward", *map(_mib, forward), f"{forward[-1] / forward[-2]:.2f}×"]]
        for method, by_length in sorted(figures.items(), key=lambda item: _order(item[0])):
            if method != "forward":
                rows.append([method, *(_mib(by_length[str(length)]["peak_bytes"]) for length in lengths),
                             f"{x['growth'][method]:.2f}×"])
        lines += [f"**{model}**, peak memory, all {x['steps']} steps, a fresh process per method and length", "",
                  *_table(header, rows), ""]
    return lines


def has_results(data: dict) -> bool:
    return any(entries(data, level) for level in LEVELS)


def render(data: dict, command: str | None = None, note: str | None = None, level: int = 2) -> str:
    """The markdown of the generation entries, headings from ``level``."""
    generation, long_context = entries(data, "generation"), entries(data, "long_context")
    infos = generation or long_context
    h = "#" * (level + 1)
    commit = data.get("commit_info", {})
    first = infos[0] if infos else {}
    lines = ["#" * level + " Generation across lengths", "",
             f"Measured {data.get('datetime', '?')[:19]} on {first.get('device', '?')}, dtype "
             f"{first.get('dtype', '?')}, timer `{first.get('timer', '?')}`, commit "
             f"{commit_ids(commit)}{' (dirty tree)' if commit.get('dirty') else ''}. Each case in a "
             "fresh process (bench/length_worker.py); memory: CPU working memory above the loaded model (VmHWM), "
             "CUDA `torch.cuda.max_memory_allocated`.", ""]
    if command:
        lines += ["Produced by:", "", "```", command, "```", ""]
    if note:
        lines += [note, ""]
    if generation:
        lines += [f"{h} Time, memory and max batch per method and length", "", *generation_tables(generation)]
    if long_context:
        lines += [f"{h} Long context: memory growth", "", *long_context_tables(long_context)]
    return "\n".join(lines).rstrip() + "\n"
