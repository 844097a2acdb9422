"""DecompX (Modarressi, Fayyaz et al., ACL 2023) on stock transformers: what it reads of a model
(:mod:`~normx.methods.decompx.model`), its decomposition rules (:mod:`~normx.methods.decompx.rules`), the
decomposition of a batch and its token-to-token maps (:mod:`~normx.methods.decompx.decompose`), and the registered
``decompx`` method (:mod:`~normx.methods.decompx.method`)."""

from normx.methods.decompx import method  # noqa: F401 (registers the method)
from normx.methods.decompx.decompose import (
    Decomposition,
    class_contributions,
    contribution_maps,
    decompose,
)
from normx.methods.decompx.model import BlockWeights, Recording, affine, record, supported_models
from normx.methods.decompx.rules import BIAS_RULES, decompose_head, layer_norm, propagate, share_bias, zo_slope

__all__ = ["BIAS_RULES", "BlockWeights", "Decomposition", "Recording", "affine", "class_contributions",
           "contribution_maps", "decompose", "decompose_head", "layer_norm", "propagate", "record", "share_bias",
           "supported_models", "zo_slope"]
