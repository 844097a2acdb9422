"""Attributions for a whole corpus: ``normx attribute`` / :func:`attribute_dataset`.

The input is streamed (:mod:`normx.data.rows`) and cut into shards of ``shard_size`` consecutive rows; shard ``k``
holds rows ``k * shard_size ...``. Each shard is explained in batches bucketed by length under a token budget
(``max_tokens`` padded tokens per forward pass: padding waste is the main cost on mixed lengths), put back in input
order and written as one Parquet file, atomically (a temporary name, then a rename). A shard whose file exists is
done: a run killed midway and started again into the same folder redoes only the unfinished shards, and a finished
run adds nothing.

Under ``torchrun`` or ``accelerate launch`` (``WORLD_SIZE`` > 1) each process takes the shards ``k`` with
``k % world_size == rank`` and writes them; the files are the same as one process writes. ``_manifest.json``
records the model, method and settings, the data file's size and sha256, row and shard counts and the normx version;
a run into a folder made with other settings or other data is refused (:mod:`~normx.bulk.manifest`). Its name starts
with ``_``, which Parquet readers skip, so that ``pandas.read_parquet(out)`` and ``pyarrow.dataset.dataset(out)``
read the shards alone. A run with a larger ``limit`` (or none) than the folder's goes on from where the smaller one
stopped: the shard it left short is completed, its rows kept.

A row that cannot be explained (an empty or invisible-only text, a missing pair, bytes that are not UTF-8, a
malformed line) does not stop the run: it is written with its reason in ``error`` (``file:line`` for what could not
be read) and empty tokens and scores, and counted in the run's summary and the manifest. A row's warnings (a text
truncated to the model's limit, unknown pieces) name the row by its id, in its ``warnings`` column and on the
terminal (the first :data:`SHOWN` of a process).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from normx._version import __version__
from normx.bulk import manifest, processes
from normx.bulk.manifest import MANIFEST, OLD_MANIFEST
from normx.core.concurrency import tokenizer_lock
from normx.core.inputs import check_text, token_budget_batches
from normx.data.rows import Row, _pyarrow_parquet, iter_rows
from normx.errors import InputWarning, InvalidInputError, NormxError
from normx.explanations.explain import explain
from normx.models.identity import model_identity

SHOWN = 20  # row warnings a process shows on the terminal; the rest are in the warnings column only
# padded tokens per forward pass by default; measured on MiniLM, 2 CPU cores (README "Large datasets"): 1024-2048
# is fastest there, 8192 no faster than fixed batches of 32
CPU_TOKENS, ACCELERATOR_TOKENS = 2048, 16384


@dataclass
class AttributionRun:
    """What one call did: rows read, shards written by this process and skipped as already done, tokens, time."""

    out: Path
    rows: int = 0
    shards: int = 0
    written: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    extended: list[int] = field(default_factory=list)  # written shards that kept the rows a smaller limit had done
    tokens: int = 0
    seconds: float = 0.0
    rank: int = 0
    world_size: int = 1
    rows_explained: int = 0
    errors: int = 0  # rows this process wrote with an error instead of scores
    warned: int = 0  # rows this process explained with warnings

    def summary(self) -> str:
        rate = f"{self.rows_explained / self.seconds:.1f} texts/s, {self.tokens / self.seconds:.0f} tokens/s" \
            if self.seconds > 0 and self.written else "nothing to do"
        failed = f"; {self.errors} rows could not be explained (their reason is in the error column)" \
            if self.errors else ""
        failed += f"; {self.warned} rows were explained with warnings (the warnings column)" if self.warned else ""
        kept = f" ({len(self.extended)} completing shards a smaller --limit had left short)" if self.extended else ""
        return (f"normx attribute: {self.rows} rows in {self.shards} shards; this process (rank {self.rank} of "
                f"{self.world_size}) wrote {len(self.written)}{kept}, found {len(self.skipped)} done; {rate}{failed}")


def attribute_dataset(model, tokenizer, source, out, *, method: str = "normxlogit", target=None, layer=None,
                      text_column: str | None = None, pair_column: str | None = None, limit: int | None = None,
                      shard_size: int = 1000, max_tokens: int | None = None, batch_size: int | None = None,
                      progress: bool = True, **options) -> AttributionRun:
    """Explain every row of ``source`` into Parquet shards in ``out`` (see the module docstring).

    ``max_tokens``: padded tokens per forward pass, rows bucketed by length (default: 2048 for a model on CPU,
    where bigger batches run no faster; 16384 on an accelerator); ``batch_size``: instead, fixed batches of that
    many rows in input order (no bucketing). ``method``, ``target``, ``layer`` and ``options``
    as :func:`normx.explain`. ``limit``: the first rows only; a later run into the same folder may raise it or
    drop it (and goes on from there), not lower it. Returns an :class:`AttributionRun`; the rows are read back with
    ``datasets.load_dataset("parquet", data_files=f"{out}/shard-*.parquet")`` or pandas.
    """
    parquet = _pyarrow_parquet()
    settings = manifest.check_run(source, out, method=method, target=target, layer=layer, text_column=text_column,
                                  pair_column=pair_column, limit=limit, shard_size=shard_size, max_tokens=max_tokens,
                                  batch_size=batch_size, **options)
    settings["model"] = model_identity(model)
    if max_tokens is None:
        max_tokens = CPU_TOKENS if next(model.parameters()).device.type == "cpu" else ACCELERATOR_TOKENS
    folder = Path(out).expanduser()
    job = _Job(method, target, layer, options, max_tokens, batch_size)
    created = processes.join(model)
    try:
        rows = _shards(iter_rows(source, text_column, pair_column, limit, errors="record"), shard_size)
        return _run(model, tokenizer, rows, folder, job, settings, parquet, progress)
    finally:
        if created:
            processes.leave()


@dataclass(frozen=True)
class _Job:
    """What each batch is explained with."""

    method: str
    target: object
    layer: object
    options: dict
    max_tokens: int
    batch_size: int | None


def _run(model, tokenizer, shards: Iterator[list[Row]], folder: Path, job: _Job, settings: dict, parquet,
         progress: bool) -> AttributionRun:
    rank, world = processes.rank_and_world()
    folder.mkdir(parents=True, exist_ok=True)
    _check_manifest(folder, settings, rank)
    run = AttributionRun(folder, rank=rank, world_size=world)
    started = time.perf_counter()
    bar = _progress(progress and rank == 0)
    for index, rows in enumerate(shards):
        run.rows += len(rows)
        run.shards = index + 1
        if index % world != rank:
            continue
        file = folder / f"shard-{index:05d}.parquet"
        kept = _kept(parquet, file, rows)
        if kept is None:
            run.skipped.append(index)
            continue
        records, tokens = _explain_shard(model, tokenizer, rows[len(kept):], job)
        _write_atomically(parquet, _uniform(kept + records), file)
        _tell(run, records)
        run.errors += sum(record["error"] is not None for record in records)
        run.written.append(index)
        if kept:
            run.extended.append(index)
        run.tokens += tokens
        run.rows_explained += len(records)
        if bar is not None:
            bar.update(len(rows))
            elapsed = max(time.perf_counter() - started, 1e-9)
            bar.set_postfix_str(f"{run.rows_explained / elapsed:.1f} texts/s, {run.tokens / elapsed:.0f} tokens/s")
    if bar is not None:
        bar.close()
    run.seconds = time.perf_counter() - started
    _finish(folder, settings, run, parquet)
    return run


# ---- the work of one shard -------------------------------------------------------------------------------------------

def _kept(parquet, file: Path, rows: list[Row]) -> list[dict] | None:
    """The records a shard's file holds of its first rows, to be kept (a run with a smaller limit wrote it); []
    without a file; None when the file holds all of them (the shard is done)."""
    if not file.exists():
        return []
    count = parquet.ParquetFile(file).metadata.num_rows
    if count == len(rows):
        return None
    records = parquet.read_table(file).to_pylist() if count < len(rows) else []
    if [r.get("id") for r in records] != [row.id for row in rows[:count]] or not records:
        raise InvalidInputError(f"{file} holds {count} rows, not the first of the {len(rows)} rows "
                                f"{rows[0].id}..{rows[-1].id} this run puts there; remove the folder to start again")
    return records


def _tell(run: AttributionRun, records: list[dict]) -> None:
    """The rows' warnings on the terminal (as :class:`InputWarning`), the first :data:`SHOWN` of this process."""
    for record in records:
        if not record["warnings"]:
            continue
        run.warned += 1
        if run.warned <= SHOWN:
            for message in record["warnings"]:
                warnings.warn(message, InputWarning, stacklevel=2)
        if run.warned == SHOWN:
            warnings.warn(f"more rows may have warnings; this process shows the first {SHOWN}, the others are in "
                          "their warnings column", InputWarning, stacklevel=2)


def _shards(rows: Iterator[Row], size: int) -> Iterator[list[Row]]:
    shard: list[Row] = []
    for row in rows:
        shard.append(row)
        if len(shard) == size:
            yield shard
            shard = []
    if shard:
        yield shard


def batches(lengths: Sequence[int], max_tokens: int, batch_size: int | None = None) -> list[list[int]]:
    """Row indices grouped into batches: fixed ``batch_size`` rows in order, or bucketed by length
    (:func:`normx.core.inputs.token_budget_batches`)."""
    if batch_size is not None:
        return [list(range(i, min(i + batch_size, len(lengths)))) for i in range(0, len(lengths), batch_size)]
    return token_budget_batches(lengths, max_tokens)


def _lengths(tokenizer, rows: list[Row]) -> list[int]:
    texts = [r.text for r in rows]
    pairs = [r.text_pair for r in rows] if rows[0].text_pair is not None else None
    with tokenizer_lock(tokenizer):
        return [len(ids) for ids in tokenizer(texts, pairs, truncation=False)["input_ids"]]


def _problem(row: Row) -> str | None:
    """Why ``row`` cannot be explained (as read, or its texts), or None."""
    if row.error is not None:
        return row.error
    try:
        check_text(row.text, f"row {row.id}'s text")
        if row.text_pair is not None:
            check_text(row.text_pair, f"row {row.id}'s second text")
    except NormxError as exc:
        return str(exc)
    return None


def _explain_shard(model, tokenizer, rows: list[Row], job: _Job) -> tuple[list[dict], int]:
    records: list[dict | None] = [None] * len(rows)
    good = []
    for i, row in enumerate(rows):
        problem = _problem(row)
        if problem is None:
            good.append(i)
        else:
            records[i] = _failed(row, problem)
    lengths = _lengths(tokenizer, [rows[i] for i in good]) if good else []
    for batch in batches(lengths, job.max_tokens, job.batch_size):
        chosen = [good[j] for j in batch]
        try:
            results = _explain_rows(model, tokenizer, [rows[i] for i in chosen], job)
        except NormxError:  # a row the checks above let through: each row alone, so that only it fails
            results = []
            for i in chosen:
                try:
                    results += _explain_rows(model, tokenizer, [rows[i]], job)
                except NormxError as exc:
                    results.append(exc)
        for i, explanation in zip(chosen, results):
            records[i] = _failed(rows[i], _named(str(explanation), 0, rows[i].id, always=False)) \
                if isinstance(explanation, Exception) else _record(rows[i], *explanation)
    return _uniform(records), sum(lengths)


def _explain_rows(model, tokenizer, rows: list[Row], job: _Job) -> list[tuple]:
    """(explanation, its warnings naming the row by its id) for each row, explained together; the input warnings
    explain raises (which name a row by its place in the batch) are left to :func:`_tell`, others pass on."""
    pairs = [r.text_pair for r in rows] if rows[0].text_pair is not None else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = explain(model, tokenizer, [r.text for r in rows], job.method, job.target, job.layer,
                          text_pair=pairs, batch_size=len(rows), **job.options)
    for warning in caught:
        if not issubclass(warning.category, InputWarning):
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return [(e, [_named(message, place, row.id) for message in e.warnings])
            for place, (row, e) in enumerate(zip(rows, results))]


def _named(message: str, place: int, row: int, always: bool = True) -> str:
    """A message about the text at ``place`` of a batch, said of the row: ``input 3 has ...`` -> ``row 1042 has
    ...``; other messages get ``row 1042:`` in front (``always=False``: are left as they are)."""
    batch = f"input {place} "
    if message.startswith(batch):
        return f"row {row} {message[len(batch):]}"
    return f"row {row}: {message}" if always else message


def _record(row: Row, e, warned: list[str]) -> dict:
    main = e.to_dict()
    record = {"id": row.id, "text": row.text, "text_pair": row.text_pair, "tokens": main["tokens"],
              "offsets": main["offsets"], "scores": main["scores"], "label": main["label"],
              "prediction": e.prediction, "probabilities": [
                  {"label": str(k), "probability": float(v)} for k, v in e.probabilities.items()],
              "warnings": warned, "error": None, "segments": list(e.segments),
              "special": list(e.special), "pooled": e.pooled, "layer": main["layer"], "method": e.method,
              "kind": e.kind, "family": e.family, "regression": e.regression}
    if len(e.labels) > 1 or len(e.layers) > 1:  # every label and layer asked for
        record["labels"] = list(e.labels)
        record["layers"] = list(e.layers)
        record["scores_by_label_layer"] = e.scores.tolist()
    return record


def _failed(row: Row, reason: str) -> dict:
    """The record of a row that could not be explained: its texts and the reason, nothing else."""
    return {"id": row.id, "text": row.text, "text_pair": row.text_pair, "tokens": [], "offsets": [], "scores": [],
            "label": None, "prediction": None, "probabilities": [], "warnings": [], "error": reason, "segments": [],
            "special": [], "pooled": None, "layer": None, "method": None, "kind": None, "family": None,
            "regression": None}


def _uniform(records: list[dict]) -> list[dict]:
    """Every record with the same fields (Parquet takes its columns from the first record): the multi-label /
    layer fields empty where a record has none."""
    if any("labels" in r for r in records):
        for r in records:
            for key in ("labels", "layers", "scores_by_label_layer"):
                r.setdefault(key, [])
    return records


def _write_atomically(parquet, records: list[dict], file: Path) -> None:
    import pyarrow as pa

    table = pa.Table.from_pylist(records)
    temporary = file.with_name(f".{file.name}.tmp-{os.getpid()}")
    parquet.write_table(table, temporary)
    os.replace(temporary, file)  # a shard file is either whole or absent


# ---- the run: manifest, progress -------------------------------------------------------------------------------------

def _check_manifest(folder: Path, settings: dict, rank: int) -> None:
    """Refuse a folder made with other settings (:func:`normx.bulk.manifest.differences`, the model included); record
    this run's settings (a raised limit, the data's new spelling) and that it is not complete."""
    file = folder / MANIFEST
    old = folder / OLD_MANIFEST
    if old.exists() and not file.exists() and rank == 0:  # a folder from before the rename: resumed as it is
        os.replace(old, file)
    processes.barrier()
    stored = manifest.read(folder)
    if stored:
        manifest.refuse(folder, manifest.differences(stored.get("settings", {}), settings))
    processes.barrier()  # every process has read it before it changes
    if rank == 0 and stored.get("settings") != manifest.plain(settings):
        manifest.write(file, {"settings": settings, "complete": False})


def _finish(folder: Path, settings: dict, run: AttributionRun, parquet) -> None:
    processes.barrier()
    if run.rank != 0:
        return
    files = sorted(folder.glob("shard-*.parquet"))
    rows = {f.name: parquet.ParquetFile(f).metadata.num_rows for f in files}
    manifest.write(folder / MANIFEST, {
        "settings": settings, "complete": len(files) == run.shards and sum(rows.values()) == run.rows,
        "rows": run.rows, "shards": run.shards, "rows_per_shard": rows, "errors": _errors(parquet, files),
        "normx": __version__,
        "world_size": run.world_size, "written": time.strftime("%Y-%m-%dT%H:%M:%S")})


def _errors(parquet, files: list[Path]) -> int:
    """Rows written with an error, over every shard of the folder (whichever process wrote them)."""
    count = 0
    for file in files:
        if "error" in parquet.ParquetFile(file).schema_arrow.names:
            count += parquet.read_table(file, columns=["error"]).column("error").drop_null().length()
    return count


def _progress(enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(unit="text", desc="normx attribute", disable=None)
