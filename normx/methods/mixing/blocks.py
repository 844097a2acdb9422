"""What the mixing methods read of one encoder block on the real forward pass, and the per-block maps they make of
it: GlobEnc's and ALTI's decomposition of the attention block through the LayerNorms, and Value Zeroing's re-runs
of the block with one source's value vectors zeroed (see :mod:`normx.methods.mixing.maps`)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

from tqdm.auto import tqdm

from normx._torch import nn, torch
from normx.core.concurrency import attention_weights
from normx.core.hooks import Call, output_tensor, record_calls, replace_outputs
from normx.models import (
    Adapter,
    active_module,
    encoder_blocks,
    encoder_classes,
    encoder_reason,
    get_adapter,
    unwrap_model,
)
from normx.models.encoder import BlockLayout
from normx.models.projections import head_projections

_ROWS_PER_CHUNK = 2**24  # decomposition: at most this many floats per [rows, T, hidden] chunk


# ---- what the mixing methods need of a model: its adapter's encoder block layout ------------------------------


METHODS = "GlobEnc, ALTI and Value Zeroing"


def supported_models() -> list[str]:
    """Class names GlobEnc, ALTI and Value Zeroing support (PEFT-wrapped or not): those whose adapter describes
    their encoder blocks."""
    return encoder_classes(METHODS)


def family_reason(adapter: Adapter) -> str | None:
    """Why a model family is not supported (None: it is)."""
    return encoder_reason(adapter, METHODS)


def layout_of(model: nn.Module) -> BlockLayout:
    """The block layout of ``model``; :class:`UnsupportedModelError` naming the supported classes otherwise."""
    return encoder_blocks(model, METHODS)[1].encoder_block


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
                                   "attention; this transformers version is not supported by normx.methods.mixing")
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
    """W_O per head (:func:`normx.models.projections.head_projections`, the model's own possibly LoRA-wrapped
    output projection) and its bias dense(0)."""
    attention, dense = rec.parts["attention"], rec.parts["attention_out"]
    heads, size = attention.num_attention_heads, attention.attention_head_size
    hidden = rec.value.shape[-1]
    eye = torch.eye(hidden, dtype=rec.value.dtype, device=rec.value.device)
    b_o = _wide(dense(eye[:1] * 0))
    w_o = head_projections(dense, heads, size).to(b_o.dtype)
    return BlockTerms(w_o, b_o[0],
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
