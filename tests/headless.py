"""A headless Chromium page for the tests that read a page as a browser draws it (skipped without Chromium at
``$NORMX_CHROMIUM`` / /usr/bin/chromium, or without Playwright)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def page_at(uri: str) -> Iterator[tuple[object, object]]:
    """``(playwright.sync_api, page)`` with ``uri`` loaded; the browser is closed on exit."""
    chromium = Path(os.environ.get("NORMX_CHROMIUM", "/usr/bin/chromium"))
    playwright = pytest.importorskip("playwright.sync_api")
    if not chromium.is_file():
        pytest.skip("no Chromium")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=["--headless", "--no-sandbox"])
        try:
            view = browser.new_page()
            view.goto(uri)
            yield playwright, view
        finally:
            browser.close()
