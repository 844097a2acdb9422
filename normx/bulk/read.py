"""Reading a folder written by ``normx attribute`` back: its rows as :class:`~normx.explanations.result.Explanation`
objects (lazily, shard by shard), and what the whole corpus says: per label, the tokens (or words) with the largest
total and mean attribution, with counts, streamed over the shards so that memory does not grow with the corpus."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from normx.bulk import manifest as folder_manifest
from normx.data.rows import _pyarrow_parquet
from normx.errors import InvalidInputError
from normx.explanations.result import Explanation

UNITS = ("token", "word")
SUMMARY_COLUMNS = ["tokens", "offsets", "scores", "label", "text", "text_pair", "segments", "special", "error",
                    "labels", "prediction", "scores_by_label_layer"]


def shard_files(folder) -> list[Path]:
    """The shard files of an ``attribute`` folder, in order; a clear error if there is no such folder or it has
    none."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise InvalidInputError(f"{path} " + ("is not a folder" if path.exists() else "does not exist")
                                + ": give the folder a normx attribute run wrote (its --out)")
    files = sorted(path.glob("shard-*.parquet"))
    if not files:
        raise InvalidInputError(f"{path} has no shard-*.parquet files: is it a folder written by normx attribute?")
    return files


def manifest(folder) -> dict:
    """The folder's manifest (``{}`` if it has none)."""
    return folder_manifest.read(folder)


def iter_records(folder, columns: list[str] | None = None, batch_size: int = 1024) -> Iterator[dict]:
    """Every row of every shard as a dict (only ``columns`` that the shard has, if given), one batch at a time."""
    parquet = _pyarrow_parquet()
    for file in shard_files(folder):
        handle = parquet.ParquetFile(file)
        names = handle.schema_arrow.names
        chosen = None if columns is None else [c for c in columns if c in names]
        for batch in handle.iter_batches(batch_size=batch_size, columns=chosen):
            yield from batch.to_pylist()


def load_attributions(folder, errors: str = "skip") -> Iterator[Explanation]:
    """The rows of an ``attribute`` folder as :class:`Explanation` objects, lazily, in id order within each shard.
    Rows written with an error (their ``error`` column says why) are skipped, or raise with ``errors="raise"``.
    Each explanation has the scores the folder holds: every label and layer when the run asked for them, else
    its main view; ``settings`` are the run's (from the manifest)."""
    if errors not in ("skip", "raise"):
        raise InvalidInputError(f"errors={errors!r} is not allowed; use 'skip' or 'raise'")
    settings = manifest(folder).get("settings", {})
    for record in iter_records(folder):
        if record.get("error"):
            if errors == "raise":
                raise InvalidInputError(f"row {record['id']} could not be explained: {record['error']}")
            continue
        yield explanation_of(record, settings)


def explanation_of(record: dict, settings: dict | None = None) -> Explanation:
    """One shard row as an :class:`Explanation` (see :func:`load_attributions`)."""
    tokens = list(record["tokens"])
    if record.get("scores_by_label_layer"):
        labels, layers = list(record["labels"]), [int(layer) for layer in record["layers"]]
        scores = np.asarray(record["scores_by_label_layer"], dtype=np.float32)
    else:
        labels, layers = [record["label"]], [int(record.get("layer") or 0)]
        scores = np.asarray([[[np.nan if v is None else v for v in record["scores"]]]], dtype=np.float32)
    segments = record.get("segments") or [0] * len(tokens)
    special = record.get("special") or [False] * len(tokens)
    regression = bool(record.get("regression"))
    return Explanation(
        text=record["text"], text_pair=record.get("text_pair"), tokens=tokens,
        offsets=[tuple(o) for o in record["offsets"]], segments=list(segments), special=[bool(s) for s in special],
        scores=scores.reshape(len(labels), len(layers), len(tokens)), labels=labels, layers=layers,
        prediction=float(record["prediction"]) if regression else record["prediction"],
        probabilities={p["label"]: float(p["probability"]) for p in record.get("probabilities") or []},
        method=record.get("method") or (settings or {}).get("method", ""), settings=dict(settings or {}),
        warnings=list(record.get("warnings") or []), kind=record.get("kind") or "sequence_classification",
        regression=regression, family=record.get("family") or "", pooled=record.get("pooled"))


@dataclass
class UnitStats:
    """One token (or word) under one label, over the corpus."""

    unit: str
    total: float
    count: int

    @property
    def mean(self) -> float:
        return self.total / self.count


@dataclass
class CorpusSummary:
    """Per explained label: every unit's total attribution and count over the rows (special tokens left out).
    ``top(label)`` ranks them by total, ``top(label, by="mean", min_count=5)`` by mean."""

    unit: str
    rows: int
    skipped: int  # rows with an error
    stats: dict[str, dict[str, UnitStats]] = field(default_factory=dict)  # label -> unit -> stats

    @property
    def labels(self) -> list[str]:
        return sorted(self.stats)

    def top(self, label: str, k: int = 20, by: str = "total", min_count: int = 1) -> list[UnitStats]:
        if by not in ("total", "mean"):
            raise InvalidInputError(f"by={by!r} is not allowed; use 'total' or 'mean'")
        if label not in self.stats:
            raise InvalidInputError(f"no rows explained label {label!r}; the labels are {self.labels}")
        chosen = [s for s in self.stats[label].values() if s.count >= min_count]
        return sorted(chosen, key=lambda s: (-getattr(s, by), s.unit))[:k]

    def to_dict(self, k: int = 20, min_count: int = 5) -> dict:
        def rows(items):
            return [{"unit": s.unit, "total": s.total, "mean": s.mean, "count": s.count} for s in items]

        return {"unit": self.unit, "rows": self.rows, "skipped": self.skipped,
                "labels": {label: {"by_total": rows(self.top(label, k)),
                                   "by_mean": rows(self.top(label, k, "mean", min_count))} for label in self.labels}}


def corpus_summary(folder, unit: str = "token") -> CorpusSummary:
    """What the corpus says, per explained label (the ``label`` column: the predicted one unless the run asked for
    another; a run that explained every label is read at the predicted one): for each token (``unit="word"``: each
    run of tokens with no space between them, as the text spells it), the sum of its scores over every row and how
    often it occurs. Special tokens are left out. Streamed over the shards."""
    summary = SummaryBuilder(unit)
    for record in iter_records(folder, SUMMARY_COLUMNS):
        summary.add(record)
    return summary.result()


class SummaryBuilder:
    """:func:`corpus_summary` one row at a time (``add``), for a reader that streams the rows for more than that
    (the HTML report builds both units' summaries in its one pass over the shards)."""

    def __init__(self, unit: str = "token"):
        if unit not in UNITS:
            raise InvalidInputError(f"unit={unit!r} is not allowed; use one of {UNITS}")
        self.unit, self.rows, self.skipped = unit, 0, 0
        self._totals: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))

    def units(self, record: dict) -> list:
        """The (unit, score) pairs of a row's predicted view that the summary counts."""
        return units_of(record, self.unit)

    def add(self, record: dict) -> None:
        """One shard row (with the :data:`SUMMARY_COLUMNS` it has)."""
        self.rows += 1
        if record.get("error"):
            self.skipped += 1
            return
        record = _predicted_view(record)
        table = self._totals[str(record["label"])]
        for name, value in self.units(record):
            entry = table[name]
            entry[0] += value
            entry[1] += 1

    def result(self) -> CorpusSummary:
        stats = {label: {name: UnitStats(name, total, count) for name, (total, count) in table.items()}
                 for label, table in self._totals.items()}
        return CorpusSummary(self.unit, self.rows, self.skipped, stats)


def _predicted_view(record: dict) -> dict:
    """A row whose run explained several labels (``target="all"``) summarised for its predicted label, at its last
    layer; other rows as they are (their main view)."""
    labels = record.get("labels") or []
    if len(labels) > 1 and record.get("prediction") in labels and record.get("scores_by_label_layer"):
        return {**record, "label": record["prediction"],
                "scores": record["scores_by_label_layer"][labels.index(record["prediction"])][-1]}
    return record


def units_of(record: dict, unit: str = "token") -> Iterator[tuple[str, float]]:
    """(unit, score) of one row's main view, special tokens left out; words join tokens whose character spans touch
    (in the same text of a pair) and sum their scores."""
    tokens, scores = record["tokens"], record["scores"]
    special = record.get("special") or [False] * len(tokens)
    if unit == "token":
        for token, score, is_special in zip(tokens, scores, special):
            if not is_special and score is not None:
                yield token, float(score)
        return
    texts = {0: record["text"], 1: record.get("text_pair") or ""}
    segments = record.get("segments") or [0] * len(tokens)
    word, total = None, 0.0  # (segment, start, end) of the word being read, and its score so far
    for (start, end), score, is_special, segment in zip(record["offsets"], scores, special, segments):
        if is_special or score is None or end <= start or segment not in texts:
            continue
        if word is not None and word[0] == segment and word[2] == start:
            word, total = (segment, word[1], end), total + float(score)
            continue
        if word is not None:
            yield texts[word[0]][word[1]:word[2]], total
        word, total = (segment, start, end), float(score)
    if word is not None:
        yield texts[word[0]][word[1]:word[2]], total
