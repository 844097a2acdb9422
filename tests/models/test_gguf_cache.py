"""A GGUF cache entry proves itself (issue #42 item 6): written whole (staging folder renamed into place, manifest of
sizes and SHA-256 last), checked on every load, converted again from the GGUF file when damaged (with a
CacheWarning), an error naming ``normx cache --clear`` when it cannot be; staging folders of killed conversions
removed; two converters of one file both succeed with one entry."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
from gguf_support import write_tiny_gguf

import normx
from normx.cli.main import main
from normx.errors import CacheWarning
from normx.models import gguf, gguf_cache

pytest.importorskip("gguf", reason="GGUF files need `pip install gguf`")

TEXT = "the film was good"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("NORMX_CACHE", str(folder))
    monkeypatch.delenv(gguf_cache.VERIFY_ENV, raising=False)
    return folder


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    file = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    model, tokenizer = write_tiny_gguf(file)
    return file, model, tokenizer


def logits(model, tokenizer):
    with torch.no_grad():
        return model(**tokenizer(TEXT, return_tensors="pt")).logits


def entry(file: Path) -> Path:
    return gguf_cache.entry_folder(gguf.file_digest(file))


def loose(cache: Path) -> list[str]:
    """What is in the cache's gguf folder besides entries: staging and set-aside folders."""
    return sorted(p.name for p in (cache / "gguf").iterdir() if p.name.startswith("."))


def test_an_entry_is_written_whole_with_a_manifest_of_its_files(written, cache):
    file, _, _ = written
    normx.load_model(file)
    folder = entry(file)
    info = json.loads((folder / gguf_cache.INFO).read_text())
    on_disk = {p.name for p in folder.iterdir()} - {gguf_cache.INFO}
    assert set(info["files"]) == on_disk and {"config.json", "model.safetensors", "tokenizer.json"} <= on_disk
    for name, record in info["files"].items():
        assert record == {"bytes": (folder / name).stat().st_size, "sha256": gguf_cache.sha256(folder / name)}
    assert info["name"] == "tiny-llama.gguf" and loose(cache) == []
    assert gguf_cache.entry_problem(folder, hashes=True) is None


def _truncate(folder):
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _zero(folder):  # same size: only the hash can tell
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2:len(data) // 2 + 4096] = bytes(4096)
    weights.write_bytes(bytes(data))


DAMAGE = {
    "truncated weights": (_truncate, r"model.safetensors is \d+ bytes, its manifest says \d+"),
    "empty weights": (lambda f: (f / "model.safetensors").write_bytes(b""), "model.safetensors is 0 bytes"),
    "zeroed weights": (_zero, "model.safetensors differs from what was written"),
    "deleted tokenizer": (lambda f: (f / "tokenizer.json").unlink(), "tokenizer.json is missing"),
    "deleted config": (lambda f: (f / "config.json").unlink(), "config.json is missing"),
    "corrupt index": (lambda f: (f / gguf_cache.INFO).write_text('{"name": "x", "fi'),
                      "normx-gguf.json is not valid JSON"),
    "index without manifest": (lambda f: (f / gguf_cache.INFO).write_text('{"name": "x"}'),
                               "normx-gguf.json has no manifest"),
    "added file": (lambda f: (f / "model.safetensors.index.json").write_text("{}"),
                   "holds model.safetensors.index.json, which its manifest does not list"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_entry_is_converted_again_with_a_warning(written, cache, damage):
    file, original, tokenizer = written
    normx.load_model(file)  # converted, and proved in this process
    spoil, said = DAMAGE[damage]
    spoil(entry(file))
    with pytest.warns(CacheWarning, match=rf"cached conversion of tiny-llama.gguf is damaged \(.*{said}.*\); "
                                          "converting it again from"):
        model, loaded_tokenizer = normx.load_model(file)
    torch.testing.assert_close(logits(model, loaded_tokenizer), logits(original, tokenizer), atol=1e-5, rtol=1e-5)
    assert gguf_cache.entry_problem(entry(file), hashes=True) is None and loose(cache) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        normx.load_model(file)  # whole again: no warning


def test_every_load_hashes_with_the_environment_variable(written, cache, monkeypatch):
    file, _, _ = written
    normx.load_model(file)
    weights = entry(file) / "model.safetensors"
    stat = weights.stat()
    _zero(entry(file))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size and date: proved once, not again
    assert gguf_cache.entry_problem(entry(file)) is None
    monkeypatch.setenv(gguf_cache.VERIFY_ENV, "always")
    with pytest.warns(CacheWarning, match="model.safetensors differs from what was written"):
        normx.load_model(file)


def test_a_damaged_entry_that_cannot_be_rebuilt_names_the_cache_clear_command(written, cache, monkeypatch, capsys):
    file, _, _ = written
    normx.load_model(file)
    (entry(file) / gguf_cache.INFO).write_text("not json")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    assert main(["generate", "--model", str(file), "--max-new-tokens", "1", "the film"]) == 2
    err = capsys.readouterr().err
    assert "normx: warning: the cached conversion of tiny-llama.gguf is damaged" in err
    assert "(CacheWarning" not in err  # normx's own warning, worded as the CLI's line, not Python's
    assert f"normx: error: the cache entry {entry(file)} is damaged ({entry(file) / gguf_cache.INFO} is not valid " \
           "JSON: Expecting value: line 1 column 1 (char 0)) and could not be rebuilt" in err
    assert "needs the `gguf` package" in err and "`normx cache --clear` empties the cache" in err
    assert "Traceback" not in err


def test_the_listing_shows_damaged_entries_and_verify_hashes_them(written, cache, capsys):
    file, _, _ = written
    normx.load_model(file)
    assert main(["cache", "--verify"]) == 0
    assert "1 entries, 0 damaged (hashes checked)" in capsys.readouterr().out
    _zero(entry(file))
    assert main(["cache"]) == 0  # sizes only: it looks whole
    assert "1 entries, 0 damaged" in capsys.readouterr().out
    assert main(["cache", "--verify"]) == 1
    out = capsys.readouterr().out
    assert "DAMAGED: " in out and "model.safetensors differs from what was written" in out
    (entry(file) / gguf_cache.INFO).write_text("{")
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "normx-gguf.json is not valid JSON" in out and "1 entries, 1 damaged" in out


KILLED = """
import sys, time
import transformers
from pathlib import Path
from normx.models import gguf
from normx.models.tasks import TASKS
save = transformers.PreTrainedModel.save_pretrained
def stuck(self, folder, **kwargs):
    save(self, folder, **kwargs)
    print("saved", flush=True)
    time.sleep(600)
transformers.PreTrainedModel.save_pretrained = stuck
gguf.converted_folder(Path(sys.argv[1]), tasks=TASKS)
"""


@pytest.mark.slow  # a child process importing torch: ~20 s on 2 busy cores
def test_a_killed_conversions_staging_folder_is_removed_by_the_next(written, cache):
    file, _, _ = written
    child = subprocess.Popen([sys.executable, "-c", KILLED, str(file)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert child.stdout.readline().strip() == "saved"  # its weights are in the staging folder
    finally:
        child.kill()
        child.wait()
    left = loose(cache)
    assert len(left) == 1 and left[0].startswith(f".staging-{entry(file).name}-{child.pid}-")
    assert (cache / "gguf" / left[0] / "model.safetensors").stat().st_size > 0 and not entry(file).exists()
    assert [e["name"] for e in gguf.cache_entries()] == [f"{left[0]} (unfinished conversion)"]
    normx.load_model(file)
    assert loose(cache) == [] and gguf_cache.entry_problem(entry(file), hashes=True) is None


def test_staging_folders_of_gone_processes_or_an_hour_old_are_removed_by_the_next_conversion(written, cache):
    file, _, _ = written
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead = staging_of(cache, entry(file).name, int(gone.stdout), b"half a model")
    aside = staging_of(cache, entry(file).name, int(gone.stdout), b"a damaged entry", kind="trash")
    live = staging_of(cache, entry(file).name, os.getpid(), b"being written")
    elsewhere = staging_of(cache, entry(file).name, int(gone.stdout), b"another machine's", host="other-host")
    assert {e["name"] for e in gguf.cache_entries()} == {f"{p.name} (unfinished conversion)"
                                                         for p in (dead, aside, live, elsewhere)}
    normx.load_model(file)
    assert loose(cache) == sorted([live.name, elsewhere.name])  # running here, or on a host whose pids are not ours
    old = time.time() - gguf_cache.STALE_SECONDS - 60  # untouched for over an hour: removed whatever its process
    for folder in (live, elsewhere):
        os.utime(folder / "model.safetensors", (old, old))
        os.utime(folder, (old, old))
    assert gguf_cache.remove_stale(cache / "gguf") == sorted([live, elsewhere]) and loose(cache) == []


def staging_of(cache: Path, digest: str, pid: int, content: bytes, kind: str = "staging",
               host: str | None = None) -> Path:
    """A folder as a conversion of process ``pid`` on ``host`` (default: this one) leaves it."""
    import socket

    folder = cache / "gguf" / f".{kind}-{digest}-{pid}-abc_123@{host or socket.gethostname()}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(content)
    return folder


def test_two_threads_loading_one_file_get_one_entry_and_leave_transformers_as_it_was(written, cache):
    """normx's loads in one process run one after another: transformers' from_pretrained swaps class methods
    (PreTrainedModel.tie_weights, init_weights) while it loads, and two loads in threads at once could leave them
    swapped for every later load (a masked LM's tied bias left on the meta device). The first thread converts, the
    second finds its entry; both models are the file's."""
    from transformers import PreTrainedModel

    file, original, tokenizer = written
    tie, init = PreTrainedModel.tie_weights, PreTrainedModel.init_weights
    results, errors = [], []

    def load():
        try:
            results.append(normx.load_model(file))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 2
    assert PreTrainedModel.tie_weights is tie and PreTrainedModel.init_weights is init
    for model, loaded_tokenizer in results:
        torch.testing.assert_close(logits(model, loaded_tokenizer), logits(original, tokenizer), atol=1e-5, rtol=1e-5)
    assert len(gguf.cache_entries()) == 1 and loose(cache) == []
    assert gguf_cache.entry_problem(entry(file), hashes=True) is None


def test_the_first_conversion_says_what_it_does_and_no_progress_line_off_a_terminal(written, cache, capsys):
    file, _, _ = written
    assert main(["generate", "--model", str(file), "--max-new-tokens", "1", "the film"]) == 0
    err = capsys.readouterr().err
    size = file.stat().st_size / 2**20
    assert f"normx: converting tiny-llama.gguf ({size:.1f} MB) to a plain transformers model, once: about 0.2 MB " \
           f"(float32 weights) written to the cache at {entry(file)}; this can take minutes; later loads read that " \
           "copy in seconds" in err
    assert "Converting and de-quantizing" not in err and "it/s" not in err
