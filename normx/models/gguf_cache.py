"""normx's cache folder and the converted GGUF models in it: each entry written whole, and proved when read.

An entry (``gguf/<content hash of the GGUF file>/``) is written into a staging folder next to it
(``.staging-<hash>-<pid>-<random>@<host>``, unique per process) and renamed into place when complete, so a reader
never sees half an entry and two converters never delete each other's work: the one whose rename finds the entry
already there uses that entry (after checking it) and drops its own. The last file written is ``normx-gguf.json``:
what the entry was made from and its manifest, every file's size and SHA-256.

Reading an entry checks it against its manifest: the files and their sizes every time, their SHA-256 once per
process per entry (again whenever a file's size, date or inode changes), or on every load with
``NORMX_CACHE_VERIFY=always``. A file missing, added, resized or changed is a damaged entry (:func:`entry_problem`
says how). Staging folders left by a conversion that was killed (its process gone, or older than
:data:`STALE_SECONDS`) are removed by the next conversion (:func:`remove_stale`).

The cache folder is ``$NORMX_CACHE``, else ``$XDG_CACHE_HOME/normx``, else ``~/.cache/normx``; ``normx cache``
lists it (:func:`cache_entries`) and empties it (:func:`clear_cache`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from normx.errors import ModelLoadError

INFO = "normx-gguf.json"  # what the entry was made from and its manifest (written last)
VERIFY_ENV = "NORMX_CACHE_VERIFY"  # "always": hash every file of an entry on every load
STALE_SECONDS = 3600  # a staging folder untouched this long is abandoned, whatever its process
CLEAR_HINT = "`normx cache --clear` empties the cache"
_CHUNK = 1 << 22
_proved: set[tuple] = set()  # (folder, the files' stat signature) whose hashes matched in this process


def cache_root() -> Path:
    """Where normx keeps what it builds once: ``$NORMX_CACHE``, else ``$XDG_CACHE_HOME/normx``, else
    ``~/.cache/normx``."""
    given = os.environ.get("NORMX_CACHE")
    if given:
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "normx"


def entry_folder(digest: str) -> Path:
    return cache_root() / "gguf" / digest


def read_info(folder: Path) -> dict:
    """An entry's ``normx-gguf.json``: a :class:`ModelLoadError` naming the file and what is wrong with it when it
    is missing, not JSON, or not the shape normx writes."""
    file = folder / INFO
    if file.is_symlink() or not file.is_file():
        raise ModelLoadError(f"{file} is missing (the entry was not written whole)")
    try:
        info = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{file} is not valid JSON: {exc}") from None
    except OSError as exc:
        raise ModelLoadError(f"could not read {file}: {exc}") from exc
    files = info.get("files") if isinstance(info, dict) else None
    if not isinstance(files, dict) or "config.json" not in files:
        raise ModelLoadError(f"{file} has no manifest of the entry's files (a `files` object with config.json); it "
                             "was written by an older normx or changed")
    for name, record in files.items():
        if ("/" in name or "\\" in name or name in ("", ".", "..", INFO) or not isinstance(record, dict)
                or not isinstance(record.get("bytes"), int) or not isinstance(record.get("sha256"), str)):
            raise ModelLoadError(f"{file} lists {name!r} as {record!r}; each file is a plain name with "
                                 '{"bytes": int, "sha256": str}')
    return info


def entry_problem(folder: Path, *, hashes: bool | None = None) -> str | None:
    """What is wrong with the cache entry ``folder`` (None: it is whole and unchanged). ``hashes``: check the
    files' SHA-256 too (default: once per process per entry, every time with ``NORMX_CACHE_VERIFY=always``)."""
    if folder.is_symlink() or not folder.is_dir():
        return f"{folder} is not a folder"
    try:
        files = read_info(folder)["files"]
    except ModelLoadError as exc:
        return str(exc)
    present = {p.name for p in folder.iterdir()} - {INFO}
    if extra := sorted(present - set(files)):
        return f"{folder} holds {', '.join(extra)}, which its manifest does not list"
    signature = []
    for name, record in sorted(files.items()):
        path = folder / name
        if path.is_symlink() or not path.is_file():
            return f"{path} is missing"
        stat = path.stat()
        if stat.st_size != record["bytes"]:
            return f"{path} is {stat.st_size} bytes, its manifest says {record['bytes']}"
        signature.append((name, stat.st_size, stat.st_mtime_ns, stat.st_ino))
    key = (str(folder), tuple(signature))
    if hashes is None:
        hashes = os.environ.get(VERIFY_ENV, "").lower() == "always" or key not in _proved
    if hashes:
        for name, record in sorted(files.items()):
            if sha256(folder / name) != record["sha256"]:
                return f"{folder / name} differs from what was written (its SHA-256 is not the manifest's)"
        _proved.add(key)
    return None


def sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as stream:
        while block := stream.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def write_entry(folder: Path, fill: Callable[[Path], dict]) -> None:
    """Write the entry ``folder`` whole: ``fill(staging)`` writes its files into a staging folder and returns what
    the entry was made from; the manifest goes in last and the folder is renamed into place. A complete entry
    already there (another process won the race) is kept and this one dropped; a damaged one is replaced."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(folder.parent)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".staging-{folder.name}-{os.getpid()}-",
                                    suffix=f"@{socket.gethostname()}"))
    try:
        info = fill(staging)
        files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256(p)} for p in sorted(staging.iterdir())}
        info = {**info, "written": time.strftime("%Y-%m-%dT%H:%M:%S"), "files": files}
        (staging / INFO).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
        _install(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already when it was renamed into place


def _install(staging: Path, folder: Path) -> None:
    for _ in range(3):
        try:
            staging.rename(folder)
        except OSError:  # something is there: the winner of a race, or the damaged entry being replaced
            if entry_problem(folder) is None:
                return
            aside = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".trash-{folder.name}-{os.getpid()}-",
                                          suffix=f"@{socket.gethostname()}"))
            try:
                folder.rename(aside / "entry")
            except FileNotFoundError:  # someone else moved it: try again
                pass
            except OSError as exc:
                raise ModelLoadError(f"could not replace the damaged cache entry {folder}: {exc}; {CLEAR_HINT}") \
                    from exc
            finally:
                shutil.rmtree(aside, ignore_errors=True)
        else:
            signature = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_ino)
                              for p in sorted(folder.iterdir()) if p.name != INFO)
            _proved.add((str(folder), signature))  # just hashed while writing
            return
    raise ModelLoadError(f"could not put the cache entry {folder} in place (other processes keep replacing it); "
                         f"{CLEAR_HINT}")


def remove_stale(parent: Path) -> list[Path]:
    """Remove the staging and set-aside folders in ``parent`` whose process is gone (same host) or that nothing
    touched for :data:`STALE_SECONDS`; returns those removed."""
    removed = []
    for path in sorted(parent.glob(".staging-*")) + sorted(parent.glob(".trash-*")):
        if _abandoned(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _abandoned(path: Path) -> bool:
    left, _, host = path.name.rpartition("@")
    parts = left.split("-")
    if host == socket.gethostname() and len(parts) == 4 and parts[2].isdigit() and not _alive(int(parts[2])):
        return True
    try:
        touched = max([path.lstat().st_mtime] + [p.lstat().st_mtime for p in path.rglob("*")])
    except OSError:  # removed meanwhile
        return False
    return time.time() - touched > STALE_SECONDS


def _alive(pid: int) -> bool:
    if os.name != "posix":  # os.kill(pid, 0) would end the process on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def cache_entries() -> list[dict]:
    """Every converted GGUF in the cache: ``{"path", "bytes", "name", "source", "class", "written", "problem"}``
    (``problem``: None, or what is wrong with a damaged entry, files and sizes checked, not hashes), unfinished
    conversions, and the other folders normx keeps there with their sizes."""
    root = cache_root()
    out = []
    for folder in sorted(p for p in root.glob("gguf/*") if p.is_dir() and not p.is_symlink()):
        if folder.name.startswith("."):
            out.append({"name": f"{folder.name} (unfinished conversion)", "path": str(folder),
                        "bytes": _size(folder), "problem": None})
            continue
        problem = entry_problem(folder, hashes=False)
        try:
            info = {k: v for k, v in read_info(folder).items() if k in ("name", "source", "class", "written")}
        except ModelLoadError:
            info = {"name": folder.name}
        out.append({**info, "path": str(folder), "bytes": _size(folder), "problem": problem})
    for folder in sorted(p for p in root.glob("*") if p.is_dir() and p.name != "gguf" and not p.is_symlink()):
        out.append({"name": folder.name, "path": str(folder), "bytes": _size(folder), "problem": None})
    return out


def clear_cache() -> int:
    """Remove everything in the cache folder; returns the bytes freed."""
    root = cache_root()
    freed = _size(root) if root.is_dir() else 0
    if root.is_dir():
        shutil.rmtree(root)
    return freed


def _size(folder: Path) -> int:
    return sum(f.lstat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())
