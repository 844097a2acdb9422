"""Where the tests find the checkout and the shared data (``$NORMX_DATA``, else ``../shared/data`` beside it)."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("NORMX_DATA", ROOT.parent / "shared" / "data"))
