"""How fast a `normx show` report opens as the corpus grows: a folder of N rows made by repeating the rows of an
existing `normx attribute` folder (new ids), its report written, then opened in Chromium (Playwright): the time until
the first page's highlighted tokens show, to sort by confidence, and to reach the last page.

    python -m studies.timing.report_load attributions/sst2 100000 [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from normx.bulk.report import write_report
from studies.settings import Printed, add_out_option


def grow(source: Path, rows: int, out: Path) -> None:
    records = [r for f in sorted(source.glob("shard-*.parquet")) for r in pq.read_table(f).to_pylist()]
    for shard, start in enumerate(range(0, rows, 1000)):
        batch = [{**records[i % len(records)], "id": i} for i in range(start, min(start + 1000, rows))]
        pq.write_table(pa.Table.from_pylist(batch), out / f"shard-{shard:05d}.parquet")
    manifest = json.loads((source / "_manifest.json").read_text())
    (out / "_manifest.json").write_text(json.dumps({**manifest, "rows": rows}))


def main() -> int:
    from playwright.sync_api import expect, sync_playwright

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="a normx attribute folder")
    parser.add_argument("rows", type=int, help="rows of the grown folder")
    add_out_option(parser, "the printed line, also written to this file")
    args = parser.parse_args()
    source, rows, say = args.source, args.rows, Printed(args.out)
    folder = Path(tempfile.mkdtemp(prefix="normx-report-"))
    try:
        grow(source, rows, folder)
        started = time.perf_counter()
        index = write_report(folder)
        written = time.perf_counter() - started
        size = sum(f.stat().st_size for f in index.parent.iterdir())
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--headless", "--no-sandbox"])
            page = browser.new_page()
            timings = {}
            started = time.perf_counter()
            page.goto(index.as_uri())
            expect(page.locator("#examples tbody tr .u").first).to_be_visible(timeout=120_000)
            timings["first page"] = time.perf_counter() - started
            started = time.perf_counter()
            page.locator("th.sort[data-key='2']").click()
            expect(page.locator("#examples tbody tr .u").first).to_be_visible(timeout=120_000)
            timings["sort by confidence"] = time.perf_counter() - started
            started = time.perf_counter()
            page.get_by_role("button", name="last").click()
            expect(page.locator("#examples tbody tr .u").last).to_be_visible(timeout=120_000)
            timings["last page"] = time.perf_counter() - started
            browser.close()
        say(f"{rows} rows: report written in {written:.1f} s ({index.stat().st_size / 1e6:.1f} MB index, "
              f"{size / 1e6:.0f} MB in all); " + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    say.save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
