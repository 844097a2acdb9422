"""Evidence alignment on BLiMP: do per-layer attributions point at the word that decides the target word? The run
(:mod:`~normx.evaluation.blimp.run`), its metrics (:mod:`~normx.evaluation.blimp.alignment`) and report
(:mod:`~normx.evaluation.blimp.report`); the pairs and their evidence come from :mod:`normx.data.blimp`."""

from normx.data.blimp_items import Item, prepare, split_pairs
from normx.evaluation.blimp.report import METRICS, BlimpReport, curve_label, curve_names
from normx.evaluation.blimp.run import SPECIAL_TOKENS, SPLITS, evaluate_blimp, positions, resolve_methods

__all__ = ["METRICS", "SPECIAL_TOKENS", "SPLITS", "BlimpReport", "Item", "curve_label", "curve_names",
           "evaluate_blimp", "positions", "prepare", "resolve_methods", "split_pairs"]
