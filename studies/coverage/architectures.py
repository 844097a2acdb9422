"""Which of transformers' architectures normx explains: every class transformers lists as a causal LM, a masked LM or
a sequence classifier, built tiny from its own default config (tests/architectures.py), given a verdict: verified
(its adapter, registered or discovered, reproduces the model's own outputs and NormXLogit equals a reference read
from them), refused (with the reason), or transformers itself fails on the shrunk config (listed, not counted).

Writes ``normx/models/coverage.json`` (what ``normx supported`` prints) and ``docs/supported.md``
(``normx.models.coverage.markdown``: its counts computed from the JSON, as the CLI's and the README's are):

    python -m studies.coverage.architectures                  # about 8 minutes on a 2-core CPU
    python -m studies.coverage.architectures AlbertForMaskedLM  # only these again; the others kept from the file
    python -m studies.coverage.architectures --docs           # only docs/supported.md again, from the JSON

``--out`` (default normx/models/coverage.json) and ``--docs-out`` (default docs/supported.md) name the two files.
The tiny models are the tests' own builder (tests/architectures.py, shared with tests/models/test_coverage.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import transformers

from normx.models.coverage import markdown
from studies.settings import REPO
from tests import architectures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("classes", nargs="*", help="only these classes again (the others kept from --out)")
    parser.add_argument("--docs", action="store_true", help="only --docs-out again, from --out")
    parser.add_argument("--out", type=Path, default=REPO / "normx" / "models" / "coverage.json")
    parser.add_argument("--docs-out", type=Path, default=REPO / "docs" / "supported.md")
    args = parser.parse_args()
    only, file, docs = set(args.classes), args.out, args.docs_out
    if args.docs:
        docs.write_text(markdown(json.loads(file.read_text())))
        return 0
    kept = {(row["head"], row["model_type"], row["class"]): row
            for row in json.loads(file.read_text())["architectures"]} if only else {}
    previous = json.loads(file.read_text())["summary"] if only else {}
    started = time.time()
    rows = []
    for kind, model_type, name in architectures.architectures():
        if only and name not in only and (kind, model_type, name) in kept:
            rows.append(kept[kind, model_type, name])
            continue
        result, detail = architectures.verdict(kind, model_type, name)
        rows.append({"class": name, "model_type": model_type, "head": kind, "verdict": result, "detail": detail})
        print(f"{name:<50} {result:<20} {detail[:90]}", file=sys.stderr)
    summary = {"transformers": transformers.__version__,
               "seconds": previous.get("seconds", round(time.time() - started)), "date": time.strftime("%Y-%m-%d")}
    table = {"summary": summary, "architectures": rows}
    file.write_text(json.dumps(table, indent=1) + "\n")
    docs.write_text(markdown(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
