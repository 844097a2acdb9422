"""DecompX for causal decoders: the residual stream of every position decomposed into one part per input token
(plus one bias part), propagated through every block and read through the final norm and the head at the query
positions, for the target columns there.

One recorded forward pass (the model's own modules and attention implementation, :func:`record_decoder`) fixes the
model's nonlinear quantities: each norm's 1 / rms (or 1 / std) of its real input, the attention probabilities
(rotary position, grouped-query heads, q/k norms, soft-capping and sliding windows all act only through them; kept
as each block's queries and keys, made by rows when mixed), the gated MLP's act(gate(y)) or a plain MLP's
zero-origin slope act(z) / z. Given those, every block is linear in its input
(:mod:`normx.methods.decoder.linear`), so the parts propagate exactly: at every block the parts sum to the block's own
output, and at the head to the model's own logits. Both are checked on every pass: a block whose parts do not
reproduce its output is refused (:class:`~normx.errors.UnsupportedModelError`), and each result reports its
decomposition error at the logits.

A source token k reaches only positions >= k (causality), and each source's parts propagate independently of the
others', so sources are processed in chunks over positions k0.. only: memory [chunk, T, hidden], work about T / 2
forward passes of the MLPs for a text of T tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from normx._torch import torch
from normx.core.concurrency import attention_weights, using
from normx.core.forward import Pass
from normx.core.hooks import hooked, output_tensor
from normx.errors import UnsupportedModelError
from normx.methods.decoder.heads import BlockAttention, block_attention
from normx.methods.decoder.linear import NormMap, affine_parts, mlp_fixed, mlp_parts, norm_map
from normx.methods.decoder.maps import (
    Unreadable,
    block_scores,
    check_mix,
    linear_modules,
    own_probabilities,
    repeat_values,
)
from normx.methods.numerics import tolerance
from normx.models.decoder import DecoderBlock, decoder_block

METHOD = "DecompX"
_CHUNK_FLOATS = 2**25  # about this many floats in one chunk's [sources, positions, widest layer] tensor
_SOURCES = 16  # at most this many sources in one chunk
_PROBABILITIES = 2**22  # about this many floats in one chunk of a block's probabilities [H, rows, T]


@dataclass
class DecoderRecording:
    """What one forward pass of a decoder fixed, per block (0-based lists) and for the whole batch (not the
    encoder DecompX's :class:`normx.methods.decompx.model.Recording`)."""

    blocks: list[DecoderBlock]
    attention: list[BlockAttention]
    block_in: list[torch.Tensor]  # [B, T, D]
    block_out: list[torch.Tensor]
    probs: list  # per block, BlockScores or OwnProbabilities: .heads, .rows(row, start, stop, length) [H, r, length]
    attention_out: list[torch.Tensor]  # the attention module's own output [B, T, D]
    norms: list[dict[str, tuple[torch.Tensor, torch.Tensor]]]  # role -> (real input, real output)
    mlp_in: list[torch.Tensor]
    # a lazy recording (record_decoder(lazy=True)): block i's call, run again by load(i) to remake its attention_out,
    # probs and norms (None: they are kept)
    calls: list[Callable[[], None] | None] | None = None

    def load(self, i: int) -> None:
        """Block i's attention output, probabilities and norms, made again where a lazy recording dropped them."""
        if self.calls is not None and self.calls[i] is not None and self.probs[i] is None:
            self.calls[i]()

    def drop(self, i: int) -> None:
        """Let a lazy recording's block i go again (:meth:`load` remakes it)."""
        if self.calls is not None and self.calls[i] is not None:
            self.attention_out[i], self.probs[i], self.norms[i] = None, None, {}


def _unsupported(base, what: str, method: str = METHOD) -> UnsupportedModelError:
    return UnsupportedModelError(f"{method} for decoders cannot decompose {type(base).__name__}: {what}")


def _wiring(base, adapter, method: str = METHOD) -> tuple[list[DecoderBlock], list[BlockAttention]]:
    blocks = []
    for index, block in enumerate(adapter.block_modules(base)):
        wiring = decoder_block(block)
        if isinstance(wiring, str):
            raise _unsupported(base, f"block {index + 1}: {wiring}", method)
        blocks.append(wiring)
    attention = block_attention(base, list(range(1, len(blocks) + 1)), method, values=True)
    for layer, read in attention.items():
        if read.parts.v_norm is not None:
            raise _unsupported(base, f"block {layer} normalises its value vectors (v_norm), which is not linear",
                               method)
        if read.parts.clip:
            raise _unsupported(base, f"it clips its projections' outputs (at {read.parts.clip:g}), which is not "
                               "linear", method)
    if adapter.norm_module(base) is None:
        raise _unsupported(base, "its adapter names no final norm", method)
    return blocks, [attention[layer] for layer in sorted(attention)]


class OwnProbabilities:
    """A block's probabilities as its attention module returned them [B, H, T, T] (eager attention, or a module
    that always returns them), read as :class:`~normx.models.attention_scores.BlockScores` is."""

    def __init__(self, probs: torch.Tensor):
        self.probs = probs

    @property
    def heads(self) -> int:
        return self.probs.shape[1]

    def rows(self, row: int, start: int, stop: int, length: int) -> torch.Tensor:
        return self.probs[row, :, start:stop, :length].float()


def record_decoder(run: Pass, mlp: bool = True, lazy: bool = False, method: str = METHOD
                   ) -> DecoderRecording:
    """Run ``run``'s forward pass (so its captured layers are there after) with hooks on every block, its norms,
    attention and MLP (``mlp=False``: not the MLP and its norms, and the attention's input norm recomputed by who
    reads it; ALTI-Logit needs no more); return what the decomposition keeps fixed.

    The pass runs on the model's own attention implementation and keeps each block's queries and keys
    (:class:`~normx.models.attention_scores.BlockScores`: probabilities made on demand, by rows), so no block's
    [T, T] probabilities are held, checked at each row's last token against the module's own output; where a
    block's queries and keys are not read, the pass runs again with eager attention and keeps the probabilities
    the modules return (:class:`OwnProbabilities`).

    ``lazy`` (with ``mlp=False``, on the model's own attention): keep only each block's input and output and its
    call; :meth:`DecoderRecording.load` runs block i again alone on its recorded input (checked to give its
    recorded output) to make its attention output, queries and keys, and :meth:`DecoderRecording.drop` lets them
    go, so a reader that takes the blocks one at a time holds one block's [T, hidden] tensors instead of all.
    ``method`` names the reader in the errors."""
    base, adapter = run.model, run.adapter
    blocks, attention = _wiring(base, adapter, method)
    read = {i + 1: block for i, block in enumerate(attention)}
    linear = linear_modules(read)
    if linear is not None:
        try:
            with using(base):
                return _record(run, blocks, attention, mlp, linear, lazy and not mlp, method)
        except Unreadable:
            pass
    with attention_weights(base):
        return _record(run, blocks, attention, mlp, {}, False, method)


def _cached(args: tuple, kwargs: dict) -> bool:
    """Whether a block's call carries a key-value cache (which running it again would change)."""
    past = [kwargs.get(name) for name in ("past_key_values", "past_key_value", "layer_past")]
    return bool(kwargs.get("use_cache")) or any(p is not None for p in past) or any(
        "cache" in type(a).__name__.lower() for a in (*args, *kwargs.values()))


def _record(run: Pass, blocks: list[DecoderBlock], attention: list[BlockAttention], mlp: bool, linear: dict,
            lazy: bool = False, method: str = METHOD) -> DecoderRecording:
    base, adapter = run.model, run.adapter
    n = len(blocks)
    rec = DecoderRecording(blocks, attention, [None] * n, [None] * n, [None] * n, [None] * n, [{} for _ in range(n)],
                           [None] * n, [None] * n if lazy else None)
    modules = {}
    for i, (wiring, read) in enumerate(zip(blocks, attention)):
        modules[f"{i}.block"] = adapter.block_modules(base)[i]
        modules[f"{i}.attention"] = read.attention
        if mlp:
            modules[f"{i}.mlp"] = wiring.mlp
        modules |= {f"{i}.norm.{role}": module for role, module in wiring.norms().items()
                    if mlp or role == "attention_post"}
    modules |= {f"{int(key.split('.')[0]) - 1}.{key.split('.', 1)[1]}": module for key, module in linear.items()
                if not key.endswith(".attention")}
    mask = run.inputs["attention_mask"]
    last = (mask.sum(-1) - 1).clamp_min(0)[:, None]  # [B, 1] each row's last real token: where the check reads
    seen: dict[int, dict] = {i: {} for i in range(n)}

    def on_call(key, args, kwargs, output):
        index, part, *role = key.split(".")
        i = int(index)
        first = args[0] if args else next(iter(kwargs.values()))
        if part == "block":
            rec.block_in[i] = (args[0] if args else kwargs["hidden_states"]).detach()
            rec.block_out[i] = output_tensor(output).detach()
            if lazy and not _cached(args, kwargs):
                rec.calls[i] = _replay(rec, i, base, modules, on_call, args, kwargs, method)
                rec.drop(i)
        elif part in ("values", "qk"):
            seen[i][role[0] if role else part] = output_tensor(output).detach()
        elif part == "attention":
            rec.attention_out[i] = output_tensor(output).detach()
            probs = own_probabilities(output, mask.shape[1])
            if probs is not None:
                rec.probs[i] = OwnProbabilities(probs.detach())
            elif not linear:
                raise _unsupported(base, f"block {i + 1}'s attention returned no probabilities under eager "
                                   "attention", method)
            else:
                got, seen[i] = seen[i], {}
                read = rec.attention[i]
                scores = block_scores(read, {k: v for k, v in got.items() if k != "values"}, kwargs, mask)
                rows = scores.probabilities(last) * mask[:, None, None, :].to(scores.dtype)
                values = repeat_values(read.value_vectors(got["values"]), rows.shape[1], read, method)
                try:
                    check_mix(rows, values, output, read, last, method)
                except UnsupportedModelError as exc:
                    raise Unreadable(str(exc)) from None
                rec.probs[i] = scores
        elif part == "mlp":
            rec.mlp_in[i] = first.detach()
        else:
            rec.norms[i][role[0]] = (first.detach(), output_tensor(output).detach())
        return None

    with hooked(modules, on_call), torch.no_grad():
        run.run()
    return rec


def _replay(rec: DecoderRecording, i: int, base, modules: dict, on_call, args: tuple, kwargs: dict,
            method: str = METHOD) -> Callable[[], None]:
    """Block i run again alone on its recorded call, with the recording's hooks on its attention, its norms and
    its query / key / value sources (not on the block: its recorded input and output stay as they are)."""
    block = modules[f"{i}.block"]
    own = {key: module for key, module in modules.items() if key.split(".")[0] == str(i) and key != f"{i}.block"}

    def again() -> None:
        try:
            with using(base), hooked(own, on_call), torch.no_grad():
                out = output_tensor(block(*args, **kwargs))
        except Unreadable as exc:
            raise _unsupported(base, f"block {i + 1} run again alone: {exc}", method) from None
        real = rec.block_out[i]
        worst = 0.0 if torch.equal(out, real) else float((out.float() - real.float()).abs().max())
        if worst > tolerance(real.dtype) * max(float(real.float().abs().max()), 1e-6):
            raise _unsupported(base, f"block {i + 1} run again alone on its recorded input gives another output "
                               f"(off by {worst:.3g}): its blocks do not compute the same twice", method)

    return again


@dataclass
class _Fixed:
    """One text's fixed quantities for one block, at its n real positions."""

    wiring: DecoderBlock
    read: BlockAttention
    scores: object  # the block's probabilities, made by rows on demand (DecoderRecording.probs)
    row: int
    n: int
    norms: dict[str, NormMap]
    mlp: torch.Tensor  # [n, F]


def _fixed(rec: DecoderRecording, i: int, row: int, n: int, base) -> _Fixed:
    wiring = rec.blocks[i]
    norms = {}
    for role, module in wiring.norms().items():
        real_in, real_out = rec.norms[i][role]
        norms[role] = norm_map(module, real_in[row, :n], real_out[row, :n], f"block {i + 1}'s {role}", METHOD)
    if wiring.mlp_norm is wiring.attention_norm and wiring.mlp_norm is not None:
        norms["mlp_norm"] = norms["attention_norm"]
    return _Fixed(wiring, rec.attention[i], rec.probs[i], row, n, norms,
                  mlp_fixed(wiring.mlp_layout, rec.mlp_in[i][row, :n]))


def _sliced(norm: NormMap | None, start: int) -> NormMap | None:
    return None if norm is None else NormMap(norm.centre, norm.scale[start:], norm.gain, norm.bias)


def _attention(fixed: _Fixed, parts: torch.Tensor, start: int, bias: bool) -> torch.Tensor:
    """The attention module's output parts for its input parts [S, N', D] (positions start..)."""
    read = fixed.read
    heads, n = fixed.scores.heads, fixed.n
    values = repeat_values(read.value_vectors(affine_parts(read.values, parts, bias)), heads, read, METHOD)
    mixed = torch.empty((*values.shape[:2], heads, values.shape[-1]), dtype=values.dtype, device=values.device)
    step = max(1, _PROBABILITIES // max(1, heads * n))  # query rows per chunk: no [H, T, T] matrix
    for top in range(start, n, step):
        end = min(n, top + step)  # causal: rows top..end mix keys start..end
        probs = fixed.scores.rows(fixed.row, top, end, end)[:, :, start:].to(values.dtype)
        mixed[:, top - start:end - start] = torch.einsum("hij,sjhd->sihd", probs, values[:, :end - start])
    return affine_parts(read.output, mixed.reshape(*mixed.shape[:2], -1), bias)


def _block(fixed: _Fixed, parts: torch.Tensor, start: int, bias: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(block output parts, attention module output parts) for block input parts [S, N', D]."""
    wiring, norms = fixed.wiring, {role: _sliced(m, start) for role, m in fixed.norms.items()}
    scale = wiring.residual_scale

    def normed(role: str, x: torch.Tensor) -> torch.Tensor:
        return norms[role].parts(x, bias) if role in norms else x

    attention_in = normed("attention_norm", parts)
    attention = _attention(fixed, attention_in, start, bias)
    branch = normed("attention_post", attention) * scale
    layout, gate = wiring.mlp_layout, fixed.mlp[start:]
    if wiring.style in ("parallel", "parallel_shared"):
        mlp_in = attention_in if wiring.style == "parallel_shared" else normed("mlp_norm", parts)
        return parts + branch + mlp_parts(layout, gate, mlp_in, bias) * scale, attention
    middle = parts + branch
    mlp = normed("mlp_post", mlp_parts(layout, gate, normed("mlp_norm", middle), bias)) * scale
    return middle + mlp, attention


def _check(total: torch.Tensor, real: torch.Tensor, what: str, base) -> None:
    worst = float((total - real.float()).abs().max()) if real.numel() else 0.0
    scale = float(real.float().abs().max()) if real.numel() else 0.0
    if worst > 10 * tolerance(real.dtype) * max(scale, 1e-6):
        raise _unsupported(base, f"the parts of {what} sum to something else than its own output (off by "
                           f"{worst:.3g} of {scale:.3g}): its block computes in a way DecompX does not read")


def decompose_row(rec: DecoderRecording, run: Pass, row: int, queries: torch.Tensor, layers: list[int]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """For one batch row: the parts of x^l at positions ``queries`` [Q], for each of ``layers``, as
    (token parts [Q, layers, n, D], bias part [Q, layers, D]) in float32, n the row's real length."""
    base = run.model
    mask = run.inputs["attention_mask"][row]
    n = int(mask.sum())
    if not bool(mask[:n].all()):
        raise RuntimeError("DecompX for decoders expects right-padded rows")
    fixed = [_fixed(rec, i, row, n, base) for i in range(len(rec.blocks))]
    x0 = rec.block_in[0][row, :n].float()
    d, device = x0.shape[-1], x0.device
    widest = max([d] + [f.mlp.shape[-1] for f in fixed])
    # small chunks: a chunk starting at k0 works on positions k0.. only, so the work falls towards T^2 / 2 parts
    step = max(1, min(_SOURCES, _CHUNK_FLOATS // max(1, n * widest)))
    q = queries.tolist()
    tokens = torch.zeros((len(q), len(layers), n, d), device=device)
    bias_parts = torch.zeros((len(q), len(layers), d), device=device)
    totals = [torch.zeros((n, d), device=device) for _ in fixed]
    attention_totals = [torch.zeros((n, d), device=device) for _ in fixed]
    with torch.no_grad():
        for start in range(0, n, step):
            stop = min(n, start + step)
            bias = start == 0  # the first chunk carries the bias part as source row 0
            first = 1 if bias else 0
            parts = torch.zeros((first + stop - start, n - start, d), device=device)
            sources = torch.arange(start, stop, device=device)
            parts[first + sources - start, sources - start] = x0[sources]
            for layer in range(len(fixed) + 1):
                if layer > 0:
                    try:
                        parts, attention = _block(fixed[layer - 1], parts, start, bias)
                    except RuntimeError as exc:  # shapes that do not chain as the layout says
                        raise _unsupported(base, f"block {layer}'s parts do not chain as its "
                                           f"{fixed[layer - 1].wiring.style} layout says: "
                                           f"{str(exc).splitlines()[0]}") from None
                    totals[layer - 1][start:] += parts.sum(0)
                    attention_totals[layer - 1][start:] += attention.sum(0)
                if layer in layers:
                    where = layers.index(layer)
                    for j, position in enumerate(q):
                        if position >= start:
                            tokens[j, where, start:stop] = parts[first:, position - start]
                            if bias:
                                bias_parts[j, where] = parts[0, position - start]
    for i in range(len(fixed)):
        _check(attention_totals[i], rec.attention_out[i][row, :n], f"block {i + 1}'s attention", base)
        _check(totals[i], rec.block_out[i][row, :n], f"block {i + 1}", base)
    return tokens, bias_parts
