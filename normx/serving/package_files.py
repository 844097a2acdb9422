"""A package's own files, copied for a Space folder (:func:`copy_package`): the files its installed distribution's
RECORD lists (a wheel's install), else in a source checkout the files committed at git's ``HEAD``; never what merely
lies in the package folder (an untracked ``.env``, notebooks' checkpoints, a nested ``.git``, a checkpoint, caches,
uncommitted edits), never through a symbolic link. What the folder holds and the copy leaves out is returned, with
why, and which of the copied files are binary (the Hub takes those only through LFS / Xet).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata
import io
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from normx.errors import InvalidInputError

CACHE_DIRS = {"__pycache__"}
CACHE_SUFFIXES = (".pyc", ".pyo")
SYMLINK = "a symbolic link (never followed)"
CACHE = "Python's bytecode cache"
LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"
BINARY_PROBE = 8000  # git's own test: a NUL byte in a file's first 8000 bytes makes it binary
HUB_TEXT_LIMIT = 10 * 2**20  # the Hub refuses a larger file outside LFS / Xet
CHUNK = 2**20


@dataclass(frozen=True)
class LeftOut:
    """A path of the package folder (``"normx/.env"``; ending in ``/``: a whole folder) the copy left out, and why."""

    path: str
    reason: str


@dataclass
class CopiedPackage:
    """What :func:`copy_package` wrote: the files (relative to the Space folder), where their list came from, what it
    left out, which files are binary, their size."""

    files: list[str]
    source: str
    left_out: list[LeftOut] = field(default_factory=list)
    binary: list[str] = field(default_factory=list)
    bytes: int = 0


@dataclass
class _Listing:
    source: str
    entries: dict[str, object]  # path inside the package folder -> a git blob id, or (file, RECORD hash)
    not_listed: str  # why a file of the folder outside ``entries`` is left out
    left_out: list[LeftOut] = field(default_factory=list)
    read: Callable | None = None  # (entry, writable binary file) -> None, raising on a bad entry
    close: Callable[[], None] = lambda: None


def copy_package(folder: Path, target: Path, leave_out: Callable[[str], str | None] | None = None) -> CopiedPackage:
    """Copy the package folder ``folder`` to ``target`` (replaced whole, or left as it was on an error): its installed
    distribution's RECORD files (each checked against its hash) or, in a git checkout, its files as committed at
    ``HEAD``. ``leave_out(path)`` (a path inside the folder) returns why to leave a listed file out, or ``None``."""
    folder = Path(folder)
    listing = _installed(folder) or _committed(folder)
    if listing is None:
        raise InvalidInputError(f"{folder} is neither an installed distribution's package folder (no RECORD lists it) "
                                "nor tracked by git: normx space copies only the files a package owns, so install "
                                "it from a wheel or run from a git checkout with the package committed")
    name = folder.name
    left_out = list(listing.left_out)
    copied = CopiedPackage([], listing.source, left_out)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp's folder is private
    skipped: dict[str, str] = {}
    try:
        for path, entry in sorted(listing.entries.items()):
            reason = CACHE if _is_cache(path) else leave_out(path) if leave_out else None
            if reason:
                skipped[path] = reason
                continue
            out = staging / path
            out.parent.mkdir(parents=True, exist_ok=True)
            with open(out, "xb") as sink:
                listing.read(entry, sink)
            copied.files.append(f"{name}/{path}")
            copied.bytes += out.stat().st_size
            if _is_binary(out):
                copied.binary.append(f"{name}/{path}")
        _remove(target)
        staging.rename(target)
        left_out += _collapsed(name, skipped, set(listing.entries) - set(skipped))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        listing.close()
    left_out += _unlisted(folder, set(listing.entries), listing.not_listed)
    once: dict[str, LeftOut] = {}
    for item in left_out:
        once.setdefault(item.path, item)  # a path once, with the first reason found
    copied.left_out = list(once.values())
    return copied


def _collapsed(name: str, skipped: dict[str, str], kept: set[str]) -> list[LeftOut]:
    """The listed files left out, a folder once (``name/dir/``) when all of its files were left out for one reason."""
    out = {}
    for path, reason in skipped.items():
        shown = path
        for parent in PurePosixPath(path).parents:
            under = str(parent) + "/"
            if str(parent) == "." or any(k.startswith(under) for k in kept) or any(
                    p.startswith(under) and r != reason for p, r in skipped.items()):
                break
            shown = under
        out.setdefault(shown, reason)
    return [LeftOut(f"{name}/{path}", reason) for path, reason in out.items()]


def _is_cache(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return bool(CACHE_DIRS.intersection(parts[:-1])) or path.endswith(CACHE_SUFFIXES)


def _is_binary(file: Path) -> bool:
    """Binary to git (a NUL byte early) or to the Hub (over its text-file limit, or not UTF-8)."""
    size = file.stat().st_size
    with open(file, "rb") as source:
        head = source.read(BINARY_PROBE)
        if b"\0" in head or size > HUB_TEXT_LIMIT:
            return True
        try:
            (head + source.read()).decode("utf-8")
        except UnicodeDecodeError:
            return True
    return False


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _unlisted(folder: Path, listed: set[str], reason: str) -> list[LeftOut]:
    """What lies in ``folder`` and no list holds: a folder with no listed file under it once (``name/dir/``)."""
    prefixes = {str(parent) for path in listed for parent in PurePosixPath(path).parents}
    out = []
    for here, dirs, files in os.walk(folder):  # never into a linked folder (followlinks=False)
        rel = PurePosixPath(Path(here).relative_to(folder).as_posix())
        for d in sorted(dirs):
            path = str(rel / d)  # PurePosixPath(".") / d is d
            if os.path.islink(os.path.join(here, d)):
                out.append(LeftOut(f"{folder.name}/{path}", SYMLINK))
            elif path not in prefixes:
                out.append(LeftOut(f"{folder.name}/{path}/", CACHE if d in CACHE_DIRS else reason))
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(here, d))
                         and str(rel / d) in prefixes)
        for f in sorted(files):
            path = str(rel / f)
            if path in listed:
                continue
            why = SYMLINK if os.path.islink(os.path.join(here, f)) else CACHE if _is_cache(path) else reason
            out.append(LeftOut(f"{folder.name}/{path}", why))
    return out


# ---- an installed distribution: its RECORD -------------------------------------------------------------------------


def _installed(folder: Path) -> _Listing | None:
    """The files of ``folder`` that an installed (not editable) distribution's RECORD lists, or ``None``."""
    name = folder.name
    for dist_name in importlib.metadata.packages_distributions().get(name, []):
        for dist in importlib.metadata.distributions(name=dist_name):
            record = dist.read_text("RECORD")
            root = Path(dist.locate_file(""))
            if not record or os.path.realpath(root / name) != os.path.realpath(folder):
                continue
            entries, left_out = {}, []
            for row in csv.reader(io.StringIO(record)):
                if not row:
                    continue
                path = PurePosixPath(row[0])
                if path.parts[:1] != (name,):
                    continue
                inside = PurePosixPath(*path.parts[1:])
                if path.is_absolute() or ".." in path.parts or not inside.parts:
                    left_out.append(LeftOut(row[0], "a RECORD path outside the package folder"))
                elif _linked(folder, inside):
                    left_out.append(LeftOut(row[0], SYMLINK))
                elif not (folder / inside).is_file():
                    left_out.append(LeftOut(row[0], "listed in RECORD, not a file here"))
                elif not (len(row) > 1 and row[1]) and not _is_cache(str(inside)):
                    left_out.append(LeftOut(row[0], "RECORD gives it no hash to check"))
                else:
                    entries[str(inside)] = (folder / inside, row[1] if len(row) > 1 else "")
            if entries:
                source = f"{dist.metadata['Name']} {dist.version}'s RECORD (installed in {root})"
                return _Listing(source, entries, f"not in {dist.metadata['Name']}'s RECORD", left_out, _read_checked)
    return None


def _linked(folder: Path, inside: PurePosixPath) -> bool:
    """Whether ``folder/inside`` is, or lies under, a symbolic link (below ``folder``)."""
    path = folder
    for part in inside.parts:
        path = path / part
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                return True
        except FileNotFoundError:
            return False
    return False


def _read_checked(entry: tuple[Path, str], sink) -> None:
    file, expected = entry
    algorithm, _, digest = expected.partition("=")
    hasher = hashlib.new(algorithm) if expected else None
    fd = os.open(file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as source:
        while chunk := source.read(CHUNK):
            sink.write(chunk)
            if hasher:
                hasher.update(chunk)
    if hasher and base64.urlsafe_b64encode(hasher.digest()).rstrip(b"=").decode() != digest:
        raise InvalidInputError(f"{file} differs from the file its distribution installed (RECORD's {algorithm} "
                                "hash): it was changed after the install; reinstall the package")


# ---- a source checkout: the files committed at git's HEAD ---------------------------------------------------------


def _git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # no GIT_DIR etc. from outside
    return subprocess.run(["git", "-c", "core.fsmonitor=false", "-C", str(cwd), *args], capture_output=True,
                          env=env, check=check, timeout=120)


def _committed(folder: Path) -> _Listing | None:
    """The files of ``folder`` committed at ``HEAD`` of the git repository holding it, or ``None``. git runs from
    the folder's parent, so a ``.git`` planted inside the package folder is not taken for its repository."""
    if shutil.which("git") is None:
        return None
    try:
        top = _git(folder.parent, "rev-parse", "--show-toplevel", "HEAD")
        tree = _git(folder.parent, "ls-tree", "-r", "-z", "HEAD", "--", f"{folder.name}/")
        changed = _git(folder.parent, "diff", "--relative", "--name-only", "--no-renames", "-z", "HEAD", "--",
                       f"{folder.name}/")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None
    root, commit = top.stdout.decode().splitlines()[:2]
    entries, left_out = {}, []
    for line in tree.stdout.decode().split("\0"):
        if not line:
            continue
        meta, path = line.split("\t", 1)
        mode, kind, oid = meta.split()
        inside = path.removeprefix(f"{folder.name}/")
        if mode == "120000":
            left_out.append(LeftOut(path, SYMLINK))
        elif kind != "blob":
            left_out.append(LeftOut(f"{path}/", "a git submodule (another repository)"))
        else:
            entries[inside] = oid
    if not entries:
        return None
    left_out += [LeftOut(path, "uncommitted changes: the Space has the version committed at HEAD")
                 for path in changed.stdout.decode().split("\0") if path]
    reader = _BlobReader(folder.parent)
    return _Listing(f"git HEAD ({commit[:12]}) of {root}", entries, "not committed to git (untracked, ignored or "
                    "only staged)", left_out, reader, reader.close)


def committed_file(file: Path) -> tuple[bytes, list[LeftOut]] | None:
    """``file`` as committed at ``HEAD`` of the git repository holding it, with a note when it has uncommitted
    changes; ``None`` when git does not track it. A file committed as a symbolic link is refused."""
    if shutil.which("git") is None:
        return None
    try:
        entry = _git(file.parent, "ls-tree", "-z", "HEAD", "--", file.name).stdout.decode().split("\0")[0]
        if not entry:
            return None
        mode, _, oid = entry.split("\t", 1)[0].split()
        if mode == "120000":
            raise InvalidInputError(f"{file} is committed as a symbolic link: the Space gets no file through one")
        data = _git(file.parent, "cat-file", "blob", oid).stdout
        changed = _git(file.parent, "diff", "--relative", "--name-only", "HEAD", "--", file.name).stdout.strip()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None
    note = [LeftOut(str(file), "uncommitted changes: the Space has the version committed at HEAD")] if changed else []
    return data, note


class _BlobReader:
    """Blobs by id through one ``git cat-file --batch``, started on first use, ended by :meth:`close`."""

    def __init__(self, cwd: Path):
        self.cwd, self.process = cwd, None

    def __call__(self, oid: str, sink) -> None:
        if self.process is None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
            self.process = subprocess.Popen(["git", "-C", str(self.cwd), "cat-file", "--batch"], env=env,
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.process.stdin.write(f"{oid}\n".encode())
        self.process.stdin.flush()
        header = self.process.stdout.readline().split()
        if len(header) != 3 or header[1] != b"blob":
            raise InvalidInputError(f"git has no blob {oid}: {b' '.join(header).decode(errors='replace')}")
        left, first = int(header[2]), True
        while left:
            chunk = self.process.stdout.read(min(CHUNK, left))
            if first and chunk.startswith(LFS_POINTER):
                raise InvalidInputError(f"blob {oid} is a Git LFS pointer, not the file: normx space copies what git "
                                        "holds; install normx from a wheel to ship LFS files")
            sink.write(chunk)
            left, first = left - len(chunk), False
        self.process.stdout.read(1)  # the newline after each blob

    def close(self) -> None:
        if self.process is not None:
            self.process.stdin.close()
            self.process.stdout.close()
            self.process.wait(30)
            self.process = None
