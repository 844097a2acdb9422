"""``evaluate_context``: read every context with every method, score the readings by one code path, and keep each
finished context's record in ``out/contexts.jsonl`` (one whole JSON line each, with the settings it was measured
under), so that a run stopped midway, or run again with more methods or contexts, redoes only what is missing."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from normx.errors import InvalidInputError
from normx.evaluation.context.readings import (
    BASELINES,
    Prepared,
    baseline,
    forward_seconds,
    prepare,
    read_method,
    response_outcomes,
    score_context,
    timed,
)
from normx.evaluation.context.report import ContextReport
from normx.methods import get_method

DEFAULT_METHODS = ("normxlogit", "attention", "norm_attention", "gradient_x_input", "alti_logit", "attnlrp",
                   "leave_one_out", "contextcite@32", "random", "position")
RECORDS = "contexts.jsonl"


def label_options(label: str) -> dict:
    """The method and options a label names: ``NAME`` itself; ``NAME@N`` with ``n_ablations=N`` (ContextCite's
    estimator with N ablations: ``contextcite@32``); ``budgeted@B`` with ``budget=B`` (a number of forward passes or
    a named budget); ``NAME@response`` with ``scope="response"`` (one backward pass of the whole response for the
    gradient methods)."""
    name, _, tag = label.partition("@")
    if not tag:
        return {"method": name}
    if "budget" in get_method(name).options:  # budgeted@fast, budgeted@6: its budget
        from normx.methods.ablation.budgeted import budget_option

        return {"method": name, "budget": budget_option(tag)}
    if tag.isdigit() and int(tag) > 0:
        if "n_ablations" not in get_method(name).options:
            raise InvalidInputError(f"{label!r}: {name} takes no n_ablations (NAME@N is for the ablation methods)")
        return {"method": name, "n_ablations": int(tag)}
    if tag == "response":
        return {"method": name, "scope": "response"}
    raise InvalidInputError(f"{label!r}: a label is NAME, NAME@N (N ablations; budgeted@N / @fast: its budget) or "
                            "NAME@response")


def evaluate_context(model, tokenizer, examples: Sequence, methods: Sequence[str] = DEFAULT_METHODS, *,
                     method_options: Mapping[str, Mapping] | None = None,
                     scores: Mapping[str, Callable[[Prepared], np.ndarray]] | None = None, masks: int = 32,
                     seed: int = 0, max_new_tokens: int = 12, batch_size: int = 8, out=None, progress: bool = True,
                     settings: Mapping | None = None) -> ContextReport:
    """Each reading's LDS, top-1 / top-3 drops, evidence@1 / @3 and cost on ``examples``
    (:func:`normx.data.contexts.context_examples`).

    ``methods``: registered method names, the baselines ``random`` and ``position``, or labels with options in
    ``method_options`` (``{"cc": {"method": "contextcite", "n_ablations": 32}}``; without an entry, a label is read
    by :func:`label_options`: ``contextcite@32``, ``gradient_x_input@response``). ``scores``: readings computed
    elsewhere (``name -> function(prepared) -> scores [sources]``), timed and scored the same way. ``out``: a
    folder; finished contexts are kept in ``out/contexts.jsonl`` and reused by a later run with the same model
    settings (``settings``), masks, seed and response length."""
    from tqdm.auto import tqdm

    examples = list(examples)
    if not examples:
        raise InvalidInputError("no context examples given")
    if isinstance(masks, bool) or not isinstance(masks, int) or masks < 2:
        raise InvalidInputError(f"masks must be a whole number >= 2, got {masks!r}")
    supplied = dict(scores or {})
    options = {k: dict(v) for k, v in (method_options or {}).items()}
    plan = {}
    for name in methods:
        if name in supplied:
            raise InvalidInputError(f"{name!r} is both a method and supplied scores; give each name once")
        if name in BASELINES:
            continue
        chosen = dict(options[name]) if name in options else label_options(name)
        registered = chosen.pop("method", name)
        get_method(registered)  # an unknown name is said before any model runs
        plan[name] = (registered, chosen)
    readings = [*methods, *supplied]
    key = _key({**dict(settings or {}), "masks": masks, "seed": seed, "max_new_tokens": max_new_tokens})
    states = {name: _state(model, registered, chosen) for name, (registered, chosen) in plan.items()}
    reading_keys = {name: _key({"method": registered, **chosen, **states[name]})
                    for name, (registered, chosen) in plan.items()}
    folder = None if out is None else Path(out)
    lines = [] if folder is None else _whole_lines(folder / RECORDS)  # read once; each new record rewrites them
    known = _known(lines, key)
    records = []
    bar = tqdm(examples, desc="contexts", disable=not progress)
    for index, example in enumerate(bar):
        old = known.get(example.id)
        todo = [r for r in readings if old is None or r not in old["readings"]
                or old["readings"][r].get("key") != reading_keys.get(r)]  # read under other options or weights
        if old is not None and not todo:
            records.append(old)
            continue
        prepared = prepare(model, tokenizer, example, max_new_tokens, None if old is None else old["response_ids"])
        found, forwards = {}, {}
        for name in todo:
            bar.set_postfix_str(f"{example.id}: {name}")
            if name in BASELINES:
                found[name] = (baseline(name, prepared, seed, index), None)
            else:  # a plain forward just before each reading: the machine's load drifts less in between
                base = forward_seconds(model, prepared, repeats=1)
                if name in supplied:
                    found[name] = timed(lambda fn=supplied[name], p=prepared: fn(p))
                else:
                    registered, chosen = plan[name]
                    found[name] = timed(lambda r=registered, c=chosen, p=prepared:
                                        read_method(model, tokenizer, p, r, c))
                forwards[name] = base
        bar.set_postfix_str(f"{example.id}: masks")
        record = score_context(lambda keeps, p=prepared: response_outcomes(model, tokenizer, p, keeps, batch_size),
                               len(prepared.spans), example.evidence, found, masks, seed, old)
        record = {"key": key, "id": example.id, "kind": example.kind, "length": example.length,
                  "sources": len(prepared.spans), "evidence": list(example.evidence),
                  "prompt_tokens": prepared.prompt_length, "response_ids": prepared.response_ids,
                  "response": prepared.response, "forward_seconds": forward_seconds(model, prepared), **record,
                  "readings": {**(old or {}).get("readings", {}), **record["readings"]}}
        for name, base in forwards.items():
            record["readings"][name]["forward_seconds"] = base
        for name in todo:
            if name in reading_keys:
                record["readings"][name]["key"] = reading_keys[name]
        records.append(record)
        if folder is not None:
            lines.append(json.dumps(record, ensure_ascii=False))
            _write_whole(folder / RECORDS, lines)
    all_settings = {**dict(settings or {}), "masks": masks, "seed": seed, "max_new_tokens": max_new_tokens,
                    "methods": {name: {"method": r, **o, **states[name]} for name, (r, o) in plan.items()},
                    "supplied": list(supplied), "contexts": len(records)}
    return ContextReport(readings, records, all_settings)


def _state(model, registered: str, chosen: Mapping) -> dict:
    """What besides its options decides a method's scores on ``model`` (``Method.state``: the calibrated weights)."""
    method = get_method(registered)
    return {} if method.state is None else method.state(model, method.resolve_options(dict(chosen)))


def _whole_lines(file: Path) -> list[str]:
    """The lines of ``file`` that parse whole (a line cut short by a kill in an older version's append is dropped)."""
    lines = []
    if file.is_file():
        for line in file.read_text(encoding="utf-8").splitlines():
            try:
                json.loads(line)
            except ValueError:
                continue
            lines.append(line)
    return lines


def _write_whole(file: Path, lines: list[str]) -> None:
    """``lines`` as the file's content, replaced whole (a temporary file renamed over it): a run killed while writing
    leaves the file as it was, never a line cut short."""
    file.parent.mkdir(parents=True, exist_ok=True)
    temporary = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, file)


def _key(settings: Mapping) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _known(lines: list[str], key: str) -> dict[str, dict]:
    """The records among ``lines`` measured under ``key`` (the last line for an id wins); a record that lacks the
    fields of one is skipped."""
    found = {}
    for line in lines:
        record = json.loads(line)
        if isinstance(record, dict) and record.get("key") == key and {"id", "readings", "lds_log_p",
                                                                       "response_ids"} <= set(record):
            found[record["id"]] = record
    return found
