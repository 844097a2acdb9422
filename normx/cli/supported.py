"""``normx supported``: which of transformers' architectures normx explains (verified against their own outputs),
which it refuses and why, with the counts :mod:`normx.models.coverage` computes (the README's and
docs/supported.md's). Light: it imports neither torch nor transformers."""

from __future__ import annotations

import argparse

from normx.models import coverage as table_of
from normx.models.coverage import FAILS, NOT_MEASURED, REFUSED, VERIFIED


def add_parser(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser("supported", help="which transformers architectures normx explains (verified against "
                            "their own outputs), which it refuses and why")
    parser.add_argument("--verdict", choices=[VERIFIED, REFUSED, FAILS, NOT_MEASURED], default=None,
                        help="only the architectures with this verdict")
    parser.add_argument("--registered", action="store_true",
                        help="only the classes with a registered adapter (the others are discovered on first use)")
    return parser


def run(args) -> int:
    from normx.models import supported_models

    if args.registered:
        print("\n".join(supported_models()))
        return 0
    table = table_of.coverage()
    measured = table_of.architecture_rows(table)
    missing = table_of.grouped(table_of.unmeasured_rows(table))
    rows = [row for row in measured + missing if args.verdict in (None, row["verdict"])]
    for row in rows:
        print(f"{row['class']:<48} {row['head']:<24} {row['verdict']:<19} {row['detail']}")
    summary, installed = table["summary"], table_of.installed_transformers()
    shown = "" if args.verdict is None else f"{len(rows)} listed ({args.verdict}) of "
    print(f"\n{shown}{len(measured)} architectures (class and head) measured with transformers "
          f"{summary['transformers']} on {summary['date']} (tiny models from default configs): "
          f"{table_of.summary_sentence(table_of.counts(measured))}. Installed: transformers {installed}"
          + (f", which lists {len(missing)} architectures the table has not measured" if missing else "")
          + ". Every model is also checked against its own outputs the first time normx explains it.")
    return 0
