"""The ``normx`` command line: every command's parser and what it prints (:mod:`~normx.cli.main`), the flags built
from the methods' options (:mod:`~normx.cli.flags`), the terminal table (:mod:`~normx.cli.render`), and the
``normx evaluate`` commands (:mod:`~normx.cli.evaluate`, :mod:`~normx.cli.faithfulness`, :mod:`~normx.cli.blimp`).

The top layer: it may import every other.
"""

from normx.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
