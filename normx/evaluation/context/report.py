"""The report of a context evaluation: each context's record, and per reading (method, peer, baseline) its mean
LDS, top-k drops, evidence recall and cost with standard errors over the contexts, as JSON and a Markdown table."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from normx.evaluation.context.metrics import mean_and_error

COLUMNS = (("lds", "LDS ↑"), ("drop@1", "top-1 drop ↑"), ("drop@3", "top-3 drop ↑"), ("evidence@1", "evidence@1"),
           ("evidence@3", "evidence@3"), ("cost", "cost (× a forward)"))
MEASURES = ("lds", "drop@1", "drop@3", "logit_drop@1", "logit_drop@3", "evidence@1", "evidence@3", "cost", "seconds")


@dataclass
class ContextReport:
    """``records``: one dict per context (its example, response, outcomes and every reading's numbers);
    ``readings``: the names in table order; ``settings``: how it was run."""

    readings: list[str]
    records: list[dict]
    settings: dict = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, list[float]]]:
        """``summary[reading][measure] = [mean, standard error]`` over the contexts (cost: the reading's seconds over
        those of the plain forward pass run just before it, per context; none for the baselines)."""
        out = {}
        for name in self.readings:
            entries = [(r["readings"][name], r["forward_seconds"]) for r in self.records if name in r["readings"]]
            out[name] = {}
            for measure in MEASURES:
                if measure == "cost":
                    values = [e["seconds"] / e.get("forward_seconds", f) for e, f in entries
                              if e.get("seconds") is not None]
                else:
                    values = [e.get(measure) for e, _ in entries]
                out[name][measure] = list(mean_and_error([v for v in values if v is not None]))
            out[name]["contexts"] = len(entries)
        return out

    def table(self) -> str:
        """Readings × LDS / top-k drops (of the response's log-probability) / evidence recall / cost: mean ± s.e.
        over the contexts that reading was measured on (the last column)."""
        summary = self.summary()
        lines = ["| reading | " + " | ".join(title for _, title in COLUMNS) + " | contexts |",
                 "|---" * (len(COLUMNS) + 2) + "|"]
        for name in self.readings:
            cells = []
            for measure, _ in COLUMNS:
                mean, error = summary[name][measure]
                if math.isnan(mean):
                    cells.append("—")
                elif measure == "cost":
                    cells.append(f"{mean:.1f}")
                elif measure.startswith("evidence"):
                    cells.append(f"{mean:.2f}")
                else:
                    cells.append(f"{mean:.3f} ± {error:.3f}" if not math.isnan(error) else f"{mean:.3f}")
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {summary[name]['contexts']} |")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"readings": self.readings, "settings": self.settings, "summary": self.summary(),
                "records": self.records}

    def write(self, out) -> list[Path]:
        """``report.json`` and ``table.md`` (the table, the contexts counted, the command) in ``out``."""
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        report, table = folder / "report.json", folder / "table.md"
        _write_whole(report, json.dumps(self.to_dict(), ensure_ascii=False, indent=1))
        note = (f"\n\n{len(self.records)} contexts in all; LDS over {self.settings.get('masks')} held-out random "
                "masks; drops in the response's log-probability (nats); cost: wall time over one plain forward pass.\n")
        command = self.settings.get("command")
        _write_whole(table, self.table() + note + (f"\n`{command}`\n" if command else ""))
        return [report, table]


def _write_whole(file: Path, text: str) -> None:
    """Written to a temporary file and renamed: a reader finds the old file or the new one, never half of one."""
    partial = file.with_name(file.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(file)
