"""DecompX (Modarressi, Fayyaz et al., ACL 2023) on stock transformers, from the paper's rules.

DecompX follows every token's representation as a sum of one vector per *source* token,
``x_t^l = sum_s x_{t<-s}^l``, through each encoder block and the head, using the model's own weights
(PEFT/LoRA layers included) and the attention probabilities and LayerNorm / activation inputs of one real
forward pass (captured with forward hooks; the model is not modified).

Rules (the paper's configuration: biases included by ``"absdot"``, LN1, FFN with ``"GeLU_ZO"``, LN2, vector
aggregation, classifier with pooler, tanh ``"ZO"``):

- layer 0: token t's embedding-layer output ``x_t^0`` (``hidden_states[0]``) is all its own: ``x_{t<-s}^0 = 0``
  for ``s != t``.
- attention: ``sum_h sum_u A^h_{tu} W_O^h W_V^h x_{u<-s}`` per source, plus the residual ``x_{t<-s}``. As in the
  reference implementation, the first block's value bias goes with the value's own token; in later blocks the
  attention bias ``W_O b_V + b_O`` (attention rows sum to 1) is shared out.
- a bias ``b`` is shared out over the sources by the absolute-dot rule: source s gets
  ``|<v_s, b>| / sum_s' |<v_s', b>|`` of it (``bias_rule="norm"``: by ``||v_s||``; ``"equal"``: equally over the
  sources with a nonzero vector).
- LayerNorm: ``gamma * (v_s - mean(v_s)) / sqrt(var(x) + eps)`` with ``var(x)`` of the real input, ``beta`` shared.
- activations (GeLU in the FFN, tanh / GeLU in the head), zero-origin slope ("ZO"): every source's pre-activation
  vector is scaled elementwise by ``f(z) / z`` of the real pre-activation ``z``.
- the head (BERT: pooler dense, tanh, classifier; RoBERTa / XLM-R: dense, tanh, out_proj; ELECTRA: dense, GeLU,
  out_proj; masked-LM heads: dense, activation, LayerNorm, decoder) is decomposed with the same rules on the pooled
  token's vectors.

Conservation: every rule above is exact in sum over sources (a linear map is linear, a LayerNorm with the real
variance is linear up to the shared beta, ``f(z)/z * sum_s z_s = f(z)``, shared biases add up to the bias), so with
``include_biases=True`` the decomposed vectors sum to the model's actual hidden state at every layer and the head
contributions sum to the model's logits, to floating-point rounding (tests: <= 1e-4 relative on tiny models and the
real MiniLM in float32). The ZO rule is an *attribution* choice, not an approximation of the sum. With
``include_biases=False`` the biases are dropped and the sums no longer reproduce the model.

What the ``decompx`` method reports, shape [batch, targets, layers, tokens]:

- classification (and masked-LM) heads: the contribution of each source token to the target logit (signed; minus
  the foil's, for contrastive targets). At layer ``l`` the head is applied to the layer-``l`` decomposition of the
  pooled token (as the NormXLogit paper's layer-wise experiment): the scores sum to the model's head on ``x^l`` of
  the pooled token. Layer 0 puts everything on the pooled token itself (nothing has mixed yet).
- regression (``num_labels=1``): the l2 norm of each source's decomposed vector of the pooled token at layer ``l``
  (the NormXLogit paper's choice for STS-B): unsigned, label-free.

Its ``decomposition_error`` diagnostic is, per text and target, the largest ``|sum of the scores - the model's own
head output|`` over the requested layers (for regression: of the head contributions), i.e. the measured
conservation error.

Memory and time: a text of n tokens holds two [n, n, hidden] float32 tensors (the state and the value
projections): for 512 tokens 0.8 GB for MiniLM (hidden 384), 1.6 GB for BERT-base. Texts are decomposed one at a
time at their own length (no padding), and each block's per-target work runs in chunks of target tokens whose
temporaries stay within ``chunk_elements`` float32 values. The arithmetic grows as n^2 per block (every source
through every target's FFN). Measured on one 512-token MiniLM input on a shared 2-core CPU
(``pytest -m slow tests/test_decompx.py -k 512 -s``, two runs): peak RSS +1.14 / +1.19 GB over the loaded model,
127 / 137 s, logits reproduced to 1.3e-8.

Half-precision models: the decomposition runs in float32 on the model's rounded activations; its sums match the
model's own logits to the model's rounding (measured on a tiny BERT: bf16 0.018, fp16 0.0015 on logits of ~1.7).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral

from normx._torch import nn, torch
from normx.core.concurrency import pause, using
from normx.errors import InvalidInputError, LayerOutOfRangeError
from normx.methods.decompx.model import BlockWeights, _check_model, record
from normx.methods.decompx.rules import (
    BIAS_RULES,
    CHUNK_ELEMENTS,
    decompose_head,
    propagate,
)
from normx.models import HeadKind

__all__ = ["Decomposition", "class_contributions", "contribution_maps", "decompose"]


# ---- the public entry points -----------------------------------------------------------------------------------------

@dataclass
class Decomposition:
    """DecompX of one batch.

    - ``layers``: the layers decomposed through the head (0 = embedding output, L = last block).
    - ``pooled`` [B]: the position whose head output is explained.
    - ``vectors`` [B, layers, T, H]: each source token's part of the pooled token's x^l.
    - ``contributions`` [B, layers, T, C]: each source token's part of the head's outputs on x^l of the pooled
      token (C classes, or the requested vocabulary ``columns``); zeros at padding.
    - ``outputs`` [B, layers, C]: the head on the real x^l of the pooled token (the sum of the contributions).
    - ``maps`` [L + 1, B, T, T] (if asked for): ``maps[l, b, t, s] = ||x_{t<-s}^l||``, row t = the represented
      token, column s = the source; layer 0 is diagonal.
    """

    layers: list[int]
    pooled: torch.Tensor
    vectors: torch.Tensor
    contributions: torch.Tensor
    outputs: torch.Tensor
    maps: torch.Tensor | None = None


def check_options(include_biases, bias_rule) -> None:
    if not isinstance(include_biases, bool):
        raise InvalidInputError(f"include_biases must be True or False, got {include_biases!r}")
    if not isinstance(bias_rule, str) or bias_rule not in BIAS_RULES:
        raise InvalidInputError(f"bias_rule={bias_rule!r} is not allowed; use one of {BIAS_RULES}")


def decompose(model: nn.Module, inputs: dict[str, torch.Tensor], layers: Sequence[int] | None = None, *,
              pooled: torch.Tensor | None = None, columns: torch.Tensor | None = None, include_biases: bool = True,
              bias_rule: str = "absdot", maps: bool = False, chunk_elements: int = CHUNK_ELEMENTS) -> Decomposition:
    """DecompX of a batch (``inputs`` as the tokenizer gives them, padded on either side).

    Args:
        model: a supported model (:func:`supported_models`), PEFT-wrapped or not.
        layers: layers whose pooled-token decomposition goes through the head (default: the last one); ``[]`` for
            none (e.g. only ``maps``).
        pooled: [B] positions of the token the head reads; default: the first real token (classification heads).
            Masked-LM heads need it (the mask token's position).
        columns: vocabulary ids to decompose for a masked-LM head (1-D, shared by the batch); default: all outputs.
        include_biases, bias_rule: see the module docstring.
        maps: also return the per-layer token-to-token contribution norms.
        chunk_elements: float32 values per chunk temporary (memory knob).
    """
    check_options(include_biases, bias_rule)
    base, adapter, steps, blocks = _check_model(model)
    num_layers = len(blocks)
    layers = [num_layers] if layers is None else list(layers)
    for layer in layers:
        if isinstance(layer, bool) or not isinstance(layer, Integral) or not -(num_layers + 1) <= layer <= num_layers:
            raise LayerOutOfRangeError(f"layer {layer!r} is out of range: this model has {num_layers} layers, so "
                                       f"layers are 0..{num_layers} (or -1..-{num_layers + 1} from the end)")
    layers = sorted({int(layer) % (num_layers + 1) for layer in layers})
    mask = inputs.get("attention_mask")
    if pooled is not None:
        pooled = torch.as_tensor(pooled, device=inputs["input_ids"].device)
    else:
        if adapter.kind is not HeadKind.SEQUENCE_CLASSIFICATION:
            raise InvalidInputError("a masked-LM head explains the prediction at the mask token: pass pooled=[B] "
                                    "positions of the mask token")
        real = mask if mask is not None else torch.ones_like(inputs["input_ids"])
        pooled = adapter.pooled_positions(base.config, {**inputs, "attention_mask": real})
    with using(base), torch.no_grad():  # eval mode: no dropout, in LoRA layers' probes either
        weights = [BlockWeights.of(block, adapter.encoder_block) for block in blocks]
        rec = record(base, inputs)
        batch, tokens, hidden = rec.embeddings.shape
        device = rec.embeddings.device
        vectors = torch.zeros(batch, len(layers), tokens, hidden, device=device)
        norms = torch.zeros(num_layers + 1, batch, tokens, tokens, device=device) if maps else None
        contributions, outputs = [], []
        for row in range(batch):
            keep = rec.mask[row].nonzero().flatten()
            where = (keep == pooled[row]).nonzero().flatten()
            if where.numel() == 0:
                raise InvalidInputError(f"text {row}: pooled position {int(pooled[row])} is a padding position")
            target = int(where[0])
            index = torch.meshgrid(keep, keep, indexing="ij")
            for layer, state in enumerate(propagate(weights, rec, row, include_biases=include_biases,
                                                    bias_rule=bias_rule, chunk_elements=chunk_elements)):
                pause(base)  # between two layers (and rows): let a waiting eager-attention pass of another call run
                if layer in layers:
                    vectors[row, layers.index(layer), keep] = state[:, target]
                if norms is not None:
                    norms[layer, row][index] = state.norm(dim=-1).T
            row_contributions, row_outputs = [], []
            for j, layer in enumerate(layers):
                part, out = decompose_head(steps, vectors[row, j, keep], rec.layer(layer)[row, pooled[row]],
                                           include_biases=include_biases, bias_rule=bias_rule, columns=columns)
                full = torch.zeros(tokens, part.shape[-1], device=device)
                full[keep] = part
                row_contributions.append(full)
                row_outputs.append(out)
            if layers:
                contributions.append(torch.stack(row_contributions))
                outputs.append(torch.stack(row_outputs))
    width = len(columns) if columns is not None else None
    if layers:
        contributions_t, outputs_t = torch.stack(contributions), torch.stack(outputs)
    else:
        contributions_t = torch.zeros(batch, 0, tokens, width or 0, device=device)
        outputs_t = torch.zeros(batch, 0, width or 0, device=device)
    return Decomposition(layers=layers, pooled=pooled, vectors=vectors, contributions=contributions_t,
                         outputs=outputs_t, maps=norms)


def class_contributions(model: nn.Module, inputs: dict[str, torch.Tensor], **options) -> torch.Tensor:
    """Each token's contribution to each class logit [B, T, C] at the last layer (sums to the logits)."""
    return decompose(model, inputs, **options).contributions[:, -1]


def contribution_maps(model: nn.Module, inputs: dict[str, torch.Tensor], **options) -> torch.Tensor:
    """Per-layer token-to-token contribution norms [L + 1, B, T, T]: ``[l, b, t, s] = ||x_{t<-s}^l||`` (row t is the
    represented token, column s the source; layer 0 is diagonal; zeros at padding)."""
    return decompose(model, inputs, [], maps=True, **options).maps
