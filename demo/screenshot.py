"""Regenerate the demo's picture (``docs/demo.png``, shown by README.md and the docs) from the live demo.

Serves the demo on 127.0.0.1 (the ``minilm-sst2`` preset, unlocked, in this process), drives Debian's headless
Chromium through Playwright, explains a sentence with NormXLogit and saves the page's upper part: the prediction,
the probabilities, the layer slider and the per-label views with their keys.

    python demo/screenshot.py [--out docs/demo.png] [--text "..."] [--model minilm-sst2]

Needs ``pip install -e '.[demo]' playwright`` and ``apt-get install -y chromium`` (``$NORMX_CHROMIUM`` overrides
its path). Nothing outside the local server is fetched: any other request is aborted.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
TEXT = "A gripping, beautifully acted film, though the ending drags a little."
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
VIEWPORT = {"width": 1400, "height": 1000}
TIMEOUT_MS = 120_000


def load_app():
    """demo/app.py as a module (``demo/`` is not a package)."""
    spec = importlib.util.spec_from_file_location("normx_demo_app", ROOT / "demo" / "app.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def screenshot(out: Path, text: str = TEXT, model: str = "minilm-sst2") -> Path:
    """Serve the demo, explain ``text`` with ``model`` and write the picture to ``out``; returns ``out``."""
    from playwright.sync_api import expect, sync_playwright

    chromium = Path(os.environ.get("NORMX_CHROMIUM", "/usr/bin/chromium"))
    if not chromium.is_file():
        raise SystemExit(f"no Chromium at {chromium}: apt-get install -y chromium (or set NORMX_CHROMIUM)")
    app = load_app()
    cache = app.serving.ModelCache()
    cache.get(model)  # loaded before the page asks: its "answered in" is the explanation's time, not the load's
    blocks = app.build_demo(default_model=model, locked=False, cache=cache)
    _, url, _ = blocks.launch(**app.launch_kwargs(prevent_thread_lock=True, server_name="127.0.0.1",
                                                  server_port=free_port(), quiet=True))
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_context(viewport=VIEWPORT, device_scale_factor=1).new_page()
                page.set_default_timeout(TIMEOUT_MS)
                local = urlparse(url).netloc
                page.route("**/*", lambda r: r.continue_() if urlparse(r.request.url).netloc == local
                           or r.request.url.startswith(("data:", "blob:")) else r.abort())
                page.goto(url, wait_until="domcontentloaded")
                page.locator("#normx-text textarea").fill(text)
                page.locator("#normx-explain").click()
                expect(page.locator("#normx-label-1 .normx-unit").first).to_be_visible(timeout=TIMEOUT_MS)
                expect(page.locator("#normx-prediction")).to_contain_text("answered in")
                page.mouse.move(0, 0)  # no hover tooltip in the picture
                bottom = page.locator("#normx-label-1").bounding_box()
                height = int(bottom["y"] + bottom["height"] + 24) if bottom else VIEWPORT["height"]
                out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(out), clip={"x": 0, "y": 0, "width": VIEWPORT["width"],
                                                     "height": min(height, 1600)}, full_page=True)
            finally:
                browser.close()
    finally:
        blocks.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "demo.png")
    parser.add_argument("--text", default=TEXT)
    parser.add_argument("--model", default="minilm-sst2")
    args = parser.parse_args(argv)
    print(screenshot(args.out, args.text, args.model))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
