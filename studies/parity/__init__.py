"""Parity: normx against other implementations, each run in its own virtualenv."""
