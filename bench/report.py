"""Markdown tables from a pytest-benchmark JSON file written by the bench suite.

    python bench/report.py .benchmarks/latest.json -o bench/RESULTS.md [--readme README.md] \
        [--docs docs/generation.md]

Per model: time per instance of each method at each input length L (median round / batch) with its ratio to the
plain forward pass (median over rounds of method round / the forward run just before it, see bench/timing.py),
at batch 1 and at the larger batch; the end-to-end comparison (``normx.explain`` vs tokenise + forward + softmax);
the max batch under the memory budget with the time per instance there (the paper's Table 5); normx's gradient
methods against Captum's; and the issue's goals, each marked met or not from the measured figures.
The output file and ``--readme`` get them between ``<!-- bench:start -->`` and ``<!-- bench:end -->``, and the
generation benchmark's (bench/report_lengths.py) between ``<!-- bench-lengths:start -->`` and
``<!-- bench-lengths:end -->``: only the blocks the JSON has results for are replaced, so a run of one part of the
suite leaves the other's tables as they were. ``--block NAME`` keeps a run apart (another device's, say): its
suite and generation tables together under one heading, between ``<!-- bench-NAME:start -->`` and
``<!-- bench-NAME:end -->`` of the output file only (added at its end the first time):

    python bench/report.py bench/results/h200-2026-11-26/*.json -o bench/RESULTS.md --block h200 \
        --title "..." --command "..." --note "..."
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

import report_lengths
from report_lengths import commit_ids

START, END = "<!-- bench:start -->", "<!-- bench:end -->"
METHOD_ORDER = ("forward", "normxlogit", "logat_all", "l2norm", "gradient_norm", "gradient_x_input",
                "integrated_gradients", "decompx")
GOALS = {"normxlogit": 1.05, "logat_all": 1.2}  # time ratio to the plain forward, at most
MAX_BATCH_GOAL = 0.9  # NormXLogit's max batch / the plain forward's, at least


def _time(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def _bytes(value: int | None) -> str:
    if value is None:
        return "–"
    return f"{value / 1024**3:.2f} GiB" if value >= 1024**3 else f"{value / 1024**2:.0f} MiB"


def _order(method: str) -> int:
    return METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def load(*paths: Path) -> dict:
    """One pytest-benchmark JSON, or several runs as one: their benchmarks together, the first's date, every
    commit named (in order, once each)."""
    return merge([json.loads(path.read_text()) for path in paths])


def merge(runs: list[dict]) -> dict:
    """Several parsed runs as one (see :func:`load`)."""
    data = dict(runs[0], benchmarks=[b for run in runs for b in run["benchmarks"]])
    commits = list(dict.fromkeys(str(run.get("commit_info", {}).get("id", "?"))[:10] for run in runs))
    if len(commits) > 1:
        dirty = any(run.get("commit_info", {}).get("dirty") for run in runs)
        data["commit_info"] = {"id": ", ".join(commits), "dirty": dirty}
    return data


def _suite_entries(data: dict) -> list[dict]:
    """The classification entries (the generation benchmark's are bench/report_lengths.py's)."""
    return [b for b in data["benchmarks"]
            if "level" in b.get("extra_info", {}) and b["extra_info"]["level"] not in report_lengths.LEVELS]


def _describe(data: dict, entries: list[dict]) -> list[str]:
    info = entries[0]["extra_info"] if entries else {}
    commit = data.get("commit_info", {})
    lines = [f"Measured {data.get('datetime', '?')[:19]} on {info.get('device', '?')}, dtype {info.get('dtype', '?')}, "
             f"timer `{info.get('timer', '?')}`, commit {commit_ids(commit)}"
             f"{' (dirty tree)' if commit.get('dirty') else ''}."]
    rounds = sorted({e["stats"]["rounds"] for e in entries})
    shown = f"{rounds[0]}–{rounds[-1]}" if len(rounds) > 2 else ", ".join(map(str, rounds))
    lines.append(f"Rounds per case: {shown} (median shown).")
    return lines


def speed_tables(entries: list[dict], level: str) -> list[str]:
    by_model: dict[str, dict] = defaultdict(dict)
    for e in entries:
        x = e["extra_info"]
        if x["level"] == level:
            by_model[x["model"]][(x["method"], x["L"], x["batch"])] = x
    lines = []
    for model, cases in by_model.items():
        lengths = sorted({key[1] for key in cases})
        batches = sorted({key[2] for key in cases})
        methods = sorted({key[0] for key in cases}, key=_order)
        for batch in batches:
            rows = []
            for method in methods:
                row = [method]
                for length in lengths:
                    x = cases.get((method, length, batch))
                    if x is None or "per_instance_s" not in x:
                        row.append("–")
                        continue
                    ratio = x.get("ratio_to_forward")
                    row.append(_time(x["per_instance_s"]) + ("" if ratio is None else f" ({ratio:.3f}×)"))
                rows.append(row)
            lines += [f"**{model}**, batch {batch}", ""]
            lines += [*_table(["method"] + [f"L={length}" for length in lengths], rows), ""]
    return lines


def max_batch_tables(entries: list[dict]) -> list[str]:
    by_model: dict[str, dict] = defaultdict(dict)
    for e in entries:
        x = e["extra_info"]
        if x["level"] == "max_batch":
            by_model[x["model"]][(x["method"], x["L"])] = x
    lines = []
    for model, cases in by_model.items():
        lengths = sorted({key[1] for key in cases})
        methods = sorted({key[0] for key in cases}, key=_order)
        rows = []
        for method in methods:
            row = [method]
            for length in lengths:
                x = cases.get((method, length))
                if x is None:
                    row.append("–")
                    continue
                forward = cases.get(("forward", length))
                cell = f"{x['max_batch']}"
                if x["max_batch"] == x.get("max_batch_cap"):
                    cell += " (cap)"
                if forward and forward["max_batch"]:
                    cell += f" ({x['max_batch'] / forward['max_batch']:.2f}×)"
                timed = "" if x["max_batch"] else " at batch 1"
                cell += f" · {_time(x.get('per_instance_s'))}{timed}"
                row.append(cell)
            rows.append(row)
        budget = next(iter(cases.values())).get("budget_bytes")
        lines += [f"**{model}**, memory budget {_bytes(budget)}: max batch (ratio to the forward's) · time per "
                  "instance at that batch", ""]
        lines += [*_table(["method"] + [f"L={length}" for length in lengths], rows), ""]
    return lines


def _captum_groups(data: dict) -> dict[str, dict]:
    """group -> {"normx": median s, "captum": median s, "ratio": normx / Captum}: the interleaved median ratio
    (``extra_info["ratio_to_captum"]``) where recorded, else the ratio of the medians."""
    groups: dict[str, dict] = defaultdict(dict)
    for b in data["benchmarks"]:
        implementation = (b.get("params") or {}).get("implementation")
        if implementation and b.get("group"):
            groups[b["group"]][implementation] = b["stats"]["median"]
            if "ratio_to_captum" in b.get("extra_info", {}):
                groups[b["group"]]["ratio"] = b["extra_info"]["ratio_to_captum"]
    out = {}
    for group, t in sorted(groups.items()):
        if {"normx", "captum"} <= set(t):
            out[group] = {**t, "ratio": t.get("ratio", t["normx"] / t["captum"])}
    return out


def captum_table(data: dict) -> list[str]:
    rows = [[group, _time(t["normx"]), _time(t["captum"]), f"{t['ratio']:.3f}×"]
            for group, t in _captum_groups(data).items()]
    if not rows:
        return []
    intro = ("normx's gradient methods vs Captum's (bench/test_gradients_bench.py: MiniLM, 8 texts of 40 tokens, "
             "IG n_steps=50), median per call; normx / Captum is the median over rounds of a normx round / the "
             "Captum run just before it:")
    return [intro, "", *_table(["work", "normx", "Captum", "normx / Captum"], rows), ""]


def goals(data: dict, entries: list[dict]) -> list[str]:
    lines = []
    speed = [e["extra_info"] for e in entries if e["extra_info"]["level"] == "batch"]
    for method, limit in GOALS.items():
        ratios = [(x["model"], x["L"], x["batch"], x["ratio_to_forward"]) for x in speed
                  if x["method"] == method and "ratio_to_forward" in x]
        if not ratios:
            continue
        worst = max(ratios, key=lambda r: r[3])
        met = sum(r[3] <= limit for r in ratios)
        lines.append(f"- {method} ≤ {limit}× the plain forward (encoded batch): {met} of {len(ratios)} cases "
                     f"met; median {statistics.median(r[3] for r in ratios):.3f}×, worst {worst[3]:.3f}× "
                     f"({worst[0]}, L={worst[1]}, batch {worst[2]}).")
    memory = defaultdict(dict)
    for e in entries:
        x = e["extra_info"]
        if x["level"] == "max_batch":
            memory[(x["model"], x["L"])][x["method"]] = x["max_batch"]
    pairs = [(key, m["normxlogit"] / m["forward"]) for key, m in memory.items()
             if "normxlogit" in m and m.get("forward")]
    if pairs:
        met = sum(r >= MAX_BATCH_GOAL for _, r in pairs)
        worst = min(pairs, key=lambda p: p[1])
        lines.append(f"- normxlogit max batch ≥ {MAX_BATCH_GOAL}× the forward's: {met} of {len(pairs)} cases met; "
                     f"worst {worst[1]:.2f}× ({worst[0][0]}, L={worst[0][1]}).")
    for group, t in _captum_groups(data).items():
        verdict = "met" if t["ratio"] <= 1 else "not met"
        lines.append(f"- {group}: normx no slower than Captum: {verdict} ({t['ratio']:.3f}×).")
    return lines


HOST_GOALS = {"normxlogit": 1.10, "attention": 1.30, "norm_attention": 1.30}  # issue #55's bars on the stand-in


def host_table(entries: list[dict]) -> list[str]:
    """bench/test_host_overhead.py: each reading beside the model's own forward on the CPU stand-in for a card."""
    rows = []
    for e in entries:
        x = e["extra_info"]
        if x["level"] != "host_overhead" or "ratio_to_forward" not in x:
            continue
        goal = HOST_GOALS.get(x["method"])
        mark = "" if goal is None else (" ✓" if x["ratio_to_forward"] <= goal else f" (bar {goal:.2f}×)")
        what = "classification, batch 1" if x["case"] == "classification" else f"{x['steps']} steps"
        tokenize = x.get("tokenize_s")
        rows.append([x["case"], f"{x['tokens']:,}", what, x["method"], f"{x['ratio_to_forward']:.3f}×{mark}",
                     _time(x["per_instance_s"]), _time(x["forward_per_instance_s"]),
                     "–" if tokenize is None else _time(tokenize)])
    if not rows:
        return []
    return [*_table(["case", "tokens", "what", "reading", "ratio to the forward", "normx", "forward",
                     "tokenising the prompt"], rows), ""]


def render(data: dict, command: str | None = None, compact: bool = False, level: int = 2, note: str | None = None
           ) -> str:
    """The markdown, headings from ``level``; ``compact``: the goals, the encoded-batch tables of one model
    (BERT-base if measured) and the max-batch tables, for the README."""
    entries = _suite_entries(data)
    h = "#" * (level + 1)
    lines = ["#" * level + " Benchmark results", "", *_describe(data, entries), ""]
    if command:
        lines += ["Produced by:", "", "```", command, "```", ""]
    if note:
        lines += [note, ""]
    goal_lines = goals(data, entries)
    if goal_lines:
        lines += [f"{h} Goals", "", *goal_lines, ""]
    speed = entries
    if compact:
        models = [e["extra_info"]["model"] for e in entries if e["extra_info"]["level"] == "batch"]
        shown = "bert-base" if "bert-base" in models else (models[0] if models else None)
        speed = [e for e in entries if e["extra_info"].get("model") == shown]
    batch = speed_tables(speed, "batch")
    if batch:
        lines += [f"{h} Time per instance on an encoded batch (ratio to the plain forward, interleaved)", "", *batch]
    e2e = speed_tables(entries, "end_to_end")
    if e2e and not compact:
        lines += [f"{h} End to end: `normx.explain` vs tokenise + forward + softmax", "", *e2e]
    host = host_table(entries)
    if host:
        lines += [f"{h} Host work beside a fast forward: the CPU stand-in for a card (bench/test_host_overhead.py)",
                  "", *host]
    maxb = max_batch_tables(entries)
    if maxb:
        lines += [f"{h} Max batch under the memory budget", "", *maxb]
    captum = captum_table(data)
    if captum and not compact:
        lines += [f"{h} Against Captum", "", *captum]
    if compact:
        lines += ["All models, the end-to-end comparison and normx against Captum: "
                  "[bench/RESULTS.md](bench/RESULTS.md).", ""]
    return "\n".join(lines).rstrip() + "\n"


def block_markers(name: str) -> tuple[str, str]:
    """The (start, end) markers of the block ``--block name`` writes."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", name) or name == "lengths":
        raise SystemExit(f"--block {name!r}: a name of lowercase letters, digits, '.' and '-' (not 'lengths', the "
                         "generation block's)")
    return f"<!-- bench-{name}:start -->", f"<!-- bench-{name}:end -->"


def render_block(runs: list[dict], title: str | None = None, command: str | None = None, note: str | None = None
                 ) -> str:
    """Runs kept apart (``--block``): a heading (``title``, default "Results on DEVICE"), the command and the note
    once, then the suite's tables from the runs that have suite entries and the generation tables from those that
    have generation entries (each part dated and attributed by its own runs, the first given first), their
    headings one level down."""
    suite = merge([run for run in runs if _suite_entries(run)]) if any(map(_suite_entries, runs)) else None
    generation = [run for run in runs if report_lengths.has_results(run)]
    infos = [b.get("extra_info", {}) for run in runs for b in run["benchmarks"]]
    devices = list(dict.fromkeys(str(x["device"]) for x in infos if "device" in x)) or ["?"]
    lines = [f"## {title or 'Results on ' + ', '.join(devices)}", ""]
    if command:
        lines += ["Produced by:", "", "```", command.strip("\n"), "```", ""]
    if note:
        lines += [note.strip("\n"), ""]
    parts = ["\n".join(lines)]
    if suite is not None:
        parts.append(render(suite, level=3))
    if generation:
        parts.append(report_lengths.render(merge(generation), level=3))
    return "\n".join(parts).rstrip() + "\n"


def update_readme(readme: Path, text: str, start: str = START, end: str = END) -> None:
    """Replace the block between ``start`` and ``end`` of the file."""
    content = readme.read_text()
    if start not in content or end not in content:
        raise SystemExit(f"{readme} has no {start} ... {end} block to replace")
    head, rest = content.split(start, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{start}\n{text}{end}{tail}")


def write_blocks(path: Path, blocks: list[tuple[str, str, str]], append: bool = False) -> None:
    """Each (start, end, text) replaces its block of ``path``; with ``append`` a block the file lacks (or a file
    that does not exist) is added at its end, else that is an error."""
    for start, end, text in blocks:
        content = path.read_text() if path.exists() else ""
        if append and (start not in content or end not in content):
            path.write_text(f"{content}{chr(10) if content else ''}{start}\n{text}{end}\n")
        else:
            update_readme(path, text, start, end)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path, nargs="+", help="pytest-benchmark JSON (--benchmark-json); several: "
                                                           "one report of their runs together (a later run's "
                                                           "generation entry replaces an earlier one's of its case)")
    parser.add_argument("-o", "--output", type=Path, help="write the markdown here (default: print it)")
    parser.add_argument("--readme", type=Path, help="also replace the bench blocks of this README")
    parser.add_argument("--docs", type=Path, action="append", default=[],
                        help="also replace the generation block (bench-lengths) of this page (repeatable)")
    parser.add_argument("--command", help="the command that produced the JSON, shown above the tables")
    parser.add_argument("--note", help="a remark shown above the tables (e.g. how long the run took)")
    parser.add_argument("--block", metavar="NAME", help="this run on its own: all its tables in the block "
                        "<!-- bench-NAME:start --> ... of --output (not --readme / --docs)")
    parser.add_argument("--title", help="with --block: its heading (default: Results on DEVICE)")
    args = parser.parse_args(argv)
    if args.block and (args.readme or args.docs):
        parser.error("--block writes its own block of --output only; link it from a README or page by hand")
    if args.title and not args.block:
        parser.error("--title is the heading of a --block")
    if args.block:
        start, end = block_markers(args.block)
        text = render_block([load(path) for path in args.json], args.title, args.command, args.note)
        if args.output:
            write_blocks(args.output, [(start, end, text)], append=True)
        else:
            print(text, end="")
        return
    data = load(*args.json)
    full, readme = [], []  # (start, end, markdown) of the blocks this JSON has results for
    if _suite_entries(data):
        full.append((START, END, render(data, args.command, note=args.note)))
        readme.append((START, END, render(data, args.command, compact=True, level=3, note=args.note)))
    if report_lengths.has_results(data):
        full.append((report_lengths.START, report_lengths.END,
                     report_lengths.render(data, args.command, args.note)))
        readme.append((report_lengths.START, report_lengths.END,
                       report_lengths.render(data, args.command, args.note, level=3)))
    if args.output:
        write_blocks(args.output, full, append=True)
    else:
        print("".join(text for _, _, text in full), end="")
    if args.readme:
        write_blocks(args.readme, readme)
    for page in args.docs:
        write_blocks(page, [block for block in readme if block[0] == report_lengths.START])


if __name__ == "__main__":
    main()
