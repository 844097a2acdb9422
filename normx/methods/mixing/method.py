"""The registered ``globenc``, ``alti`` and ``value_zeroing`` methods: the pooled position's row of each layer's
mixing map (:func:`normx.methods.mixing.maps.batch_maps`)."""

from __future__ import annotations

from normx._torch import torch
from normx.methods.mixing.blocks import family_reason
from normx.methods.mixing.maps import DEFAULT_INTERNAL_BATCH_SIZE, batch_maps, check_options
from normx.methods.registry import Context, Method, Option, register_method


def _scores(method: str):
    def compute(ctx: Context) -> torch.Tensor:
        run = ctx.run
        maps = batch_maps(run.model, run.inputs, method, run.layers, ctx.options["rollout"],
                          ctx.options.get("internal_batch_size", DEFAULT_INTERNAL_BATCH_SIZE))
        rows = torch.arange(run.pooled.shape[0], device=run.pooled.device)
        per_layer = torch.stack([maps[layer][rows, run.pooled] for layer in run.layers], dim=1)  # [B, layers, T]
        return ctx.expand(per_layer)
    return compute


ROLLOUT = Option("rollout", False, "aggregate the token-to-token maps across layers (R^l = M^l R^(l-1))", bool)
_ROW = ("the row of the pooled position ([CLS]; the mask token for masked-LM heads) of its per-layer token-to-token "
        "map; label-independent; rollout=True aggregates across layers. BERT / ELECTRA / RoBERTa / XLM-R only")
register_method(Method(
    "globenc", _scores("globenc"),
    "GlobEnc (Modarressi et al. 2022): norms of the attention block's output decomposed per source token through "
    "both LayerNorms (N_Enc), normalised per row; " + _ROW,
    display="GlobEnc", shares=True, label_dependent=False,
    reading="magnitude", options=[ROLLOUT], supports=family_reason, exclusive=True,
    cost=lambda tokens, targets, options: 2 + tokens / 20))  # measured (MiniLM, CPU): 3x a forward at 40, 7x at 256
register_method(Method(
    "alti", _scores("alti"),
    "ALTI (Ferrando et al. 2022): l1-proximity of each source's decomposed vector to the first LayerNorm's output, "
    "normalised per row; " + _ROW,
    display="ALTI", shares=True, label_dependent=False,
    reading="magnitude", options=[ROLLOUT], supports=family_reason, exclusive=True,
    cost=lambda tokens, targets, options: 2 + tokens / 20))
register_method(Method(
    "value_zeroing", _scores("value_zeroing"),
    "Value Zeroing (Mohebbi et al. 2023): cosine distance of each token's block output when a source's value "
    "vectors are zeroed, normalised per row (internal_batch_size variants per pass); " + _ROW,
    display="Value Zeroing", shares=True, label_dependent=False,
    reading="magnitude", supports=family_reason, check_options=check_options,
    options=[ROLLOUT, Option("internal_batch_size", DEFAULT_INTERNAL_BATCH_SIZE,
                             "value-zeroing variants per block pass", int)],
    # one block pass per (source token, block): ~ one forward pass per token (measured 1.2x tokens on MiniLM)
    cost=lambda tokens, targets, options: 1 + 1.2 * tokens))
