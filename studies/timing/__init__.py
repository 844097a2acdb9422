"""One-off timings (and the peers study's measuring helper)."""
