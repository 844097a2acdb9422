"""A calibrated context method's fitted weights: one JSON file per model, keyed by the model's fingerprint
(:func:`normx.models.identity.model_identity`), written whole and checked when read.

The file holds the weights theta per feature family as [blocks][heads] lists of numbers ([1][1] for a per-source
family), the shape, the ridge's
lambda and outcome scaling, the cross-validated score they were chosen by, what they were trained on (a
description and the SHA-256 of the training data), the model's identity and the normx version, and ``sha256``: the
hash of everything else in it (canonical JSON), so that a file changed by hand or cut short is refused.

Where: ``<cache>/calibrated/<fingerprint>.json`` (the cache folder of :func:`normx.models.gguf_cache.cache_root`:
``$NORMX_CACHE``...), written by ``normx calibrate --store`` through a temporary file in the same folder renamed
into place (a reader never sees half a file); and the files presets ship (``normx/zoo/presets_data/<preset>/
calibrated.json``, found by the fingerprint inside them). A file is read only as a regular file (no symlink), at
most :data:`MAX_BYTES`, and every field is checked: a damaged or tampered file is a
:class:`~normx.errors.ModelLoadError` naming it and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import weakref
from pathlib import Path

from normx._version import __version__
from normx.errors import InvalidInputError, ModelLoadError
from normx.methods.calibrated.readings import FAMILIES, SCALAR
from normx.models.gguf_cache import cache_root
from normx.models.identity import model_identity
from normx.models.modules import unwrap_model

FORMAT = "normx-calibrated-context/1"
FILE = "calibrated.json"  # a preset's shipped weights, beside its other files
MAX_BYTES = 8 << 20
SHIPPED = Path(__file__).parent.parent.parent / "zoo" / "presets_data"  # normx/zoo/presets_data (package data)
_IDENTITIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (parameter signature, identity)
_FIELDS = ("format", "method", "model", "families", "shape", "weights", "lambda", "scaling", "cv_lds", "training",
           "normx_version")


def fingerprint(identity: dict) -> str:
    """The key of a model's weights file: its base weights' fingerprint (and its adapter's)."""
    weights, adapter = identity.get("weights"), identity.get("adapter")
    return f"{weights}-{adapter}" if adapter else str(weights)


def folder() -> Path:
    return cache_root() / "calibrated"


def digest(record: dict) -> str:
    """SHA-256 of the record without its ``sha256`` field, as canonical JSON."""
    body = {k: v for k, v in record.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def make_record(method: str, identity: dict, families, theta: dict, shape: tuple[int, int], lam: float,
                scaling: str, cv_lds: float, training: dict) -> dict:
    """The file's content for weights ``theta`` {family: array [blocks, heads]}."""
    record = {"format": FORMAT, "method": method, "model": dict(identity), "families": list(families),
              "shape": [int(shape[0]), int(shape[1])],
              "weights": {f: [[float(v) for v in row] for row in theta[f]] for f in families},
              "lambda": float(lam), "scaling": scaling, "cv_lds": float(cv_lds), "training": dict(training),
              "normx_version": __version__}
    record["sha256"] = digest(record)
    check(record, "the new weights")
    return record


def write(record: dict, path: Path) -> Path:
    """Write ``record`` to ``path`` whole: a temporary file in its folder, flushed, renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, 0o644)  # mkstemp's 0600 would hide a shipped or shared file from other users
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


def store(record: dict) -> Path:
    """Write ``record`` into the cache under its model's fingerprint; returns the file."""
    return write(record, folder() / f"{fingerprint(record['model'])}.json")


def read(path: Path) -> dict:
    """A weights file, checked (:func:`check`); :class:`ModelLoadError` naming the file otherwise."""
    path = Path(path)
    if path.is_symlink() or not path.is_file():
        raise ModelLoadError(f"{path} is not a regular file (calibrated weights are never read through a link)")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise ModelLoadError(f"{path} is {size} bytes; a calibrated weights file is at most {MAX_BYTES}")
    try:
        record = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:  # (JSONDecodeError; an integer of too many digits)
        raise ModelLoadError(f"{path} is not a calibrated weights file (not UTF-8 JSON: {exc})") from None
    except RecursionError:
        raise ModelLoadError(f"{path} is not a calibrated weights file (JSON nested too deep)") from None
    check(record, str(path))
    return record


def check(record, where: str) -> None:
    """Every field of a weights record as normx writes it, and its hash; :class:`ModelLoadError` otherwise."""
    def bad(what: str) -> ModelLoadError:
        return ModelLoadError(f"{where}: {what}; write it again with `normx calibrate`")

    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise bad(f"not a {FORMAT} record")
    missing = [k for k in (*_FIELDS, "sha256") if k not in record]
    if missing:
        raise bad(f"missing {', '.join(missing)}")
    if record["sha256"] != digest(record):
        raise bad("its content does not match its sha256 (changed or damaged)")
    shape, families, weights = record["shape"], record["families"], record["weights"]
    if (not isinstance(shape, list) or len(shape) != 2 or not all(isinstance(v, int) and v > 0 for v in shape)):
        raise bad(f"shape {shape!r} is not [blocks, heads]")
    if (not isinstance(families, list) or not families or any(f not in FAMILIES for f in families)
            or len(set(families)) != len(families)):
        raise bad(f"families {families!r} are not some of {FAMILIES}")
    if not isinstance(weights, dict) or set(weights) != set(families):
        raise bad("its weights are not one table per family")
    for family in families:
        table = weights[family]
        rows, cols = (1, 1) if family in SCALAR else shape
        if (not isinstance(table, list) or len(table) != rows
                or any(not isinstance(row, list) or len(row) != cols for row in table)):
            raise bad(f"the {family} weights are not {rows} x {cols}")
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
               for row in table for v in row):
            raise bad(f"the {family} weights hold a value that is not a finite number")
    model = record["model"]
    if not isinstance(model, dict) or not isinstance(model.get("weights"), str):
        raise bad("it names no model fingerprint")


def shipped(model) -> Path | None:
    """The weights file a preset ships for ``model`` (its fingerprint), or None."""
    found = _shipped(fingerprint(_identity(model)))
    return None if found is None else found[1]


def _shipped(key: str) -> tuple[dict, Path] | None:
    """(record, file) of the weights a preset ships for the model fingerprint ``key``, or None."""
    if SHIPPED.is_dir():
        for file in sorted(SHIPPED.glob(f"*/{FILE}")):
            record = read(file)
            if fingerprint(record["model"]) == key:
                return record, file
    return None


def find(model, method: str) -> tuple[dict, Path]:
    """The weights stored for ``model`` (its fingerprint): the cache's file (``normx calibrate --store``, which
    refuses to put one before a preset's shipped weights unless told to), else a preset's shipped one;
    :class:`InvalidInputError` naming ``normx calibrate`` when there are none."""
    identity = _identity(model)
    key = fingerprint(identity)
    cached = folder() / f"{key}.json"
    if cached.exists() or cached.is_symlink():
        return _matching(read(cached), identity, cached), cached
    found = _shipped(key)
    if found is not None:
        return _matching(found[0], identity, found[1]), found[1]
    raise InvalidInputError(
        f"{method} needs weights fitted to this model ({identity['name']}, fingerprint {key[:12]}), and none are "
        f"stored in {folder()} or shipped with a preset: fit them with `normx calibrate MODEL --data DIR --store` "
        "(or pass weights=FILE)")


def available(model) -> bool:
    """Whether :func:`find` has a weights file for ``model`` to read (stored in the cache, or shipped): the file is
    checked when it is read, not here."""
    key = fingerprint(_identity(model))
    cached = folder() / f"{key}.json"
    return cached.exists() or cached.is_symlink() or _shipped(key) is not None


def _identity(model) -> dict:
    """model_identity of the transformers model (inside a PEFT wrapper: the method reads that one, and a calibration
    stores under it), kept per model object while no parameter is replaced or changed in place (each tensor's storage
    and version counter are the signature): a call pays the fingerprint once, not on every explanation."""
    model = unwrap_model(model)
    signature = tuple((name, p.data_ptr(), p._version) for name, p in model.named_parameters())
    known = _IDENTITIES.get(model)
    if known is not None and known[0] == signature:
        return known[1]
    identity = model_identity(model)
    _IDENTITIES[model] = (signature, identity)
    return identity


def _matching(record: dict, identity: dict, path: Path) -> dict:
    if fingerprint(record["model"]) != fingerprint(identity):
        raise ModelLoadError(f"{path} holds weights fitted to model {fingerprint(record['model'])[:12]}, not to "
                             f"this model ({fingerprint(identity)[:12]})")
    return record
