"""Attention and norm-based attention rows of a decoder: for query positions q, a score for every key j, per block,
from ONE forward pass of the model on its own attention implementation (sdpa, flash or eager).

For block l with heads h, attention probabilities alpha^(l,h) (the model's own: recomputed at the query rows from the
block's own queries and keys, :mod:`normx.models.attention_scores`, or returned by a module that returns them)
and value vectors v_j^(l,h) (captured from its value projection; key-value heads repeated as the model does for
grouped-query attention, ``num_attention_heads / num_key_value_heads`` query heads per key-value head):

- ``attention``: a_(q,j)^l = mean_h alpha^(l,h)_(q,j);
- ``norm_attention`` (Kobayashi et al., EMNLP 2020): n_(q,j)^l = || sum_h alpha^(l,h)_(q,j) f^(l,h)(x_j) ||_2, with
  f^(l,h)(x_j) = W_O^h v_j^(l,h) the value vector pushed through head h's slice of the output projection (the value
  bias included, the output bias not: it belongs to no token). Computed as sqrt(alpha^T G alpha) with the per-key
  Gram matrix G_j[h, k] = <f^h(x_j), f^k(x_j)> in float64: no [Q, T, hidden] tensor, exact to float rounding.

Each block's rows are made inside its attention module's forward hook, at the asked query rows only, so a pass keeps
[B, Q, T] per block and never makes a [B, heads, T, T] matrix: memory grows with T, not T^2 (:func:`head_rows` gives
every head's rows, [B, Q, layers, heads, T]). Keys that are padding get zero (a
right-padded causal row never reaches them; they are masked anyway). Checks on a model's first pass of each kind
(:mod:`normx.methods.decoder.checked`), at the rows read: each head's probabilities sum to one over the keys, and
(``norm_attention``) the value vectors mixed by them and pushed through the output projection give the attention
module's own output; a model that fails either is refused (:class:`~normx.errors.UnsupportedModelError`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from normx._torch import torch
from normx.core.concurrency import attention_weights, using
from normx.core.forward import Pass
from normx.core.hooks import hooked, output_tensor
from normx.errors import UnsupportedModelError
from normx.methods.decoder.checked import pass_kind, record, verdict
from normx.methods.decoder.heads import BlockAttention, block_attention, decoder_reason
from normx.methods.numerics import tolerance
from normx.models.attention_scores import BlockScores, read_scores

KINDS = ("attention", "norm_attention")
_CHUNK = 2**24  # at most this many floats in one [B, tokens, heads, hidden] chunk of f^h(x_j)


def _no_probabilities(output, block: BlockAttention, method: str, length: int) -> UnsupportedModelError:
    probs = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
    got = f"a tensor of shape {tuple(probs.shape)}" if isinstance(probs, torch.Tensor) else type(probs).__name__
    return UnsupportedModelError(
        f"{method} reads the attention probabilities [batch, heads, {length}, {length}] that a decoder block's "
        f"attention module returns with eager attention; block {block.layer}'s {type(block.attention).__name__} "
        f"returned {got} instead")


def _rows(probs: torch.Tensor, queries: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """alpha at the query rows [B, heads, Q, T] (float32; float64 for float64 models), padding keys zeroed."""
    b, h, _, t = probs.shape
    rows = probs.gather(2, queries[:, None, :, None].expand(b, h, queries.shape[1], t))
    rows = rows if rows.dtype == torch.float64 else rows.float()
    return rows * mask[:, None, None, :].to(rows.dtype)


class Checks:
    """The checks of a pass's attention readings, made inside its hooks as tensors on the model's device and read
    after the pass in one copy: no device synchronisation inside the forward (a GPU runs on while they are made)."""

    def __init__(self, method: str, active: bool = True):
        self.method = method
        self.active = active  # False: a kind of pass already checked on this model (nothing is made)
        self._pending: list[tuple] = []  # (what, worst, scale, block, dtype, unreadable)

    def sums(self, rows: torch.Tensor, block: BlockAttention, dtype: torch.dtype) -> None:
        """The rows [B, H, Q, T] must sum to one over the keys."""
        if self.active and rows.numel():
            self._pending.append(("sums", (rows.sum(-1) - 1).abs().max(), None, block, dtype, False))

    def mix(self, rows: torch.Tensor, values: torch.Tensor, output, block: BlockAttention, queries: torch.Tensor,
            unreadable: bool = False) -> None:
        """The value vectors mixed by ``rows`` and pushed through the output projection must give the attention
        module's own output at the query rows; ``unreadable``: a failure means the rows were not read right
        (:class:`Unreadable`), not that the model is unsupported."""
        if not self.active:
            return
        real = output_tensor(output)
        b = real.shape[0]
        real = real[torch.arange(b, device=real.device)[:, None], queries]  # [B, Q, hidden]
        mixed = torch.einsum("bhqt,bthd->bqhd", rows, values.to(rows.dtype)).reshape(*queries.shape, -1)
        try:
            again = block.output(mixed.to(real.dtype))
        except RuntimeError as exc:  # a projection that does not take heads x head_dim inputs
            raise UnsupportedModelError(
                f"{self.method}: block {block.layer}'s {type(block.output).__name__} does not take the "
                f"{mixed.shape[-1]} mixed value features ({rows.shape[1]} heads x {block.head_dim}): "
                f"{str(exc).splitlines()[0]}") from None
        if real.numel():
            self._pending.append(("mix", (again.float() - real.float()).abs().max(), real.abs().max().float(), block,
                                  real.dtype, unreadable))

    def verify(self) -> None:
        """Every check, in the order made; the first that fails raises (:class:`Unreadable` or
        :class:`UnsupportedModelError`)."""
        if not self._pending:
            return
        found = torch.stack([torch.stack([w.float().cpu(), (w if s is None else s).float().cpu()])
                             for _, w, s, *_ in self._pending]).tolist()  # one copy off the device
        pending, self._pending = self._pending, []
        for (what, _, _, block, dtype, unreadable), (worst, scale) in zip(pending, found):
            name = type(block.attention).__name__
            if what == "sums" and worst > (1e-3 if dtype in (torch.float32, torch.float64) else 5e-2):
                raise UnsupportedModelError(
                    f"{self.method} reads attention probabilities that sum to one over the keys; block {block.layer}'s "
                    f"{name} gave rows that are off by {worst:.3g} (attention sinks, or weights that are not a "
                    "softmax over the tokens)")
            if what == "mix" and worst > tolerance(dtype) * max(scale, 1e-6):
                message = (f"{self.method} reads the value vectors of block {block.layer}'s {name} from its "
                           f"{type(block.values).__name__}, but mixed by the attention probabilities and projected "
                           f"by its {type(block.output).__name__} they do not give the module's own output (off by "
                           f"{worst:.3g} of {scale:.3g}): this model computes its attention in a way the method does "
                           "not read")
                raise Unreadable(message) if unreadable else UnsupportedModelError(message)


def _check_sums(rows: torch.Tensor, block: BlockAttention, method: str, dtype: torch.dtype) -> None:
    """:meth:`Checks.sums`, read at once."""
    checks = Checks(method)
    checks.sums(rows, block, dtype)
    checks.verify()


def _norm_rows(rows: torch.Tensor, values: torch.Tensor, block: BlockAttention) -> torch.Tensor:
    """|| sum_h alpha^h_(q,j) W_O^h v^h_j || [B, Q, T] (float32) from alpha [B, H, Q, T] and values [B, T, H, d],
    as sqrt(alpha^T G_j alpha) with G_j the Gram matrix of key j's projected head vectors [B, H, H, T] (in the rows'
    dtype: float32, float64 for float64 models): one output projection's work for G, and each query row's quadratic
    form a sum over heads of products along the keys (no [Q, T, hidden] tensor, no batched small matrix products)."""
    heads = rows.shape[1]
    w_o = block.head_projections(heads)  # [H, d, hidden]
    b, t = values.shape[:2]
    gram = torch.empty((b, heads, heads, t), dtype=rows.dtype, device=values.device)
    step = max(1, _CHUNK // max(1, b * heads * w_o.shape[-1]))
    for start in range(0, t, step):
        f = torch.einsum("bthd,hdo->btho", values[:, start:start + step].to(w_o.dtype), w_o).to(rows.dtype)
        gram[..., start:start + step] = torch.einsum("btho,btko->bhkt", f, f)
    squared = torch.zeros((b, rows.shape[2], t), dtype=rows.dtype, device=values.device)
    for h in range(heads):  # sum_h alpha_h (sum_k G_hk alpha_k), each product along the keys
        squared.addcmul_((gram[:, h, :, None, :] * rows).sum(1), rows[:, h])
    return squared.clamp_min(0).sqrt().float()


def repeat_values(values: torch.Tensor, heads: int, block: BlockAttention, method: str) -> torch.Tensor:
    """The key-value heads' values [B, T, kv, d] repeated for the query heads that share them, as transformers'
    ``repeat_kv`` does (query head h reads key-value head h // (heads / kv)) -> [B, T, heads, d]."""
    kv = values.shape[2]
    if kv == 0 or heads % kv:
        raise UnsupportedModelError(
            f"{method}: block {block.layer}'s {type(block.attention).__name__} has {heads} attention heads, and its "
            f"{type(block.values).__name__}'s output cut into {block.head_dim}-wide heads gives {kv} value heads, "
            "which do not divide them: its values are laid out in a way the method does not read")
    return values.repeat_interleave(heads // kv, dim=2) if kv < heads else values


def check_mix(rows: torch.Tensor, values: torch.Tensor, output, block: BlockAttention, queries: torch.Tensor,
              method: str) -> None:
    """:meth:`Checks.mix`, read at once."""
    checks = Checks(method)
    checks.mix(rows, values, output, block, queries)
    checks.verify()


def _needed(layers: list[int], aggregate: bool) -> list[int]:
    """The blocks (1-based) the scores at ``layers`` read."""
    top = max(layers)
    return list(range(1, top + 1)) if aggregate else sorted({layer for layer in layers if layer > 0})


class Unreadable(Exception):
    """The queries and keys of a block cannot be read (the reason is the message): the probabilities come from an
    eager-attention pass instead."""


def own_probabilities(output, length: int) -> torch.Tensor | None:
    """The probabilities [B, heads, T, T] an attention module returned (eager attention, or a module that always
    returns them), or None."""
    probs = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
    if isinstance(probs, torch.Tensor) and probs.dim() == 4 and probs.shape[-2:] == (length, length):
        return probs
    return None


def linear_modules(read: dict[int, BlockAttention]) -> dict[str, torch.nn.Module] | None:
    """The modules to hook so that each block's probabilities are recomputed at the rows read (its attention
    module, value module and query / key sources), or None where a block's queries and keys are not read."""
    modules = {}
    for layer, block in read.items():
        sources = None if block.parts is None else block.parts.query_key_sources()
        if sources is None:
            return None
        modules |= {f"{layer}.attention": block.attention, f"{layer}.values": block.values}
        modules |= {f"{layer}.qk.{role}": module for role, module in sources.items()}
    return modules


def block_scores(block: BlockAttention, projected: dict, kwargs: dict, padding: torch.Tensor) -> BlockScores:
    """The block's :class:`~normx.models.attention_scores.BlockScores`, or :class:`Unreadable`."""
    scores = read_scores(block.parts, projected, kwargs, padding)
    if isinstance(scores, str):
        raise Unreadable(scores)
    return scores


def read_blocks(run: Pass, queries: torch.Tensor, read: dict[int, BlockAttention], method: str,
                keep: Callable[[BlockAttention, torch.Tensor, torch.Tensor | None], Any]) -> dict[int, Any]:
    """Run ``run``'s forward pass (:meth:`Pass.run`, so its captured layers are there after) and return
    ``{block l: keep(block, rows, values)}`` for the blocks ``read`` (:func:`block_attention`), made inside the
    block's attention hook: ``rows`` [B, H, Q, T] the attention probabilities at query positions ``queries``
    [B, Q] (float32, float64 for float64 models; padding keys zeroed; checked to sum to one), ``values``
    [B, T, H, d] the value vectors (key-value heads repeated; checked to give the module's own output when mixed
    by ``rows`` and projected) where the block was read with its values, else None.

    The forward runs with the model's own attention implementation, and each block's rows are recomputed from its
    own queries and keys (:mod:`normx.models.attention_scores`): memory grows with the tokens, not their square.
    Where a block's queries and keys are not read (no parts read, a layout or position scheme not read, or rows
    that do not reproduce the module's output), the pass runs again with eager attention and the rows are the
    probabilities the modules return."""
    modules = linear_modules(read)
    kind = pass_kind(run.inputs, read, method)
    known = verdict(run.model, kind)  # the checks run on a model's first pass of a kind (normx.methods.decoder.checked)
    if modules is not None and known is not False:
        try:
            with using(run.model):
                out = _read_blocks(run, queries, read, method, keep, modules, check=known is None)
            record(run.model, kind, True)
            return out
        except Unreadable:
            record(run.model, kind, False)
    modules = {f"{layer}.attention": block.attention for layer, block in read.items()}
    modules |= {f"{layer}.values": block.values for layer, block in read.items() if block.parts is not None}
    with attention_weights(run.model):
        return _read_blocks(run, queries, read, method, keep, modules)


def _read_blocks(run: Pass, queries: torch.Tensor, read: dict[int, BlockAttention], method: str, keep,
                 modules: dict, check: bool = True) -> dict[int, Any]:
    mask = run.inputs["attention_mask"]
    length = mask.shape[1]
    captured: dict[int, dict] = {layer: {} for layer in read}
    out: dict[int, Any] = {}

    def on_call(key, _args, kwargs, output):
        layer, part, *role = key.split(".")
        block = read[int(layer)]
        if part == "values":
            captured[block.layer]["values"] = block.value_vectors(output_tensor(output))
            return None
        if part == "qk":
            captured[block.layer][role[0]] = output_tensor(output)
            return None
        seen = captured[block.layer]
        captured[block.layer] = {}
        probs = own_probabilities(output, length)
        if probs is not None:
            rows = _rows(probs, queries, mask)
        elif "values" not in seen or not any(role in seen for role in ("q", "qkv")):
            raise _no_probabilities(output, block, method, length)
        else:
            scores = block_scores(block, {k: v for k, v in seen.items() if k != "values"}, kwargs, mask)
            rows = scores.probabilities(queries)  # padding keys are zero (not allowed)
        if probs is not None or scores.sinks is None:  # (a sink's share goes to no token)
            checks.sums(rows, block, rows.dtype if probs is None else probs.dtype)
        if block.parts is None:
            out[block.layer] = keep(block, rows, None)
            return None
        values = seen.get("values")
        if values is None:
            raise UnsupportedModelError(f"{method}: block {block.layer}'s {type(block.values).__name__} did not run "
                                        "before its attention returned, so its output is not the values it mixed")
        values = repeat_values(values, rows.shape[1], block, method)
        # recomputed rows that do not give the output: read the module's own probabilities instead (Unreadable)
        checks.mix(rows, values, output, block, queries, unreadable=probs is None)
        out[block.layer] = keep(block, rows, values)
        return None

    checks = Checks(method, active=check)
    with hooked(modules, on_call):
        run.run()
    checks.verify()  # every block's checks, read once after the pass
    return out


def block_rows(run: Pass, queries: torch.Tensor, kind: str, blocks: list[int], method: str | None = None
               ) -> dict[int, torch.Tensor]:
    """Run ``run``'s forward pass (:meth:`Pass.run`, so its captured layers are there after) and return
    ``{block l: rows [B, Q, T] float32}`` at query positions ``queries`` [B, Q] for ``blocks`` (:func:`read_blocks`).
    ``attention`` reads the value and output projections too where the model has readable ones (its recomputed
    rows are checked by them), else only the probabilities of an eager pass."""
    method = method or kind
    try:
        read = block_attention(run.model, blocks, method, values=True)
    except UnsupportedModelError:
        if kind == "norm_attention":
            raise
        read = block_attention(run.model, blocks, method, values=False)

    def keep(block, rows, values):
        return rows.mean(1).float() if kind == "attention" else _norm_rows(rows, values, block)

    return read_blocks(run, queries, read, method, keep)


def head_rows(run: Pass, queries: torch.Tensor, layers: list[int], method: str = "attention") -> torch.Tensor:
    """Every head's attention probabilities [B, Q, len(layers), heads, T] float32 at query positions ``queries``
    [B, Q] for blocks ``layers`` (1-based), from one forward pass on the model's own attention implementation
    (:func:`read_blocks`: recomputed at those rows only, checked against each module's output; memory linear in
    T). Grouped-query heads are the query heads (each reads its key-value head); padding keys are zero."""
    reason = decoder_reason(run.adapter)
    if reason is not None:
        raise UnsupportedModelError(f"{method} does not explain {type(run.model).__name__}: {reason}")
    try:
        read = block_attention(run.model, layers, method, values=True)
    except UnsupportedModelError:
        read = block_attention(run.model, layers, method, values=False)
    rows = read_blocks(run, queries, read, method, lambda _block, rows, _values: rows.float())
    return torch.stack([rows[layer].transpose(1, 2) for layer in layers], dim=2)


def query_rows(run: Pass, queries: torch.Tensor, kind: str, aggregate: bool, method: str | None = None
               ) -> torch.Tensor:
    """Scores [B, Q, layers, T] float32 at ``run.layers`` for the predictions at query positions ``queries`` [B, Q],
    from one forward pass (which this runs: ``run``'s captured layers are there after).

    Layer 0 is the query token alone (1 at its own position). At layer l >= 1: with ``aggregate``, blocks 1..l
    together (``attention``: their mean; ``norm_attention``: their sum); without, block l alone.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    reason = decoder_reason(run.adapter)
    if reason is not None:
        raise UnsupportedModelError(f"{method or kind} does not explain {type(run.model).__name__}: {reason}")
    layers = list(run.layers)
    blocks = _needed(layers, aggregate)
    rows = block_rows(run, queries, kind, blocks, method)  # (layer 0 only: the pass is still run, for the prediction)
    mask = run.inputs["attention_mask"]
    identity = torch.zeros((*queries.shape, mask.shape[1]), dtype=torch.float32, device=mask.device)
    identity.scatter_(2, queries[..., None], 1.0)
    out, total = [], None
    for layer in range(max(layers) + 1):
        if layer > 0 and aggregate:
            total = rows[layer] if total is None else total + rows[layer]
        if layer in layers:
            if layer == 0:
                out.append(identity)
            elif not aggregate:
                out.append(rows[layer])
            else:
                out.append(total / layer if kind == "attention" else total)
    return torch.stack(out, dim=2)
