"""GGUF files (llama.cpp, Ollama, LM Studio): a decoder language model in one file, loaded once.

transformers reads a GGUF file's config, tokenizer and (dequantized) weights, slowly (a 500 MB file takes a minute
or more) and without ``architectures`` in the config; and a GGUF-loaded model cannot be saved. normx loads a GGUF
file as a causal LM (what a GGUF holds) unless told another task, rebuilds a plain transformers model from it, and
keeps that model and its tokenizer in the cache under the file's content hash: one copy per file, however many
times a package holding it is installed, and every later load is a plain ``from_pretrained`` of that folder.

The cache folder is ``$NORMX_CACHE``, else ``$XDG_CACHE_HOME/normx``, else ``~/.cache/normx``; ``normx cache``
lists and clears it (:func:`cache_entries`, :func:`clear_cache`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from normx.errors import ModelLoadError

SUFFIX = ".gguf"
GGUF_PIP = "pip install gguf"
INFO = "normx-gguf.json"  # what a cache entry was made from (written last: an entry without it is incomplete)
_CHUNK = 1 << 22


def cache_root() -> Path:
    """Where normx keeps what it builds once: ``$NORMX_CACHE``, else ``$XDG_CACHE_HOME/normx``, else
    ``~/.cache/normx``."""
    given = os.environ.get("NORMX_CACHE")
    if given:
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "normx"


def gguf_file(source: str | Path) -> Path | None:
    """The GGUF file ``source`` names: the file itself, or the one ``.gguf`` file in a folder that has no
    ``config.json``; None for anything else. A folder with several GGUF files is an error naming them."""
    path = Path(source).expanduser()
    if path.is_file() and path.suffix.lower() == SUFFIX:
        return path
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() == SUFFIX)
    if len(found) > 1:
        raise ModelLoadError(f"{path} holds {len(found)} GGUF files ({', '.join(p.name for p in found)}); give the "
                             "file itself")
    return found[0] if found else None


def file_digest(file: Path) -> str:
    """The BLAKE2 hash of the file's content (the cache key: not its name, size or date)."""
    digest = hashlib.blake2b(digest_size=16)
    with open(file, "rb") as stream:
        while block := stream.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def load_gguf(file: Path, *, task: str | None = None, tasks: dict[str, str], dtype=None,
              notify: Callable[[str], None] | None = None):
    """``(model, tokenizer)`` from a GGUF file: from the cache when the file was loaded before, else converted and
    cached. ``task`` (default ``"causal-lm"``) picks the head class from ``tasks`` (task -> transformers auto class
    name); ``notify(message)`` is told when the slow first conversion starts."""
    import transformers

    task = task or "causal-lm"
    folder = converted_folder(file, task=task, tasks=tasks, notify=notify)
    cls = getattr(transformers, tasks[task])
    kwargs = {} if dtype is None else {"dtype": dtype}
    model = cls.from_pretrained(folder, trust_remote_code=False, **kwargs)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    return model, tokenizer


def converted_folder(file: Path, *, task: str = "causal-lm", tasks: dict[str, str],
                     notify: Callable[[str], None] | None = None) -> Path:
    """The cache folder of a GGUF file's plain model and tokenizer (converted now if it is not there yet)."""
    if task not in tasks:
        raise ModelLoadError(f"task={task!r} is not known; use one of {sorted(tasks)}")
    folder = cache_root() / "gguf" / file_digest(file)
    if not (folder / INFO).is_file():
        if notify is not None:
            notify(f"converting {file.name} ({file.stat().st_size / 2**20:.0f} MB) to a plain model, once: it is "
                   f"cached in {folder.parent} (`normx cache` lists it)")
        _convert(file, folder, task, tasks)
    return folder


def _convert(file: Path, folder: Path, task: str, tasks: dict[str, str]) -> None:
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError(f"loading a GGUF file needs the `gguf` package: `{GGUF_PIP}`")
    import transformers
    from transformers.utils import logging

    cls = getattr(transformers, tasks[task])
    before = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
        loaded = cls.from_pretrained(file.parent, gguf_file=file.name, trust_remote_code=False)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"could not load {file} as a GGUF model: {exc}") from exc
    finally:
        logging.set_verbosity(before)
    plain = type(loaded)(loaded.config)  # save_pretrained refuses a GGUF-loaded model: a plain one, same weights
    plain.load_state_dict(loaded.state_dict())
    plain.config.architectures = [type(plain).__name__]
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    try:
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        info = {"source": str(file), "name": file.name, "bytes": file.stat().st_size, "class": type(plain).__name__,
                "written": time.strftime("%Y-%m-%dT%H:%M:%S")}
        (staging / INFO).write_text(json.dumps(info, indent=1) + "\n")
        if folder.exists():  # an incomplete entry (a conversion stopped half way)
            shutil.rmtree(folder)
        staging.rename(folder)
    except OSError:
        if not (folder / INFO).is_file():  # another process may have won the race
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def cache_entries() -> list[dict]:
    """Every converted GGUF in the cache: ``{"path", "bytes", "name", "source", "class", "written"}``, and the
    other folders normx keeps there with their sizes."""
    root = cache_root()
    out = []
    for folder in sorted(p for p in root.glob("gguf/*") if p.is_dir()) + sorted(
            p for p in root.glob("*") if p.is_dir() and p.name != "gguf"):
        info_file = folder / INFO
        info = json.loads(info_file.read_text()) if info_file.is_file() else {"name": folder.name}
        if folder.parent.name == "gguf" and not info_file.is_file():
            info["name"] = f"{folder.name} (incomplete)"
        out.append({**info, "path": str(folder), "bytes": _size(folder)})
    return out


def clear_cache() -> int:
    """Remove everything in the cache folder; returns the bytes freed."""
    root = cache_root()
    freed = _size(root) if root.is_dir() else 0
    if root.is_dir():
        shutil.rmtree(root)
    return freed


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
