"""``normx cache``: what normx keeps in its cache folder (converted GGUF models), with sizes and the state of each
entry; ``--verify`` hashes every entry against its manifest, ``--clear`` empties the folder
(:mod:`normx.models.gguf_cache`)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub) -> argparse.ArgumentParser:
    """Add the ``cache`` subcommand (light: it imports neither torch nor transformers)."""
    parser = sub.add_parser("cache", help="what normx keeps in its cache folder (converted GGUF models), with sizes")
    parser.add_argument("--clear", action="store_true", help="remove everything in the cache folder")
    parser.add_argument("--verify", action="store_true",
                        help="check every file's SHA-256 against its entry's manifest (the listing checks sizes)")
    return parser


def run(args) -> int:
    """List the cache (exit 0), or empty it; with ``--verify``, exit 1 when an entry is damaged."""
    from normx.models.gguf_cache import cache_entries, cache_root, clear_cache, entry_problem

    if args.clear:
        print(f"removed {cache_root()}: {clear_cache() / 2**20:.1f} MB freed")
        return 0
    entries = cache_entries()
    damaged = 0
    for entry in entries:
        problem = entry["problem"]
        if args.verify and problem is None and entry.get("class"):
            problem = entry_problem(Path(entry["path"]), hashes=True)
        damaged += problem is not None
        source = f" from {entry['source']}" if entry.get("source") else ""
        state = f"\n{'':13}DAMAGED: {problem} (it is converted again on its next load)" if problem else ""
        print(f"{entry['bytes'] / 2**20:10.1f} MB  {entry['name']}{source}  {entry['path']}{state}")
    total = sum(entry["bytes"] for entry in entries)
    checked = " (hashes checked)" if args.verify else ""
    print(f"{len(entries)} entries, {damaged} damaged{checked}, {total / 2**20:.1f} MB in {cache_root()} "
          "($NORMX_CACHE moves it; `normx cache --clear` empties it)")
    return 1 if args.verify and damaged else 0
