"""normx's version, in one place (``normx.__version__``, the reports' settings)."""

__version__ = "0.1.0"
