"""bench/ is the benchmark suite, studies/ the research (#44): bench/ holds pytest-benchmark's files (test_*.py,
conftest.py) and the helpers they import, nothing else; neither folder edits sys.path or patches with mock (a study
reaches normx through its public entry points and scores peers through ``rows=`` / ``SuppliedScores``); studies
import no test module, have no test_ files (pytest's testpaths never collect them) and are each a command with
``--out``; both folders pass ruff."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH, STUDIES = ROOT / "bench", ROOT / "studies"
FORBIDDEN = re.compile(r"sys\.path\s*(\.\s*(insert|append|extend)\b|[+]?=)|\bunittest\.mock\b|from unittest import mock"
                       r"|\bmock\.patch\b|\bmonkeypatch\b")
# commands whose output file is a positional argument (run by other studies), not --out
OUT_POSITIONAL = {"studies/parity/lxt_attnlrp.py": "rows MODEL STEPS.json ROWS.json, run by the peers study"}
# a study still in bench/, and why (none now: golden_spread moved to studies/golden/spread.py)
PENDING: dict[str, str] = {}


def python_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def imported(file: Path) -> set[str]:
    """Every module name ``file`` imports (deferred imports included), dotted."""
    names = set()
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def offenders(text: str) -> list[str]:
    return [m.group(0) for m in FORBIDDEN.finditer(text)]


@pytest.mark.parametrize("folder", [BENCH, STUDIES], ids=["bench", "studies"])
def test_no_sys_path_edit_and_no_mock(folder):
    found = {str(f.relative_to(ROOT)): hits for f in python_files(folder) if (hits := offenders(f.read_text()))}
    assert not found, f"sys.path edits or mock patches (import through packages; score peers with rows=): {found}"


def test_the_check_finds_what_it_forbids():
    for text in ("sys.path.insert(0, 'x')", "sys.path.append(p)", "sys.path = []", "from unittest import mock",
                 "with mock.patch.object(a, 'b', c):", "import unittest.mock", "sys.path += ['x']"):
        assert offenders(text), text
    assert not offenders("print(sys.platform); path = sys.executable")


def test_bench_holds_the_benchmark_suite_and_its_helpers_only():
    """Every module of bench/ is a test file, the conftest, or imported (directly or through another helper) by
    one of them."""
    modules = {f.stem: f for f in python_files(BENCH) if f.parent == BENCH}
    nested = [str(f.relative_to(ROOT)) for f in python_files(BENCH) if f.parent != BENCH]
    assert not nested, f"bench/ has no subfolders of code: {nested}"
    reached = {name for name in modules if name.startswith("test_") or name == "conftest"}
    todo = list(reached)
    while todo:
        for name in imported(modules[todo.pop()]):
            head = name.removeprefix("bench.").split(".")[0]
            if head in modules and head not in reached:
                reached.add(head)
                todo.append(head)
    stray = sorted(set(modules) - reached - set(PENDING))
    assert not stray, f"bench/ modules no benchmark uses (a study belongs in studies/): {stray}"


def test_studies_import_no_test_module_and_have_no_test_files():
    tests = sorted(str(f.relative_to(ROOT)) for f in python_files(STUDIES) if f.name.startswith("test_"))
    assert not tests, f"studies/ is not collected by pytest: no test_ files there: {tests}"
    bad = {str(f.relative_to(ROOT)): sorted(n for n in imported(f) if any(part.startswith("test_") or part == "conftest"
                                                                          for part in n.split(".")))
           for f in python_files(STUDIES)}
    assert not {k: v for k, v in bad.items() if v}, f"studies import test modules: {bad}"


def test_every_study_is_a_command_with_out():
    commands = [f for f in python_files(STUDIES) if '__name__ == "__main__"' in f.read_text()]
    assert len(commands) >= 12
    missing = [str(f.relative_to(ROOT)) for f in commands if str(f.relative_to(ROOT)) not in OUT_POSITIONAL
               and '"--out"' not in f.read_text() and "add_out_option(" not in f.read_text()]
    assert not missing, f"studies without --out: {missing}"


def test_studies_are_never_collected():
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "studies"], cwd=ROOT,
                          capture_output=True, text=True)
    assert "no tests collected" in done.stdout + done.stderr or done.returncode == 5, done.stdout[-2000:]


def test_lint_passes_on_bench_and_studies():
    pytest.importorskip("ruff", reason="ruff is in the test extra: pip install -e '.[test]'")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "bench", "studies"], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


def test_test_files_have_unique_names_across_tests_and_bench():
    """pytest imports tests/ and bench/ test files as top-level modules (no __init__.py): two files of one name stop
    the whole run at collection ("import file mismatch")."""
    seen: dict[str, list[str]] = {}
    for folder in (ROOT / "tests", BENCH):
        for file in folder.rglob("test_*.py"):
            seen.setdefault(file.name, []).append(str(file.relative_to(ROOT)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}
