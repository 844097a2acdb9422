"""Shared helpers of the demo tests: import ``demo/app.py``, build small offline models, serve the app locally."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import sys
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

ROOT = Path(__file__).resolve().parents[1]
APP_FILE = ROOT / "demo" / "app.py"
MODULE = "normx_demo_app"


def load_app():
    """``demo/app.py`` as a module (``demo/`` is not a package; the file is the Spaces ``app_file``)."""
    if MODULE not in sys.modules:
        spec = importlib.util.spec_from_file_location(MODULE, APP_FILE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[MODULE] = module
        spec.loader.exec_module(module)
    return sys.modules[MODULE]


def preset_ready(name: str = "minilm-sst2") -> bool:
    """Whether an offline preset's trained adapter is in the package (training writes ``metrics.json`` last)."""
    from normx.zoo.presets import PRESETS

    return PRESETS[name].metrics() is not None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve(blocks):
    """Launch ``blocks`` on 127.0.0.1 (a free port, never shared) in this process; yield its URL; close it."""
    app = load_app()
    _, url, _ = blocks.launch(**app.launch_kwargs(prevent_thread_lock=True, server_name="127.0.0.1",
                                                  server_port=free_port(), quiet=True))
    try:
        yield url
    finally:
        blocks.close()
