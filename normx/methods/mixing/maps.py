"""GlobEnc, ALTI and Value Zeroing: per-layer token-to-token context-mixing maps for BERT-family and RoBERTa encoders.

Each method gives, for every block l = 1..L, a map M^l [T, T] whose row i says how much each source token j (its
representation x_j^(l-1) entering the block) contributes to token i's representation after the block; rows sum to 1
over the text's real tokens, and padding gets nothing. Layer 0 (the embedding output) is the identity map.

- ``globenc`` (Modarressi et al., NAACL 2022, "N_Enc"): the attention block's output for token i decomposed per
  source token, z_i = sum_j (sum_h A^h_ij W_O^h v_j^h + [i = j] x_i) + b_O, pushed through the first LayerNorm with
  its real statistics, T_i(x_j) = g1 * (y_ij - mean(y_ij)) / s1_i, and through the second LayerNorm the same way,
  bypassing the feed-forward network (as the paper's "whole encoder layer except the FFN"):
  N_ij = || g2 * (T_i(x_j) - mean(T_i(x_j))) / s2_i ||_2, then normalised per row. (The first-LayerNorm-only
  variant, Kobayashi et al.'s "N_ResLN", is what ALTI builds on below.) Biases are not attributed to any token.
- ``alti`` (Ferrando et al., EMNLP 2022): with T_i(x_j) as above and y_i the real first-LayerNorm output,
  c_ij = max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1), normalised per row.
- ``value_zeroing`` (Mohebbi et al., EACL 2023): for each source j the block is re-run on its real input with j's
  value vector zeroed in every head; c_ij = cosine distance between token i's new and real block outputs,
  normalised per row. The T variants of a text run as one batch (``internal_batch_size`` rows per pass).

``rollout=True`` aggregates the maps across layers, R^l = M^l R^(l-1) (R^0 = I), with no extra residual term (the
maps already contain the residual), as the three papers' code does.

The per-layer scores of the registered methods are the row of the pooled position ([CLS] for classifiers, the mask
token for masked-LM heads) of M^l (or R^l): label-independent. Their default is ``rollout=False``: the NormXLogit
paper's layer-wise BLiMP experiment (the authors' notebooks, github.com/sinaabbasi1/NormXLogit, "Experiment 2 -
Evidence Alignment") reads GlobEnc's per-layer N_Enc norms, ALTI's per-layer normalised contributions and Value
Zeroing's per-layer scores at the mask token, without rollout.

Everything comes from the model's own modules on the real forward pass: forward hooks (registered and removed in
try/finally, like :func:`normx.core.hooks.capture`) record each block's input and output, the value projection's output,
the attention probabilities and both LayerNorms' inputs; LayerNorm statistics are the real ones (biased variance +
eps, as ``nn.LayerNorm``). The output projection's linear part is ``dense(I) - dense(0)`` of the model's own (possibly
LoRA-wrapped) module, so PEFT adapters count with their effective weights. GlobEnc and ALTI need the attention
probabilities, which SDPA does not return: the model runs with eager attention for that pass, and its attention
setting is restored afterwards (also on errors).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from normx._torch import nn, torch
from normx.core.concurrency import pause
from normx.core.handle import model_handle
from normx.core.inputs import batches, encode, positive_int, resolve_max_length, text_inputs
from normx.errors import InvalidInputError
from normx.methods.mixing.blocks import (
    BlockRecord,
    _decomposition_map,
    block_terms,
    layout_of,
    ln1_decomposition,
    record_blocks,
    supported_models,
    value_zeroing_layer,
)
from normx.models import unwrap_model

MIXING_METHODS = ("globenc", "alti", "value_zeroing")
DEFAULT_INTERNAL_BATCH_SIZE = 64  # value-zeroing variants per block pass

__all__ = ["MIXING_METHODS", "BlockRecord", "ContributionMaps", "batch_maps", "contribution_maps", "layout_of",
           "ln1_decomposition", "record_blocks", "supported_models"]


# ---- maps ------------------------------------------------------------------------------------------------------------

def _normalise(scores: torch.Tensor) -> torch.Tensor:
    total = scores.sum(-1, keepdim=True)
    return torch.where(total > 0, scores / torch.where(total > 0, total, 1), scores)


def batch_maps(model: nn.Module, inputs: dict[str, torch.Tensor], method: str, layers: Sequence[int],
               rollout: bool = False, internal_batch_size: int = DEFAULT_INTERNAL_BATCH_SIZE
               ) -> dict[int, torch.Tensor]:
    """Row-normalised mixing maps {layer: [B, T, T] float32} of one padded batch for the requested ``layers``.

    Layer 0 is the identity on real tokens; rows and columns of padding are zero. With ``rollout`` the maps are
    aggregated from layer 1 up (every block up to the highest requested layer is computed).
    """
    if method not in MIXING_METHODS:
        raise InvalidInputError(f"method={method!r} is not a mixing method; use one of {MIXING_METHODS}")
    base = unwrap_model(model)
    layout_of(base)
    mask = inputs["attention_mask"].float()
    eye = torch.diag_embed(mask)
    top = max(layers)
    needed = list(range(1, top + 1)) if rollout else sorted({layer for layer in layers if layer > 0})
    local = {}
    if needed:
        records = record_blocks(base, inputs, needed, decompose=method != "value_zeroing")
        if method == "value_zeroing":
            total = int(mask.sum().item()) * len(needed)
            with tqdm(total=total, desc="value zeroing", unit="variant", leave=False, disable=None) as bar:
                for layer in needed:
                    pause(base)  # between two blocks' passes: let a waiting exclusive pass of another call run
                    local[layer] = _normalise(value_zeroing_layer(records[layer], mask, internal_batch_size, bar))
        else:
            for layer in needed:
                terms = block_terms(records[layer])
                scores = torch.zeros_like(eye)
                for row in range(mask.shape[0]):
                    keep = mask[row].nonzero().flatten()
                    scores[row, keep[:, None], keep[None, :]] = _decomposition_map(
                        method, records[layer], terms, row, keep)
                local[layer] = _normalise(scores)
    if not rollout:
        return {layer: eye if layer == 0 else local[layer] for layer in layers}
    maps, joint = {0: eye}, eye
    for layer in range(1, top + 1):
        joint = local[layer] @ joint
        maps[layer] = joint
    return {layer: maps[layer] for layer in layers}


@dataclass(frozen=True)
class ContributionMaps:
    """Mixing maps of one text: ``maps[l]`` [T, T] for layers l = 0 (identity) .. L; row i sums to 1."""

    text: str
    text_pair: str | None
    tokens: list[str]
    maps: np.ndarray  # [L + 1, T, T]
    method: str
    rollout: bool


def contribution_maps(model, tokenizer, texts: str | Sequence[str], method: str = "globenc", rollout: bool = False,
                      *, text_pair: str | Sequence[str] | None = None, batch_size: int = 16,
                      internal_batch_size: int = DEFAULT_INTERNAL_BATCH_SIZE, max_length: int | None = None,
                      truncation: str = "warn") -> list[ContributionMaps]:
    """Token-to-token mixing maps of every layer for each text (or text pair), one :class:`ContributionMaps` each.

    ``maps[l, i, j]``: how much token j's representation entering block l contributes to token i's after it
    (GlobEnc, ALTI or Value Zeroing; see the module docstring), or, with ``rollout=True``, how much input token j
    contributes to token i at layer l. ``internal_batch_size``: Value Zeroing variants per block pass.
    """
    if method not in MIXING_METHODS:
        raise InvalidInputError(f"method={method!r} is not allowed; use one of {MIXING_METHODS}")
    check_options({"rollout": rollout, "internal_batch_size": internal_batch_size})
    texts, pairs = text_inputs(texts, text_pair)
    positive_int(batch_size, "batch_size")
    layout_of(unwrap_model(model))
    handle = model_handle(model)
    base, adapter = handle.base, handle.adapter
    num_layers = adapter.num_layers(base)
    encoded = encode(tokenizer, texts, pairs, resolve_max_length(max_length, tokenizer, handle), truncation)
    out = []
    for items, inputs in batches(encoded, handle.rows_per_pass(batch_size), tokenizer, handle.device):
        with handle.using(), torch.no_grad():
            maps = batch_maps(base, inputs, method, list(range(num_layers + 1)), rollout, internal_batch_size)
        stacked = torch.stack([maps[layer] for layer in range(num_layers + 1)], 1).cpu().numpy()
        for row, item in enumerate(items):
            n = len(item.ids)
            out.append(ContributionMaps(item.text, item.text_pair, item.tokens, stacked[row, :, :n, :n],
                                        method, rollout))
    return out


def check_options(options: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(options["rollout"], (bool, np.bool_)):
        raise InvalidInputError(f"rollout must be True or False, got {options['rollout']!r}")
    internal = options.get("internal_batch_size", DEFAULT_INTERNAL_BATCH_SIZE)
    if not isinstance(internal, (int, np.integer)) or isinstance(internal, bool) or internal < 1:
        raise InvalidInputError(f"internal_batch_size must be a positive integer (value-zeroing variants per block "
                                f"pass), got {internal!r}")
    return dict(options, rollout=bool(options["rollout"]))
