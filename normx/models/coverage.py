"""What is known of transformers' architectures: the verdict of each (verified, refused with the reason, or
failing in transformers on a tiny config), measured by ``bench/architecture_coverage.py`` and shipped as
``coverage.json`` beside this module (``normx supported`` prints it; docs/supported.md is the same table).

The table was measured with one transformers release; the installed one may list architectures it has never seen.
Those are *not yet measured* (:func:`not_measured`) — normx still checks any model against its own outputs the first
time it explains it, so an unmeasured architecture is explained exactly or refused, never silently wrong.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

FILE = Path(__file__).resolve().parent / "coverage.json"
HEADS = ("causal_lm", "masked_lm", "sequence_classification")
NOT_MEASURED = "not yet measured"


def coverage() -> dict:
    """``{"summary": {...}, "architectures": [{"class", "model_type", "head", "verdict", "detail"}, ...]}``."""
    return json.loads(FILE.read_text())


def installed_transformers() -> str | None:
    """The installed transformers' version (read without importing it), or None."""
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


MAPPINGS = {"causal_lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "masked_lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
            "sequence_classification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"}


def listed_architectures() -> list[tuple[str, str, str]]:
    """``(head, model_type, class)`` of every class the installed transformers' auto-model mappings list as a causal
    LM, a masked LM or a sequence classifier. Read from the source of transformers' ``modeling_auto`` (its mappings
    are literal tables), so that ``normx supported`` stays instant: importing it would import torch."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        return []
    source = Path(spec.origin).parent / "models" / "auto" / "modeling_auto.py"
    tables = {}
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in MAPPINGS.values() and isinstance(node.value, ast.Call) and node.value.args:
            tables[node.targets[0].id] = ast.literal_eval(node.value.args[0])
    out = []
    for head, name in MAPPINGS.items():
        for model_type, names in tables.get(name, []):
            for cls in (names,) if isinstance(names, str) else names:
                out.append((head, model_type, cls))
    return out


def not_measured(table: dict | None = None) -> list[tuple[str, str, str]]:
    """The installed transformers' architectures (:func:`listed_architectures`) that the table has no verdict for:
    added to transformers after the table was measured."""
    table = coverage() if table is None else table
    known = {(row["head"], row["model_type"], row["class"]) for row in table["architectures"]}
    return [entry for entry in listed_architectures() if entry not in known]


def unmeasured_rows(table: dict | None = None) -> list[dict]:
    """:func:`not_measured` as table rows, with the verdict :data:`NOT_MEASURED`."""
    return [{"class": name, "model_type": model_type, "head": head, "verdict": NOT_MEASURED,
             "detail": "listed by the installed transformers, not by the table; checked on first use like any model"}
            for head, model_type, name in not_measured(table)]


def grouped(rows: list[dict]) -> list[dict]:
    """One row per architecture class and head (a class several model types map to, such as LlamaForCausalLM, is
    listed once), with ``model_types``; a class whose model types got different verdicts keeps one row each."""
    out: dict[tuple, dict] = {}
    for row in rows:
        key = (row["class"], row["head"], row["verdict"])
        if key in out:
            out[key]["model_types"].append(row["model_type"])
        else:
            out[key] = {**row, "model_types": [row["model_type"]]}
    return list(out.values())
