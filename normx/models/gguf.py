"""GGUF files (llama.cpp, Ollama, LM Studio): a decoder language model in one file, loaded once.

transformers reads a GGUF file's config, tokenizer and (dequantized) weights, slowly (a 500 MB file takes a minute
or more) and without ``architectures`` in the config; and a GGUF-loaded model cannot be saved. normx loads a GGUF
file as a causal LM (what a GGUF holds) unless told another task, rebuilds a plain transformers model from it, and
keeps that model and its tokenizer in the cache under the file's content hash: one copy per file, however many
times a package holding it is installed, and every later load is a plain ``from_pretrained`` of that folder.

The file's header is checked first (:func:`normx.models.gguf_header.read_header`): a truncated or corrupted file is
a :class:`~normx.errors.ModelLoadError` saying what is wrong, as is any file transformers cannot convert. A cache
entry is written whole and proved against its manifest when read (:mod:`normx.models.gguf_cache`); a damaged
entry is converted again from the GGUF file, with a :class:`~normx.errors.CacheWarning` saying so.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

from normx.errors import CacheWarning, ModelLoadError
from normx.models.gguf_cache import (
    CLEAR_HINT,
    cache_entries,
    cache_root,
    clear_cache,
    entry_folder,
    entry_problem,
    write_entry,
)
from normx.models.gguf_header import read_header

__all__ = ["cache_entries", "cache_root", "clear_cache", "converted_folder", "file_digest", "gguf_file",
           "load_gguf"]

SUFFIX = ".gguf"
GGUF_PIP = "pip install gguf"
_CHUNK = 1 << 22
_progress_lock = threading.Lock()


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
    for attempt in range(2):
        try:
            model = cls.from_pretrained(folder, trust_remote_code=False, **kwargs)
            tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
            return model, tokenizer
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            problem = entry_problem(folder, hashes=True)
            if attempt or problem is None:  # a whole entry transformers cannot read: nothing to rebuild
                raise ModelLoadError(f"could not load the cache entry {folder} of {file}: {exc}; {CLEAR_HINT}") \
                    from exc
            folder = converted_folder(file, task=task, tasks=tasks, notify=notify)  # replaced meanwhile, or damaged
    raise AssertionError("unreachable")


def converted_folder(file: Path, *, task: str = "causal-lm", tasks: dict[str, str],
                     notify: Callable[[str], None] | None = None) -> Path:
    """The cache folder of a GGUF file's plain model and tokenizer, checked against its manifest; converted now if
    it is not there yet, converted again (with a :class:`CacheWarning`) if it is damaged."""
    if task not in tasks:
        raise ModelLoadError(f"task={task!r} is not known; use one of {sorted(tasks)}")
    folder = entry_folder(file_digest(file))
    if not (folder.exists() or folder.is_symlink()):
        _convert(file, folder, task, tasks, notify)
        return folder
    problem = entry_problem(folder)
    if problem is None:
        return folder
    warnings.warn(f"the cached conversion of {file.name} is damaged ({problem}); converting it again from {file}",
                  CacheWarning, stacklevel=3)
    try:
        _convert(file, folder, task, tasks, notify)
    except ModelLoadError as exc:
        raise ModelLoadError(f"the cache entry {folder} is damaged ({problem}) and could not be rebuilt from "
                             f"{file}: {exc}; {CLEAR_HINT}") from exc
    return folder


def _convert(file: Path, folder: Path, task: str, tasks: dict[str, str],
             notify: Callable[[str], None] | None) -> None:
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError(f"loading a GGUF file needs the `gguf` package: `{GGUF_PIP}`")
    header = read_header(file)
    if notify is not None:
        notify(f"converting {file.name} ({_mb(file.stat().st_size)}) to a plain transformers model, once: about "
               f"{_mb(header.elements * 4)} (float32 weights) written to the cache at {folder}; this can take "
               "minutes; later loads read that copy in seconds (`normx cache` lists the cache)")
    import transformers
    from transformers.utils import logging

    cls = getattr(transformers, tasks[task])
    before = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        with _progress_bar_on_terminals_only():
            tokenizer = transformers.AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
            loaded = cls.from_pretrained(file.parent, gguf_file=file.name, trust_remote_code=False)
        plain = type(loaded)(loaded.config)  # save_pretrained refuses a GGUF-loaded model: a plain one, same weights
        plain.load_state_dict(loaded.state_dict())
    except Exception as exc:  # whatever transformers makes of a stranger's file: a load error
        raise ModelLoadError(f"could not convert {file} (architecture {header.values.get('general.architecture')!r})"
                             f" to a transformers model: {type(exc).__name__}: {exc}") from exc
    finally:
        logging.set_verbosity(before)
    plain.config.architectures = [type(plain).__name__]

    def fill(staging: Path) -> dict:
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        return {"source": str(file), "name": file.name, "bytes": file.stat().st_size, "class": type(plain).__name__}

    try:
        write_entry(folder, fill)
    except OSError as exc:
        raise ModelLoadError(f"could not write the cache entry {folder}: {exc}") from exc


def _mb(size: int) -> str:
    mb = size / 2**20
    return f"{mb:.1f} MB" if mb < 10 else f"{mb:.0f} MB"


@contextlib.contextmanager
def _progress_bar_on_terminals_only():
    """transformers' "Converting and de-quantizing GGUF tensors" bar, only when stderr is a terminal (elsewhere it
    is one endless line): its module's ``tqdm`` is swapped for a disabled one while this process converts."""
    from transformers import modeling_gguf_pytorch_utils as reading

    terminal = sys.stderr is not None and getattr(sys.stderr, "isatty", lambda: False)()
    if terminal or not hasattr(reading, "tqdm"):
        yield
        return
    with _progress_lock:  # one conversion at a time swaps it, so the original always comes back
        original = reading.tqdm
        reading.tqdm = functools.partial(original, disable=True)
        try:
            yield
        finally:
            reading.tqdm = original
