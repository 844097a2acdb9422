"""The README's context example, regenerated: ``normx cite`` on the Eiffel text with the smollm2 preset, run in this
process exactly as the README shows it, and its output written between the README's markers.

    python -m studies.readme.context_example            # rewrite the README's block
    python -m studies.readme.context_example --check    # exit 1 when the README shows other output

``--check`` (what tests/test_readme_context.py runs) compares the texts exactly and the scores to ``RTOL`` of the
largest one (float32 differs in the last digits from one CPU to another). Reaches normx through its command line only.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
import tempfile
from pathlib import Path

from studies.settings import REPO

README = REPO / "README.md"
BEGIN, END = "<!-- normx:context-example begin -->", "<!-- normx:context-example end -->"
EIFFEL = ("The Eiffel Tower was built for the 1889 World's Fair in Paris. Its designer's company was led by Gustave "
          "Eiffel. The tower is 330 metres tall. The Colosseum in Rome was finished in 80 AD. Bananas are a good "
          "source of potassium.")
QUERY = "How tall is the Eiffel Tower?"
ARGS = ["--model", "smollm2", "--query", QUERY, "--max-new-tokens", "12"]
RTOL = 2e-3  # of the largest |score|: the scores are printed to 4 significant digits


def command() -> str:
    """The command as the README shows it."""
    return f'$ normx cite eiffel.txt --model smollm2 --query "{QUERY}" --max-new-tokens 12'


def output() -> str:
    """What that command prints (standard output), run here on a file with :data:`EIFFEL`."""
    from normx.cli.main import main

    with tempfile.TemporaryDirectory() as folder:
        context = Path(folder) / "eiffel.txt"
        context.write_text(EIFFEL + "\n", encoding="utf-8")
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown):
            code = main(["cite", str(context), *ARGS])
    if code != 0:
        raise SystemExit(f"normx cite exited with {code}")
    return shown.getvalue().rstrip("\n")


def block(text: str) -> str:
    return f"{BEGIN}\n```console\n{command()}\n{text}\n```\n{END}"


def shown_in_readme(readme: str) -> str:
    """The output the README shows between its markers."""
    found = re.search(re.escape(BEGIN) + r"\n```console\n[^\n]*\n(.*?)\n```\n" + re.escape(END), readme, re.S)
    if found is None:
        raise SystemExit(f"README.md has no block between {BEGIN} and {END}")
    return found.group(1)


def same(shown: str, fresh: str) -> list[str]:
    """The differences between two outputs: texts exactly (the spaces that align the columns aside), scores to RTOL
    of the largest |score|."""
    number = re.compile(r"[+-]\d[\d.e+-]*")
    a, b = shown.splitlines(), fresh.splitlines()
    if len(a) != len(b):
        return [f"{len(a)} lines shown, {len(b)} printed"]
    scale = max([abs(float(v)) for line in b for v in number.findall(line)] or [1.0])
    padded = re.compile(r"\s*" + number.pattern)  # (a score printed a digit shorter moves its column's padding)
    problems = []
    for old, new in zip(a, b):
        if padded.sub(" #", old) != padded.sub(" #", new):
            problems.append(f"shown {old!r}, printed {new!r}")
        elif any(abs(float(x) - float(y)) > RTOL * scale for x, y in zip(number.findall(old), number.findall(new))):
            problems.append(f"scores differ: shown {old!r}, printed {new!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    parser.add_argument("--out", type=Path, default=README, help="the README whose block is written or checked "
                        "(default: the repository's README.md)")
    args = parser.parse_args(argv)
    readme = args.out.read_text(encoding="utf-8")
    fresh = output()
    if args.check:
        problems = same(shown_in_readme(readme), fresh)
        if EIFFEL not in " ".join(readme.split()):
            problems.append("the README's description of eiffel.txt is not EIFFEL")
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    start, end = readme.index(BEGIN), readme.index(END) + len(END)
    args.out.write_text(readme[:start] + block(fresh) + readme[end:], encoding="utf-8")
    print(block(fresh))
    return 0


if __name__ == "__main__":
    sys.exit(main())
