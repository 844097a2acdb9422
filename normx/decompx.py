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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .adapters import Adapter, active_module, get_adapter, registered_adapters, unwrap_model
from .adapters.encoder import BlockLayout, Step
from .errors import InvalidInputError, LayerOutOfRangeError, UnsupportedModelError
from .hooks import record_calls
from .methods import Context, Method, Option, register_method
from .sharing import attention_weights, pause, using

BIAS_RULES = ("absdot", "norm", "equal")
CHUNK_ELEMENTS = 2**24  # float32 values per chunk temporary (64 MiB)
FAST_FFN_SOURCES = 2  # the FFN goes through per-target H x H matrices when sources * this >= hidden


# ---- what DecompX needs of a model: its adapter's encoder block layout and head steps -------------------------

def supported_models() -> list[str]:
    """Class names DecompX can decompose (PEFT-wrapped versions included): those whose adapter describes its
    encoder blocks and its head as steps."""
    return sorted(name for name, adapter in registered_adapters().items() if _family_reason(adapter) is None)


def _family_reason(adapter: Adapter) -> str | None:
    if adapter.encoder_block is None or adapter.head_steps is None:
        return (f"DecompX decomposes post-LayerNorm BERT-style encoders and their heads, which the {adapter.family} "
                f"{adapter.kind} adapter does not describe")
    return None


def _unsupported(what: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"DecompX does not support {what}. It supports the BERT-style encoders "
                                 f"(post-LayerNorm blocks): {', '.join(supported_models())} (PEFT-wrapped or not).")


def _check_model(model: nn.Module) -> tuple[nn.Module, Adapter, list[Step], list[nn.Module]]:
    base = unwrap_model(model)
    name = type(base).__name__
    adapter = get_adapter(base)
    if _family_reason(adapter) is not None:
        raise _unsupported(name)
    if getattr(base.config, "is_decoder", False) or getattr(base.config, "add_cross_attention", False):
        raise _unsupported(f"{name} configured as a decoder (is_decoder / add_cross_attention)")
    blocks = adapter.block_modules(base)
    for block in blocks:
        missing = adapter.encoder_block.missing(block)
        if missing is not None:
            raise _unsupported(f"{name} blocks of type {type(block).__name__} (no {missing})")
    return base, adapter, adapter.head_steps(base), blocks


# ---- the model's effective weights -----------------------------------------------------------------------------------

def affine(module: nn.Module, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(W [out, in], b [out]) in float32 of an affine module, so that ``module(x) = x W^T + b``.

    A plain nn.Linear gives its parameters; any other affine module (a LoRA-wrapped Linear, ...) is probed:
    ``b = f(0)``, ``W^T = f(I) - f(0)``, which includes every adapter delta exactly (up to the model dtype's
    rounding). ``rows`` selects output rows (vocabulary columns of an LM decoder).
    """
    module = active_module(module)
    if type(module) is nn.Linear:
        weight, bias = module.weight, module.bias
        if rows is not None:
            weight = weight[rows]
            bias = None if bias is None else bias[rows]
        weight = weight.detach().float()
        bias = torch.zeros(weight.shape[0], device=weight.device) if bias is None else bias.detach().float()
        return weight, bias
    ref = next(module.parameters())
    size = getattr(module, "in_features", None) or ref.shape[-1]
    probe = torch.cat([torch.zeros(1, size), torch.eye(size)]).to(device=ref.device, dtype=ref.dtype)
    with torch.no_grad():
        out = module(probe).float()
    bias, weight = out[0], (out[1:] - out[:1]).T
    if rows is not None:
        weight, bias = weight[rows], bias[rows]
    return weight.contiguous(), bias


def _layer_norm_parameters(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor, float]:
    module = active_module(module)
    if not isinstance(module, nn.LayerNorm):
        raise _unsupported(f"a {type(module).__name__} where DecompX expects an nn.LayerNorm")
    if module.weight is None:  # elementwise_affine=False
        raise _unsupported("a LayerNorm without a learned gain (elementwise_affine=False)")
    weight = module.weight.detach().float()
    bias = torch.zeros_like(weight) if module.bias is None else module.bias.detach().float()
    return weight, bias, float(module.eps)


@dataclass
class BlockWeights:
    """One encoder block's effective float32 weights."""

    heads: int
    value: tuple[torch.Tensor, torch.Tensor]
    attention_out: tuple[torch.Tensor, torch.Tensor]
    ln1: tuple[torch.Tensor, torch.Tensor, float]
    ffn_in: tuple[torch.Tensor, torch.Tensor]
    ffn_out: tuple[torch.Tensor, torch.Tensor]
    ln2: tuple[torch.Tensor, torch.Tensor, float]

    @classmethod
    def of(cls, block: nn.Module, layout: BlockLayout) -> BlockWeights:
        part = layout.parts(block)
        return cls(heads=int(part["attention"].num_attention_heads), value=affine(part["value"]),
                   attention_out=affine(part["attention_out"]), ln1=_layer_norm_parameters(part["ln1"]),
                   ffn_in=affine(part["ffn_in"]), ffn_out=affine(part["ffn_out"]),
                   ln2=_layer_norm_parameters(part["ln2"]))


# ---- the real forward pass -------------------------------------------------------------------------------------------

@dataclass
class Recording:
    """What one forward pass of a batch gives DecompX, per block: attention probabilities [B, heads, T, T], the
    inputs of both LayerNorms [B, T, H], the FFN's pre-activation z and activation f(z) [B, T, I], and the block's
    output x^l [B, T, H]; plus the embedding output x^0 and the attention mask."""

    mask: torch.Tensor
    embeddings: torch.Tensor
    probs: list[torch.Tensor]
    ln1_in: list[torch.Tensor]
    pre_act: list[torch.Tensor]
    act: list[torch.Tensor]
    ln2_in: list[torch.Tensor]
    hidden: list[torch.Tensor]

    def layer(self, layer: int) -> torch.Tensor:
        """x^layer [B, T, H] (0 = embedding output)."""
        return self.embeddings if layer == 0 else self.hidden[layer - 1]


def record(model: nn.Module, inputs: dict[str, torch.Tensor]) -> Recording:
    """Run the (PEFT-unwrapped) model's encoder once on ``inputs`` with eager attention, in eval mode, and record
    what DecompX needs. Hooks are removed on exit, success or not; a hook that never fired is an error."""
    base, adapter, _, blocks = _check_model(model)
    def first(output):
        return output[0] if isinstance(output, (tuple, list)) else output

    def second(output):
        return output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None

    def same(output):
        return output

    outputs = {"x0": (adapter.embedding_module(base, "layer"), first)}
    inputs_of = {}
    for i, block in enumerate(blocks):
        part = adapter.encoder_block.parts(block)
        outputs[f"probs{i}"] = (part["attention"], second)
        outputs[f"z{i}"] = (part["ffn_in"], same)
        outputs[f"a{i}"] = (part["ffn_act"], same)
        outputs[f"h{i}"] = (block, first)
        inputs_of[f"ln1_{i}"] = part["ln1"]
        inputs_of[f"ln2_{i}"] = part["ln2"]
    modules = {**{key: module for key, (module, _) in outputs.items()}, **inputs_of}
    with attention_weights(base), torch.no_grad(), record_calls(modules) as calls:
        base.base_model(**inputs)
    store: dict[str, Any] = {key: pick(calls[key].output) for key, (_, pick) in outputs.items()}
    store.update({key: calls[key].args[0] for key in inputs_of})
    n = len(blocks)
    if any(store[f"probs{i}"] is None for i in range(n)):
        raise UnsupportedModelError(f"{type(base).__name__}'s self-attention returned no attention probabilities "
                                    "under eager attention; DecompX needs them")
    mask = inputs.get("attention_mask")
    if mask is None:
        mask = torch.ones(store["x0"].shape[:2], dtype=torch.long, device=store["x0"].device)
    return Recording(mask=mask, embeddings=store["x0"], probs=[store[f"probs{i}"] for i in range(n)],
                     ln1_in=[store[f"ln1_{i}"] for i in range(n)], pre_act=[store[f"z{i}"] for i in range(n)],
                     act=[store[f"a{i}"] for i in range(n)], ln2_in=[store[f"ln2_{i}"] for i in range(n)],
                     hidden=[store[f"h{i}"] for i in range(n)])


# ---- the decomposition rules -----------------------------------------------------------------------------------------

def share_bias(parts: torch.Tensor, bias: torch.Tensor, rule: str = "absdot") -> torch.Tensor:
    """Add ``bias`` [D] to ``parts`` [S, N, D] (S sources) split over the sources by ``rule``; the shares of each
    target sum to 1, so ``parts.sum(0)`` gains exactly ``bias``."""
    if rule == "absdot":
        weights = (parts @ bias).abs()
    elif rule == "norm":
        weights = parts.norm(dim=-1)
    else:  # equal
        weights = (parts != 0).any(-1).to(parts.dtype)
    total = weights.sum(0, keepdim=True)
    shares = torch.where(total > 0, weights / total.clamp_min(torch.finfo(parts.dtype).tiny),
                         torch.full_like(weights, 1.0 / parts.shape[0]))
    return parts + shares[..., None] * bias


def layer_norm(parts: torch.Tensor, real_input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
               include_biases: bool, rule: str) -> torch.Tensor:
    """LayerNorm of ``parts`` [S, N, D] whose sum is ``real_input`` [N, D]: centred per part, divided by the real
    input's standard deviation, scaled by the gain; the LayerNorm's bias shared out."""
    real = real_input.float()
    scale = torch.rsqrt(real.var(-1, unbiased=False, keepdim=True) + eps)  # [N, 1]
    out = (parts - parts.mean(-1, keepdim=True)) * scale * weight
    return share_bias(out, bias, rule) if include_biases else out


def zo_slope(pre: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
    """The zero-origin slope f(z)/z of an activation (0 where z = 0, where f(0) = 0 makes any slope exact)."""
    pre, post = pre.float(), post.float()
    nonzero = pre != 0
    return torch.where(nonzero, post / torch.where(nonzero, pre, torch.ones_like(pre)), torch.zeros_like(pre))


def _affine_parts(parts: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, include_biases: bool, rule: str
                  ) -> torch.Tensor:
    out = parts @ weight.T
    return share_bias(out, bias, rule) if include_biases else out


def _ffn(x: torch.Tensor, w: BlockWeights, slope: torch.Tensor, include_biases: bool, rule: str) -> torch.Tensor:
    """The FFN on parts ``x`` [S, N, H] with slopes [N, I]: ``W2 (slope * (W1 x_s + share_s b1)) + share'_s b2``.

    With many sources (and absdot or no biases) it goes through the per-target matrix ``W2 diag(slope_t) W1``
    [N, H, H] instead of the [S, N, I] intermediate: the same result (absdot's ``<W1 x_s, b1> = <x_s, W1^T b1>``)
    for about half the arithmetic on long texts.
    """
    (w1, b1), (w2, b2) = w.ffn_in, w.ffn_out
    sources, _, hidden = x.shape
    if rule != "absdot" or sources * FAST_FFN_SOURCES < hidden:
        f = _affine_parts(x, w1, b1, include_biases, rule) * slope
        return _affine_parts(f, w2, b2, include_biases, rule)
    equivalent = (w2 * slope[:, None, :]) @ w1  # [N, H, H]
    f = torch.bmm(x.transpose(0, 1), equivalent.transpose(1, 2)).transpose(0, 1)  # [S, N, H]
    if not include_biases:
        return f
    weights = (x @ (w1.T @ b1)).abs()  # |<W1 x_s, b1>|, [S, N]
    total = weights.sum(0, keepdim=True)
    shares = torch.where(total > 0, weights / total.clamp_min(torch.finfo(x.dtype).tiny),
                         torch.full_like(weights, 1.0 / sources))
    f = f + shares[..., None] * ((slope * b1) @ w2.T)  # the shared b1 through the activation and W2
    return share_bias(f, b2, rule)


def _block(state: torch.Tensor, w: BlockWeights, probs: torch.Tensor, ln1_in: torch.Tensor, slope: torch.Tensor,
           ln2_in: torch.Tensor, first: bool, include_biases: bool, rule: str, chunk_elements: int) -> None:
    """Propagate ``state`` [S, T, H] (sources x targets) through one block, in place."""
    sources, tokens, hidden = state.shape
    heads = w.heads
    size = w.value[0].shape[0] // heads
    wv, bv = w.value
    wo, bo = w.attention_out
    # value projections of every source's vectors, laid out per head for the attention mix: [heads, T, S * d]
    values = torch.empty(heads, tokens, sources, size, device=state.device, dtype=state.dtype)
    diagonal = torch.arange(tokens, device=state.device)
    for h in range(heads):
        rows = slice(h * size, (h + 1) * size)
        v = state @ wv[rows].T  # [S, T, d]
        if first and include_biases:  # x^0 is diagonal: a value's bias belongs to its own token
            v[diagonal, diagonal] += bv[rows]
        values[h] = v.transpose(0, 1)
    values = values.view(heads, tokens, sources * size)
    attention_bias = bo if first else wo @ bv + bo
    width = max(w.ffn_in[0].shape[0], hidden)
    chunk = max(1, chunk_elements // max(1, sources * width, hidden * width))
    for start in range(0, tokens, chunk):
        t = slice(start, min(tokens, start + chunk))
        n = t.stop - t.start
        mixed = torch.bmm(probs[:, t].float(), values)  # [heads, n, S * d]
        mixed = mixed.view(heads, n, sources, size).permute(2, 1, 0, 3).reshape(sources, n, heads * size)
        x = mixed @ wo.T + state[:, t]
        del mixed
        if include_biases:
            x = share_bias(x, attention_bias, rule)
        x = layer_norm(x, ln1_in[t], *w.ln1, include_biases, rule)
        f = _ffn(x, w, slope[t], include_biases, rule)
        state[:, t] = layer_norm(x + f, ln2_in[t], *w.ln2, include_biases, rule)


@torch.no_grad()
def propagate(weights: Sequence[BlockWeights], rec: Recording, row: int, *, include_biases: bool = True,
              bias_rule: str = "absdot", chunk_elements: int = CHUNK_ELEMENTS) -> Iterator[torch.Tensor]:
    """Yield the decomposition of text ``row`` at layers 0, 1, ..., L: a float32 tensor [S, T, H] over its real
    (non-padding) tokens, ``[s, t]`` = source s's part of token t. Its sum over sources is x^l. The same tensor is
    updated in place from one layer to the next: clone what you keep."""
    keep = rec.mask[row].nonzero().flatten()
    x0 = rec.embeddings[row, keep].float()
    n = keep.numel()
    state = torch.zeros(n, n, x0.shape[-1], device=x0.device)
    diagonal = torch.arange(n, device=x0.device)
    state[diagonal, diagonal] = x0
    yield state
    for i, w in enumerate(weights):
        probs = rec.probs[i][row][:, keep][:, :, keep]
        slope = zo_slope(rec.pre_act[i][row, keep], rec.act[i][row, keep])
        _block(state, w, probs, rec.ln1_in[i][row, keep], slope, rec.ln2_in[i][row, keep], i == 0, include_biases,
               bias_rule, chunk_elements)
        yield state


@torch.no_grad()
def decompose_head(steps: Sequence[Step], parts: torch.Tensor, real: torch.Tensor, *, include_biases: bool = True,
                   bias_rule: str = "absdot", columns: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Decompose the head on one pooled token: ``parts`` [S, H] summing to ``real`` [H].

    Returns (contributions [S, C], outputs [C]): each source's share of the head's outputs, and the head run on
    ``real`` in float32 (what the contributions sum to). ``columns`` selects the last linear's output rows.
    """
    parts, x = parts.float()[:, None, :], real.float()[None, :]
    for i, step in enumerate(steps):
        if step.kind == "linear":
            weight, bias = affine(step.module, columns if i == len(steps) - 1 else None)
            parts = _affine_parts(parts, weight, bias, include_biases, bias_rule)
            x = x @ weight.T + bias
        elif step.kind == "activation":
            fx = step.module(x)
            parts = parts * zo_slope(x, fx)
            x = fx
        else:
            weight, bias, eps = _layer_norm_parameters(step.module)
            parts = layer_norm(parts, x, weight, bias, eps, include_biases, bias_rule)
            x = F.layer_norm(x, x.shape[-1:], weight, bias, eps)
    return parts[:, 0], x[0]


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
        if adapter.kind != "sequence_classification":
            raise InvalidInputError("a masked-LM head explains the prediction at the mask token: pass pooled=[B] "
                                    "positions of the mask token")
        real = mask if mask is not None else torch.ones_like(inputs["input_ids"])
        positions = torch.arange(real.shape[1], device=real.device)
        pooled = (real * (real.shape[1] - positions)).argmax(-1)
    with using(base), torch.no_grad():  # eval mode: no dropout, in LoRA layers' probes either
        weights = [BlockWeights.of(block, adapter.encoder_block) for block in blocks]
        rec = record(base, inputs)
        batch, tokens, hidden = rec.embeddings.shape
        device = rec.embeddings.device
        vectors = torch.zeros(batch, len(layers), tokens, hidden, device=device)
        norms = torch.zeros(num_layers + 1, batch, tokens, tokens, device=device) if maps else None
        contributions, outputs = [], []
        for row in range(batch):
            pause(base)  # let a waiting eager-attention pass of another call run
            keep = rec.mask[row].nonzero().flatten()
            where = (keep == pooled[row]).nonzero().flatten()
            if where.numel() == 0:
                raise InvalidInputError(f"text {row}: pooled position {int(pooled[row])} is a padding position")
            target = int(where[0])
            index = torch.meshgrid(keep, keep, indexing="ij")
            for layer, state in enumerate(propagate(weights, rec, row, include_biases=include_biases,
                                                    bias_rule=bias_rule, chunk_elements=chunk_elements)):
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


# ---- the registered method -------------------------------------------------------------------------------------------

def _decompx(ctx: Context) -> torch.Tensor:
    run, labels = ctx.run, ctx.labels
    options = ctx.options
    rows = torch.arange(ctx.columns.shape[0], device=ctx.columns.device)
    vocab = None
    columns, foil = ctx.columns, ctx.foil
    if labels.is_vocabulary:  # decompose only the wanted vocabulary columns
        wanted = columns if foil is None else torch.cat([columns, foil[:, None]], dim=1)
        vocab, index = torch.unique(wanted, return_inverse=True)
        columns, foil = (index, None) if foil is None else (index[:, :-1], index[:, -1])
    result = decompose(run.model, run.inputs, run.layers, pooled=run.pooled, columns=vocab,
                       include_biases=options["include_biases"], bias_rule=options["bias_rule"])
    # the model's own head on x^l of the pooled token, for the conservation diagnostic
    model_out = torch.stack([run.adapter.head(run.model, run.head_input(layer)[rows, run.pooled], vocab).float()
                             for layer in result.layers], dim=1)  # [B, layers, C]
    contributions = result.contributions  # [B, layers, T, C]
    if labels.regression:
        error = (contributions.sum(2) - model_out).abs().amax(dim=(1, 2))[:, None]
        ctx.diagnostics["decomposition_error"] = error
        return ctx.expand(result.vectors.norm(dim=-1))
    k = columns.shape[1]
    index = columns[:, None, None, :].expand(-1, contributions.shape[1], contributions.shape[2], -1)
    scores = torch.gather(contributions, 3, index)  # [B, layers, T, K]
    expected = torch.gather(model_out, 2, columns[:, None, :].expand(-1, model_out.shape[1], -1))  # [B, layers, K]
    if foil is not None:
        scores = scores - torch.gather(contributions, 3, foil[:, None, None, None].expand(*scores.shape[:3], 1))
        expected = expected - torch.gather(model_out, 2, foil[:, None, None].expand(-1, model_out.shape[1], 1))
    ctx.diagnostics["decomposition_error"] = (scores.sum(2) - expected).abs().amax(dim=1).reshape(-1, k)
    return scores.permute(0, 3, 1, 2)


register_method(Method(
    "decompx", _decompx,
    "DecompX: each token's decomposed vector propagated through every block (attention, residuals, LayerNorms, "
    "FFN with zero-origin GeLU) and the head; the token's share of the target logit at the layer (regression: the "
    "l2 norm of its vector); BERT, RoBERTa, XLM-R, ELECTRA",
    display="DecompX", supports=_family_reason, diagnostics=("decomposition_error",),
    options=[Option("include_biases", True, "share the biases out over the source tokens (without them the "
                    "decomposition no longer sums to the model's output)", bool, flag="--no-biases"),
             Option("bias_rule", "absdot", "how biases are shared out over the source tokens", str, BIAS_RULES)],
    # measured on MiniLM (CPU): ~19x a forward pass at 40 tokens, 68x at 128, 156x at 256 (vectors per token pair)
    cost=lambda tokens, targets, options: 1 + 0.6 * tokens))
