"""Context attribution studies (#46): ``peers`` runs ContextCite's, AT2's and FlashTrace's own code beside normx's
methods through :func:`normx.evaluation.context.evaluate_context` (one scoring code path)."""
