"""The manifest of a corpus run's folder (``_manifest.json``) and whether a run may go on in a folder.

The manifest records the run's settings: the model's identity, method, target, layer and options, the data (the
source as given, and the file's size and sha256: :func:`normx.data.rows.fingerprint`), columns, limit and shard size.
A run into a folder whose manifest records other settings is refused, naming each difference; the data are compared
by content, not by path (the same file under another spelling of its path is the same data, a file whose rows were
replaced is not). The limit may grow or be dropped (the rows done are kept and the run goes on from where the
smaller one stopped), not shrink: a smaller limit than the folder's is refused.

:func:`check_run` makes every check that needs no model (the arguments, the data file's columns, the folder's
manifest but for the model's identity), so that the command line refuses before it loads the model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from normx.core.inputs import positive_int
from normx.data.rows import check_source, fingerprint, iter_rows
from normx.errors import InvalidInputError
from normx.models.identity import describe

MANIFEST = "_manifest.json"  # "_": Parquet readers skip it when they read the folder
OLD_MANIFEST = "manifest.json"  # folders written before normx named it so are still resumed


def check_run(source, out, *, method: str = "normxlogit", target=None, layer=None, text_column: str | None = None,
              pair_column: str | None = None, limit: int | None = None, shard_size: int = 1000,
              max_tokens: int | None = None, batch_size: int | None = None, **options) -> dict:
    """What can be checked of a run of :func:`~normx.bulk.attribute.attribute_dataset` without its model: the numbers
    given, the data file (readable, with the columns asked for), and that ``out``'s manifest, if any, allows this
    run (all but the model). Raises :class:`InvalidInputError` naming what is wrong; returns the run's settings,
    ``model`` None."""
    for value, name in ((limit, "limit"), (max_tokens, "max_tokens"), (batch_size, "batch_size")):
        positive_int(value, name, none=True)
    positive_int(shard_size, "shard_size")
    if fingerprint(source) is not None:  # a file: its columns are read now (a hub dataset is read when the run starts)
        next(iter_rows(source, text_column, pair_column, limit=1, errors="record"), None)
    else:
        check_source(source)
    settings = {"model": None, "method": method, "target": target, "layer": layer, "options": options,
                "source": str(source), "data": fingerprint(source), "text_column": text_column,
                "pair_column": pair_column, "limit": limit, "shard_size": shard_size}
    stored = read(out)
    if stored:
        refuse(out, differences(stored.get("settings", {}), settings, model=False))
    return settings


def read(folder) -> dict:
    """The folder's manifest (``{}`` if it has none, or no folder)."""
    path = Path(folder).expanduser()
    for name in (MANIFEST, OLD_MANIFEST):
        if (path / name).is_file():
            try:
                data = json.loads((path / name).read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:
                raise InvalidInputError(f"{path / name} is not a manifest normx wrote ({exc}); remove the folder "
                                        "to start again") from None
            if not isinstance(data, dict) or not isinstance(data.get("settings", {}), dict):
                raise InvalidInputError(f"{path / name} is not a manifest normx wrote (not a JSON object with "
                                        "settings); remove the folder to start again")
            return data
    return {}


def write(file: Path, data: dict) -> None:
    """The manifest written whole (a temporary name, then a rename)."""
    temporary = file.with_name(f".{file.name}.tmp-{os.getpid()}")
    temporary.write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(temporary, file)


def plain(settings: dict) -> dict:
    """The settings as the manifest stores them (JSON)."""
    return json.loads(json.dumps(settings, default=str))


def refuse(folder, problems: list[str]) -> None:
    if problems:
        raise InvalidInputError(f"{Path(folder).expanduser()} holds shards made with other settings: "
                                f"{'; '.join(problems)}. Use another --out folder, or remove this one to start again")


def differences(stored: dict, settings: dict, model: bool = True) -> list[str]:
    """What keeps a run with ``settings`` from going on in a folder made with ``stored``, each said with both values
    (the model's identity left out with ``model=False``)."""
    now = plain(settings)
    problems = _data(stored, now) + _limit(stored.get("limit"), now["limit"])
    for key in sorted(now):
        if key in ("source", "data", "limit") or (key == "model" and not model):
            continue
        was, given = stored.get(key), now[key]
        if key == "model" and not isinstance(was, dict):  # a folder from before identities: its name only
            given = given["name"]
        if was != given:
            problems.append(f"its model is {describe(was)}, this run's is {describe(given)}" if key == "model"
                            else f"{key} was {was!r}, now {given!r}")
    return problems


def _limit(was, now) -> list[str]:
    if now is None or (was is not None and now >= was):
        return []
    return [f"limit was {'none (every row)' if was is None else was}, now {now}: a resume may raise the limit or "
            "drop it (--limit left out: every row), not lower it"]


def _data(stored: dict, now: dict) -> list[str]:
    """The data compared by content where both runs read a file (by path for a folder from before fingerprints, by
    name for a hub dataset)."""
    was_source, source = stored.get("source"), now["source"]
    if "data" not in stored:  # a folder from before data fingerprints
        same = was_source == source or (was_source is not None and _resolved(was_source) == _resolved(source))
        return [] if same else [f"source was {was_source!r}, now {source!r}"]
    was, data = stored["data"], now["data"]
    if was is None or data is None:
        return [] if (was, was_source) == (data, source) else [f"source was {was_source!r}, now {source!r}"]
    if was == data:
        return []
    if not isinstance(was, dict) or was.get("bytes") != data["bytes"]:
        return [f"the data differ: {was_source} had {_content(was)}, {source} has {_content(data)}"]
    return [f"the data differ: {was_source} and {source} both have {data['bytes']:,} bytes but other content "
            f"(sha256 {_content(was, size=False)} then, {_content(data, size=False)} now)"]


def _content(data, size: bool = True) -> str:
    data = data if isinstance(data, dict) else {}
    digest = f"{str(data.get('sha256'))[:12]}..."
    if not size:
        return digest
    count = data.get("bytes")
    return f"{count:,} bytes (sha256 {digest})" if isinstance(count, int) else f"unknown content ({data!r})"


def _resolved(source: str) -> Path:
    return Path(source).expanduser().resolve()
