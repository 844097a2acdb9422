"""GlobEnc, ALTI and Value Zeroing: what they read of an encoder block on the real forward pass
(:mod:`~normx.methods.mixing.blocks`), the per-layer token-to-token mixing maps
(:mod:`~normx.methods.mixing.maps`), and the registered methods (:mod:`~normx.methods.mixing.method`)."""

from normx.methods.mixing import method  # noqa: F401 (registers the methods)
from normx.methods.mixing.blocks import BlockRecord, layout_of, ln1_decomposition, record_blocks, supported_models
from normx.methods.mixing.maps import MIXING_METHODS, ContributionMaps, batch_maps, contribution_maps

__all__ = ["MIXING_METHODS", "BlockRecord", "ContributionMaps", "batch_maps", "contribution_maps", "layout_of",
           "ln1_decomposition", "record_blocks", "supported_models"]
