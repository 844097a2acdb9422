"""Coverage surveys: which transformers architectures normx explains."""
