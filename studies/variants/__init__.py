"""Variant search over NormXLogit's settings."""
