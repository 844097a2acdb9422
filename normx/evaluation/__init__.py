"""Evaluating explanations: faithfulness (AOPC comprehensiveness / sufficiency, accuracy, Pearson) and evidence
alignment on BLiMP, as library functions and ``normx evaluate`` commands."""
