"""What is known of transformers' architectures: the verdict of each (verified, refused with the reason, or
failing in transformers on a tiny config), measured by ``python -m studies.coverage.architectures`` and shipped as
``coverage.json`` beside this module. The counts the README, docs/supported.md and ``normx supported`` give are all
computed here (:func:`architecture_rows`, :func:`counts`, :func:`summary_sentence`), from that file alone: one row
per architecture class and head, its model types merged, one verdict each; docs/supported.md is :func:`markdown`.

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
HEAD_TITLES = {"causal_lm": "causal LM", "masked_lm": "masked LM", "sequence_classification": "sequence classification"}
VERIFIED, REFUSED, FAILS, WRONG = "verified", "refused", "transformers fails", "wrong scores"
NOT_MEASURED = "not yet measured"
DETAIL_CHARACTERS = 240  # a failure's message is shortened to this, at a word


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


# a class whose model types got different verdicts takes the first of these it got: normx's own verdicts before
# transformers' failures (a class that builds under one model type is judged by normx there), the worse first
_PRECEDENCE = (WRONG, REFUSED, VERIFIED, NOT_MEASURED, FAILS)


def grouped(rows: list[dict]) -> list[dict]:
    """One row per architecture class and head (a class several model types map to, such as LlamaForCausalLM, is
    listed once), with ``model_types``. A class whose model types got different verdicts gets one verdict, by
    :data:`_PRECEDENCE` (Llama4ForCausalLM: refused under ``llama4_text``, where it builds; transformers fails under
    ``llama4``), and a detail that names each model type's verdict."""
    out: dict[tuple, list[dict]] = {}
    for row in rows:
        out.setdefault((row["class"], row["head"]), []).append(row)
    merged = []
    for members in out.values():
        verdicts = {row["verdict"] for row in members}
        verdict = min(verdicts, key=lambda v: _PRECEDENCE.index(v) if v in _PRECEDENCE else len(_PRECEDENCE))
        first = next(row for row in members if row["verdict"] == verdict)
        detail = first["detail"] if len(verdicts) == 1 else "; ".join(
            f"{row['model_type']}: {row['verdict']} ({row['detail']})" for row in members)
        merged.append({**first, "verdict": verdict, "detail": detail,
                       "model_types": [row["model_type"] for row in members]})
    return merged


def architecture_rows(table: dict | None = None) -> list[dict]:
    """The table's architectures, one row per class and head (:func:`grouped`), sorted: what every count counts."""
    table = coverage() if table is None else table
    return sorted(grouped(table["architectures"]), key=lambda r: (r["verdict"] == FAILS, r["class"], r["head"]))


def counts(rows: list[dict] | None = None) -> dict:
    """``{"verified", "refused", "wrong scores", "transformers fails", "built", "share", "heads": {head: {verdict:
    n}}}`` over :func:`architecture_rows`: *built* are the architectures transformers builds and runs (all but
    *transformers fails*), *share* the verified fraction of them."""
    rows = architecture_rows() if rows is None else rows
    total = {verdict: sum(r["verdict"] == verdict for r in rows) for verdict in (VERIFIED, REFUSED, WRONG, FAILS)}
    built = len(rows) - total[FAILS]
    heads = {head: {verdict: sum(r["verdict"] == verdict and r["head"] == head for r in rows)
                    for verdict in (VERIFIED, REFUSED, WRONG, FAILS)} for head in HEADS}
    return {**total, "built": built, "share": total[VERIFIED] / max(1, built), "heads": heads}


def summary_sentence(numbers: dict | None = None) -> str:
    """The counts in one sentence (docs/supported.md, ``normx supported``; the README quotes its numbers)."""
    n = counts() if numbers is None else numbers
    return (f"{n[VERIFIED]} of {n['built']} architectures that build and run are verified ({100 * n['share']:.0f} %); "
            f"{n[REFUSED]} are refused with a reason; {n[WRONG]} give wrong scores; {n[FAILS]} fail in transformers "
            "on the shrunk config")


def shortened(text: str, limit: int = DETAIL_CHARACTERS) -> str:
    """``text`` on one line (its lines joined, runs of spaces made one), cut at a word when over ``limit``
    characters, with an ellipsis."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0] if " " in text[:limit] else text[:limit]
    return cut.rstrip(" ,;:") + " …"


def failure_detail(exc: BaseException) -> str:
    """An exception as a table's detail: its class and its whole message (every line, :func:`shortened`); never
    empty, never cut mid-word."""
    message = shortened(str(exc)) or shortened(str(exc.__cause__ or "")) or "(no message)"
    return f"{type(exc).__name__}: {message}"


def markdown(table: dict | None = None) -> str:
    """docs/supported.md, from the table alone (``python -m studies.coverage.architectures --docs`` writes it)."""
    table = coverage() if table is None else table
    rows, summary = architecture_rows(table), table["summary"]
    n = counts(rows)
    lines = [
        "# Supported architectures",
        "",
        f"Generated by `python -m studies.coverage.architectures` ({summary['date']}, transformers "
        f"{summary['transformers']}, {summary['seconds']} s) from `normx/models/coverage.json`, which `normx "
        "supported` prints. Every architecture transformers lists as a causal LM, a masked LM or a sequence "
        "classifier, built tiny from its own default config (2 layers, hidden size 64, vocabulary 512), one row per "
        "class and head (a class several model types map to is built under each and listed once): **verified** "
        "means its adapter (registered or discovered from its conventions) reproduced the model's own "
        "`hidden_states[0]`, block outputs and logits, and NormXLogit as a user gets it (`normx.explain` on two "
        "texts of different lengths, in one padded batch, through a word-level tokenizer) equals a reference read "
        "from the model as its user runs it: the plain `model(**tokenizer(text))` of each text alone, "
        "‖hidden_states[0]‖ × its logits (the figure in the last column: the largest difference as a fraction of "
        "the reference's scale); a model that can be a decoder or not (RoBERTa-family `*ForCausalLM`, XLM's "
        "`XLMWithLMHeadModel`) is built as one under the causal-LM head (`is_decoder` / `causal`), as its real "
        "checkpoints are; **refused** gives the reason normx refuses it; *transformers fails* means transformers "
        "itself cannot build or run the shrunk config (listed, not counted). A class whose model types got "
        "different verdicts is judged where it builds, its detail naming each.",
        "",
        f"**{summary_sentence(n).replace(' %);', ' %)**;', 1)}.",
        "",
        "| head | verified | refused | wrong scores | transformers fails |",
        "|---|---|---|---|---|",
    ]
    for head in HEADS:
        c = n["heads"][head]
        lines.append(f"| {HEAD_TITLES[head]} | {c[VERIFIED]} | {c[REFUSED]} | {c[WRONG]} | {c[FAILS]} |")
    lines += ["", "| architecture | head | verdict | detail |", "|---|---|---|---|"]
    for row in rows:
        detail = row["detail"].replace("|", "\\|")
        lines.append(f"| {row['class']} | {HEAD_TITLES[row['head']]} | {row['verdict']} | {detail} |")
    return "\n".join(lines) + "\n"
