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
try/finally, like :func:`normx.hooks.capture`) record each block's input and output, the value projection's output,
the attention probabilities and both LayerNorms' inputs; LayerNorm statistics are the real ones (biased variance +
eps, as ``nn.LayerNorm``). The output projection's linear part is ``dense(I) - dense(0)`` of the model's own (possibly
LoRA-wrapped) module, so PEFT adapters count with their effective weights. GlobEnc and ALTI need the attention
probabilities, which SDPA does not return: the model runs with eager attention for that pass, and its attention
setting is restored afterwards (also on errors).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from .adapters import Adapter, active_module, get_adapter, registered_adapters, unwrap_model
from .adapters.encoder import BlockLayout
from .errors import InvalidInputError, UnsupportedModelError
from .hooks import Call, output_tensor, record_calls, replace_outputs
from .inputs import as_text_list, collate, encode, pad_token_id, resolve_max_length
from .methods import Context, Method, Option, register_method
from .sharing import attention_weights, pause, using

MIXING_METHODS = ("globenc", "alti", "value_zeroing")
DEFAULT_INTERNAL_BATCH_SIZE = 64  # value-zeroing variants per block pass
_ROWS_PER_CHUNK = 2**24  # decomposition: at most this many floats per [rows, T, hidden] chunk


# ---- what the mixing methods need of a model: its adapter's encoder block layout ------------------------------

def supported_models() -> list[str]:
    """Class names GlobEnc, ALTI and Value Zeroing support (PEFT-wrapped or not): those whose adapter describes
    their encoder blocks."""
    return sorted(name for name, adapter in registered_adapters().items() if adapter.encoder_block is not None)


def family_reason(adapter: Adapter) -> str | None:
    """Why a model family is not supported (None: it is)."""
    if adapter.encoder_block is None:
        return (f"GlobEnc, ALTI and Value Zeroing decompose post-LayerNorm BERT-style encoder blocks, which the "
                f"{adapter.family} {adapter.kind} adapter does not describe")
    return None


def layout_of(model: nn.Module) -> BlockLayout:
    """The block layout of ``model``; :class:`UnsupportedModelError` naming the supported classes otherwise."""
    base = unwrap_model(model)
    name = type(base).__name__
    adapter = get_adapter(base)
    if adapter.encoder_block is None:
        raise UnsupportedModelError(
            f"GlobEnc, ALTI and Value Zeroing decompose post-LayerNorm BERT-style encoder blocks and do not support "
            f"{name}. Supported model classes (PEFT-wrapped or not): {', '.join(supported_models())}")
    config = base.config
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        raise UnsupportedModelError(f"this {name} is configured as a decoder (is_decoder / add_cross_attention); "
                                    "the mixing methods support bidirectional encoders only")
    return adapter.encoder_block


def zeroed_values(value_module: nn.Module, positions: torch.Tensor):
    """While active, row k of every batch through ``value_module`` gets its value vector at ``positions[k]`` zeroed."""
    def zero(output):
        rows = torch.arange(output.shape[0], device=output.device)
        output = output.clone()
        output[rows, positions] = 0
        return output

    return replace_outputs(value_module, zero)


# ---- the real pass -------------------------------------------------------------------------------------------------

@dataclass
class BlockRecord:
    """What one block saw and produced on the real forward pass."""

    block: nn.Module
    parts: dict[str, nn.Module]
    call: Call  # the block's own call: args[0] = its input x^(l-1); output = x^l
    probs: torch.Tensor | None = None  # [B, heads, T, T]
    value: torch.Tensor | None = None  # value projection output [B, T, hidden]
    ln1_in: torch.Tensor | None = None
    ln1_out: torch.Tensor | None = None
    ln2_in: torch.Tensor | None = None

    @property
    def input(self) -> torch.Tensor:
        return self.call.args[0]

    @property
    def output(self) -> torch.Tensor:
        return output_tensor(self.call.output)


def record_blocks(model: nn.Module, inputs: dict[str, torch.Tensor], layers: Sequence[int], decompose: bool
                  ) -> dict[int, BlockRecord]:
    """One forward pass of the (PEFT-unwrapped) ``model`` on ``inputs``, recording blocks ``layers`` (1-based).

    ``decompose`` also records what GlobEnc / ALTI need (attention probabilities: eager attention for this pass).
    """
    base = unwrap_model(model)
    layout = layout_of(base)
    blocks = get_adapter(base).block_modules(base)
    modules: dict[str, nn.Module] = {}
    parts = {}
    for layer in layers:
        block = blocks[layer - 1]
        parts[layer] = layout.parts(block)
        modules[f"{layer}.block"] = block
        if decompose:
            for name in ("attention", "value", "ln1", "ln2"):
                modules[f"{layer}.{name}"] = parts[layer][name]
    with (attention_weights(base) if decompose else nullcontext()), record_calls(modules) as store:
        base.base_model(**inputs)
    records = {}
    for layer in layers:
        rec = BlockRecord(blocks[layer - 1], parts[layer], store[f"{layer}.block"])
        if decompose:
            attention_out = store[f"{layer}.attention"].output
            probs = attention_out[1] if isinstance(attention_out, (tuple, list)) and len(attention_out) > 1 else None
            if probs is None:
                raise RuntimeError(f"block {layer}'s attention returned no attention probabilities even with eager "
                                   "attention; this transformers version is not supported by normx.mixing")
            rec.probs = probs
            rec.value = output_tensor(store[f"{layer}.value"].output)
            rec.ln1_in = store[f"{layer}.ln1"].args[0]
            rec.ln1_out = output_tensor(store[f"{layer}.ln1"].output)
            rec.ln2_in = store[f"{layer}.ln2"].args[0]
        records[layer] = rec
    return records


# ---- decomposition (GlobEnc, ALTI) -----------------------------------------------------------------------------------

def _wide(t: torch.Tensor) -> torch.Tensor:
    """The precision the decomposition works in: float32, or float64 for float64 models."""
    return t if t.dtype == torch.float64 else t.float()


def _layer_norm_params(ln: nn.Module, size: int, device) -> tuple[torch.Tensor, torch.Tensor, float]:
    ln = active_module(ln)  # a LayerNorm in PEFT's modules_to_save: the active copy
    weight = _wide(ln.weight) if getattr(ln, "weight", None) is not None else torch.ones(size, device=device)
    bias = _wide(ln.bias) if getattr(ln, "bias", None) is not None else torch.zeros(size, device=device)
    return weight, bias, float(ln.eps)


def _scale(z: torch.Tensor, eps: float) -> torch.Tensor:
    """The LayerNorm denominator sqrt(Var[z] + eps) of each row of z [..., hidden] (biased variance)."""
    z = _wide(z)
    return torch.sqrt(z.var(-1, unbiased=False) + eps)


@dataclass
class BlockTerms:
    """The per-block constants of the decomposition, from the model's own modules."""

    w_o: torch.Tensor  # [heads, head_size, hidden]: the output projection's linear part, per head
    b_o: torch.Tensor  # [hidden]: its bias, dense(0)
    ln1: tuple[torch.Tensor, torch.Tensor, float]  # gamma, beta, eps
    ln2: tuple[torch.Tensor, torch.Tensor, float]


def block_terms(rec: BlockRecord) -> BlockTerms:
    """W_O's linear part as dense(I) - dense(0) of the model's own (possibly LoRA-wrapped) output projection."""
    attention, dense = rec.parts["attention"], rec.parts["attention_out"]
    heads, size = attention.num_attention_heads, attention.attention_head_size
    hidden = rec.value.shape[-1]
    eye = torch.eye(hidden, dtype=rec.value.dtype, device=rec.value.device)
    b_o = _wide(dense(eye[:1] * 0))
    rows = _wide(dense(eye)) - b_o  # row k: W_O e_k
    return BlockTerms(rows.view(heads, size, hidden), b_o[0],
                      _layer_norm_params(rec.parts["ln1"], hidden, eye.device),
                      _layer_norm_params(rec.parts["ln2"], hidden, eye.device))


def _centred(t: torch.Tensor, *gammas: torch.Tensor) -> torch.Tensor:
    """LayerNorm's linear part without the division: t -> gamma * (t - mean(t)), once per gamma."""
    for gamma in gammas:
        t = gamma * (t - t.mean(-1, keepdim=True))
    return t


def decompose(rec: BlockRecord, row: int, keep: torch.Tensor, queries: torch.Tensor, gammas: Sequence[torch.Tensor],
              scale: torch.Tensor, terms: BlockTerms) -> torch.Tensor:
    """sum_h A^h_ij W_O^h v_j^h + [i = j] x_i for queries i and sources j = ``keep`` of text ``row``, pushed through
    the LayerNorms' linear parts (``gammas``) and divided by ``scale`` [Q]: [Q, S, hidden].

    v_j (with its bias) is the real value projection output. The map is linear, so it is applied to the per-head
    vectors W_O^h v_j^h and to x_i before the attention weights mix them: one batched product, no [Q, S, hidden]
    intermediate besides the result.
    """
    heads, size, _ = terms.w_o.shape
    value = _wide(rec.value[row, keep]).view(-1, heads, size).transpose(0, 1)  # [H, S, size]
    sources = _centred(torch.bmm(value, terms.w_o), *gammas)  # [H, S, hidden]
    probs = _wide(rec.probs[row][:, queries][:, :, keep]) / scale[None, :, None]  # [H, Q, S]
    # a batched product over sources (contiguous operands: a strided bmm is ~25x slower on CPU)
    mixed = torch.bmm(probs.permute(2, 1, 0).contiguous(), sources.transpose(0, 1).contiguous()).transpose(0, 1)
    source_of = torch.full((rec.probs.shape[-1],), -1, dtype=torch.long, device=keep.device)
    source_of[keep] = torch.arange(keep.numel(), device=keep.device)
    residual = _centred(_wide(rec.input[row, queries]), *gammas) / scale[:, None]
    mixed[torch.arange(queries.numel(), device=keep.device), source_of[queries]] += residual  # token i itself
    return mixed


def ln1_decomposition(rec: BlockRecord, row: int, keep: torch.Tensor, queries: torch.Tensor,
                      terms: BlockTerms | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The first LayerNorm's output for query positions ``queries`` of text ``row``, decomposed over sources ``keep``.

    Returns (T [Q, S, hidden], bias [Q, hidden]), float32 (float64 for float64 models), with
    sum_j T[:, j] + bias == the real LN1 output:
    T_i(x_j) = g1 * (y_ij - mean(y_ij)) / s1_i, y_ij = sum_h A^h_ij W_O^h v_j^h + [i = j] x_i; the bias collects
    b_O and the LayerNorm's beta. ``queries`` index positions of the padded sequence; they must be among ``keep``.
    """
    terms = block_terms(rec) if terms is None else terms
    gamma, beta, eps = terms.ln1
    scale = _scale(rec.ln1_in[row, queries], eps)  # [Q]
    vectors = decompose(rec, row, keep, queries, [gamma], scale, terms)
    bias = _centred(terms.b_o, gamma) / scale[:, None] + beta
    return vectors, bias


def _decomposition_map(method: str, rec: BlockRecord, terms: BlockTerms, row: int, keep: torch.Tensor
                       ) -> torch.Tensor:
    """GlobEnc's N_Enc norms or ALTI's contributions, unnormalised, for text ``row``'s kept tokens: [S, S]."""
    n, hidden = keep.numel(), terms.b_o.numel()
    step = max(1, _ROWS_PER_CHUNK // max(1, n * hidden))
    out = []
    for start in range(0, n, step):
        queries = keep[start:start + step]
        if method == "globenc":  # through LN1 and LN2 (its real statistics), bypassing the FFN
            (gamma1, _, eps1), (gamma2, _, eps2) = terms.ln1, terms.ln2
            scale = _scale(rec.ln1_in[row, queries], eps1) * _scale(rec.ln2_in[row, queries], eps2)
            out.append(decompose(rec, row, keep, queries, [gamma1, gamma2], scale, terms).norm(dim=-1))
        else:  # alti
            vectors, _ = ln1_decomposition(rec, row, keep, queries, terms)
            resultant = _wide(rec.ln1_out[row, queries])[:, None, :]  # y_i, the real LN1 output
            distance = (resultant - vectors).abs().sum(-1)
            out.append((resultant.abs().sum(-1) - distance).clamp(min=0))
    return torch.cat(out)


# ---- Value Zeroing ---------------------------------------------------------------------------------------------------

def _batch_rows(value, rows: torch.Tensor, batch: int):
    """A block argument for the variant rows: tensors with the batch dimension are indexed by ``rows``."""
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch:
        return value.index_select(0, rows)
    return value


def cosine_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """1 - cos(a, b) over the last dimension, as ||a/|a| - b/|b|||^2 / 2 in float64: exact for nearly equal vectors,
    where 1 - cos in float32 loses everything below ~1e-7 (late layers barely move some tokens)."""
    a, b = a.double(), b.double()
    a = a / a.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    b = b / b.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    return ((a - b) ** 2).sum(-1).float() / 2


def value_zeroing_layer(rec: BlockRecord, mask: torch.Tensor, internal_batch_size: int,
                        progress: tqdm | None = None) -> torch.Tensor:
    """Unnormalised Value Zeroing scores [B, T, T] of one block: cosine distances, 0 for padding."""
    batch, length = mask.shape
    pairs = mask.nonzero()  # (text, source) for every real source token
    scores = torch.zeros((batch, length, length), dtype=torch.float32, device=mask.device)
    reference = rec.output
    for start in range(0, pairs.shape[0], internal_batch_size):
        rows, sources = pairs[start:start + internal_batch_size].unbind(1)
        args = tuple(_batch_rows(a, rows, batch) for a in rec.call.args)
        kwargs = {k: _batch_rows(v, rows, batch) for k, v in rec.call.kwargs.items()}
        with zeroed_values(rec.parts["value"], sources):
            changed = output_tensor(rec.block(*args, **kwargs))
        scores[rows, :, sources] = cosine_distance(changed, reference[rows])
        if progress is not None:
            progress.update(rows.numel())
    return scores * mask[:, :, None] * mask[:, None, :]


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
    _check_options({"rollout": rollout, "internal_batch_size": internal_batch_size})
    texts = as_text_list(texts)
    pairs = None if text_pair is None else as_text_list(text_pair, "text_pair")
    if pairs is not None and len(pairs) != len(texts):
        raise InvalidInputError(f"text_pair has {len(pairs)} texts but texts has {len(texts)}; give one pair each")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InvalidInputError(f"batch_size must be a positive integer, got {batch_size!r}")
    base = unwrap_model(model)
    layout_of(base)
    num_layers = get_adapter(base).num_layers(base)
    limit = resolve_max_length(max_length, tokenizer, base)
    encoded = encode(tokenizer, texts, pairs, limit, truncation)
    pad = pad_token_id(tokenizer)
    device = next(base.parameters()).device
    out = []
    for start in range(0, len(encoded), batch_size):
        items = encoded[start:start + batch_size]
        inputs = collate(items, pad, "right", device, position_ids=False)
        with using(model), torch.no_grad():
            maps = batch_maps(base, inputs, method, list(range(num_layers + 1)), rollout, internal_batch_size)
        stacked = torch.stack([maps[layer] for layer in range(num_layers + 1)], 1).cpu().numpy()
        for row, item in enumerate(items):
            n = len(item.ids)
            out.append(ContributionMaps(item.text, item.text_pair, item.tokens, stacked[row, :, :n, :n],
                                        method, rollout))
    return out


# ---- the registered methods ------------------------------------------------------------------------------------------

def _check_options(options: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(options["rollout"], (bool, np.bool_)):
        raise InvalidInputError(f"rollout must be True or False, got {options['rollout']!r}")
    internal = options.get("internal_batch_size", DEFAULT_INTERNAL_BATCH_SIZE)
    if not isinstance(internal, (int, np.integer)) or isinstance(internal, bool) or internal < 1:
        raise InvalidInputError(f"internal_batch_size must be a positive integer (value-zeroing variants per block "
                                f"pass), got {internal!r}")
    return dict(options, rollout=bool(options["rollout"]))


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
    display="GlobEnc", label_dependent=False, options=[ROLLOUT], supports=family_reason,
    cost=lambda tokens, targets, options: 2 + tokens / 20))  # measured (MiniLM, CPU): 3x a forward at 40, 7x at 256
register_method(Method(
    "alti", _scores("alti"),
    "ALTI (Ferrando et al. 2022): l1-proximity of each source's decomposed vector to the first LayerNorm's output, "
    "normalised per row; " + _ROW,
    display="ALTI", label_dependent=False, options=[ROLLOUT], supports=family_reason,
    cost=lambda tokens, targets, options: 2 + tokens / 20))
register_method(Method(
    "value_zeroing", _scores("value_zeroing"),
    "Value Zeroing (Mohebbi et al. 2023): cosine distance of each token's block output when a source's value "
    "vectors are zeroed, normalised per row (internal_batch_size variants per pass); " + _ROW,
    display="Value Zeroing", label_dependent=False, supports=family_reason, check_options=_check_options,
    options=[ROLLOUT, Option("internal_batch_size", DEFAULT_INTERNAL_BATCH_SIZE,
                             "value-zeroing variants per block pass", int)],
    # one block pass per (source token, block): ~ one forward pass per token (measured 1.2x tokens on MiniLM)
    cost=lambda tokens, targets, options: 1 + 1.2 * tokens))
