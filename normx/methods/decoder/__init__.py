"""Methods for causal decoders, on the structure their adapter reads (:mod:`normx.models.decoder_attention`,
:mod:`normx.models.decoder`): what the methods read of each block's self-attention
(:mod:`~normx.methods.decoder.heads`), the per-query rows of its attention and norm-based attention maps from one
forward pass (:mod:`~normx.methods.decoder.maps`), and the registered methods, each from its own module:
``attention`` and ``norm_attention`` (:mod:`~normx.methods.decoder.method`), ALTI-Logit (``alti_logit``;
:mod:`~normx.methods.decoder.alti_logit`), the experimental ``attention_logit`` (:mod:`~normx.methods.decoder.logit`),
AttnLRP (``attnlrp``; :mod:`~normx.methods.decoder.lrp`), and decoder DecompX (the residual stream decomposed per
token, :mod:`~normx.methods.decoder.decompose` and :mod:`~normx.methods.decoder.contributions`, served under the
``decompx`` name by :mod:`normx.methods.decompx.method`)."""

from normx.methods.decoder import alti_logit, logit, lrp, method  # noqa: F401 (registers the methods)
from normx.methods.decoder.maps import block_rows, head_rows, query_rows, read_blocks

__all__ = ["block_rows", "head_rows", "query_rows", "read_blocks"]
