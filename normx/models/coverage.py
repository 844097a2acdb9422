"""What is known of transformers' architectures: the verdict of each (verified, refused with the reason, or
failing in transformers on a tiny config), measured by ``bench/architecture_coverage.py`` and shipped as
``coverage.json`` beside this module (``normx supported`` prints it; docs/supported.md is the same table)."""

from __future__ import annotations

import json
from pathlib import Path

FILE = Path(__file__).resolve().parent / "coverage.json"


def coverage() -> dict:
    """``{"summary": {...}, "architectures": [{"class", "model_type", "head", "verdict", "detail"}, ...]}``."""
    return json.loads(FILE.read_text())
