"""The attention probabilities a decoder block computes, recomputed at chosen query rows from the block's own queries
and keys, whatever attention implementation the model runs (sdpa, flash, eager): no [T, T] matrix of every query
is made, only the rows asked for.

What the probabilities are made of is read from the model, by transformers' conventions:

- the queries and keys: the output of the block's query / key projections (or its fused projection, cut as
  :mod:`normx.models.decoder_attention` cuts it; a clip applied as the model clips), then its per-head q / k norms
  where it has them (a norm over ``head_dim`` applied per head, one over the whole projection applied before the
  heads are cut, by the size of its weight);
- rotary position embeddings: the ``position_embeddings`` (cos, sin) the attention module receives, applied by the
  family's own ``apply_rotary_pos_emb`` (from the module's own source file) on whole heads, or, where it takes only
  the rotated part (Phi), on the first ``cos.shape[-1]`` features of each head;
- grouped-query heads: query head h reads key-value head ``h // (heads / kv heads)``, as ``repeat_kv`` does;
- scaling: the module's ``scaling`` (or ``softmax_scale``), else ``head_dim ** -0.5``; a logit soft-cap
  (``attn_logit_softcapping``: ``cap * tanh(logits / cap)``); attention sinks (a ``sinks`` parameter per head: one
  more logit in the softmax whose probability goes to no token);
- the mask: the one the attention module receives (a 4-D boolean mask: True attends; a 4-D float mask: added to
  the logits), or, where it receives none or a 2-D padding mask (sdpa's causal shortcut, flash attention), causal
  over the real tokens and within the module's ``sliding_window`` where it has one.

A module that adds a position bias of its own (ALiBi's ``position_bias`` / ``alibi`` arguments) or whose family
has rotary embeddings this cannot apply is not read (:func:`read_scores` says why). Nothing here is trusted:
whoever uses the rows checks that the values mixed by them give the attention module's own output at those rows.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from normx.models.decoder_attention import AttentionParts

if TYPE_CHECKING:
    import torch
    from torch import nn

BIAS_ARGUMENTS = ("position_bias", "alibi")  # position biases some families add to the logits inside the module


@dataclass(frozen=True)
class Rotation:
    """The rotary position embeddings a module received, (cos, sin) [B or 1, T, width], and its family's
    ``apply_rotary_pos_emb``: applied to the query rows a method reads when it reads them (rotating every query of a
    long prompt for a few rows' sake would be work and memory that grow with the prompt)."""

    rotate: Callable
    cos: torch.Tensor
    sin: torch.Tensor

    def row(self, row: int) -> Rotation:
        """The same for batch row ``row`` alone."""
        if self.cos.shape[0] == 1:
            return self
        return Rotation(self.rotate, self.cos[row:row + 1], self.sin[row:row + 1])

    def queries(self, q: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The query rows ``q`` [B, H, Q, d] of positions ``rows`` [B, Q], rotated as the module rotates them."""
        index = rows[..., None].expand(-1, -1, self.cos.shape[-1])
        cos = self.cos.expand(rows.shape[0], -1, -1).gather(1, index)
        sin = self.sin.expand(rows.shape[0], -1, -1).gather(1, index)
        return _applied(self.rotate, q, q[:, :1], cos, sin)[0]  # (the second argument is only read to be rotated)


@dataclass
class BlockScores:
    """One block's queries and keys as its attention module scores them: ``queries`` [B, H, T, d] (as projected and
    normed, in the model's dtype: only the rows read are converted and rotated, by ``rotation``) and ``keys``
    [B, kv, T, d] (rotated; float32, float64 for float64 models), and how logits become probabilities."""

    queries: torch.Tensor
    keys: torch.Tensor
    scaling: float
    mask: torch.Tensor | None  # the 4-D mask the module received [B or 1, 1 or H, T, T], or None
    padding: torch.Tensor  # [B, T] the real tokens
    window: int | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None  # [H]
    rotation: Rotation | None = None  # rotary embeddings, applied to the query rows read

    @property
    def heads(self) -> int:
        return self.queries.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        """The probabilities' dtype: float32, float64 for float64 models."""
        return self.keys.dtype

    def rows(self, row: int, start: int, stop: int, length: int) -> torch.Tensor:
        """Batch row ``row``'s probabilities [H, stop - start, length] of query positions start..stop over its first
        ``length`` keys (float32, float64 for float64 models)."""
        import torch

        mask = self.mask if self.mask is None or self.mask.shape[0] == 1 else self.mask[row:row + 1]
        one = BlockScores(self.queries[row:row + 1], self.keys[row:row + 1], self.scaling, mask,
                          self.padding[row:row + 1], self.window, self.softcap, self.sinks,
                          None if self.rotation is None else self.rotation.row(row))
        device = self.queries.device
        return one.probabilities(torch.arange(start, stop, device=device)[None], torch.arange(length, device=device))[0]

    def _allowed(self, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """[B, 1, Q, K] True where query position ``rows`` [B, Q] may attend key position ``keys`` [K]."""
        allowed = keys[None, None, :] <= rows[..., None]
        if self.window:
            allowed &= keys[None, None, :] > rows[..., None] - self.window
        return (allowed & self.padding[:, None, keys].bool())[:, None]

    def _mask_rows(self, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """The module's own 4-D mask at ``rows`` [B, Q] and ``keys`` [K] -> [B, 1 or H, Q, K]."""
        mask = self.mask.expand(rows.shape[0], *self.mask.shape[1:])
        picked = mask.gather(2, rows[:, None, :, None].expand(-1, mask.shape[1], -1, mask.shape[-1]))
        return picked[..., keys]

    def probabilities(self, rows: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        """The probabilities [B, H, Q, K] of query positions ``rows`` [B, Q] over key positions ``keys`` [K] (all
        of them by default; a subset must hold every key the rows may attend), float32 (float64 for float64
        models), keys that are padding zeroed."""
        import torch

        k = self.keys if keys is None else self.keys[:, :, keys]  # (every key: no copy of them)
        keys = torch.arange(self.keys.shape[2], device=rows.device) if keys is None else keys
        b, heads = rows.shape[0], self.heads
        q = _float(self.queries.gather(2, rows[:, None, :, None].expand(b, heads, rows.shape[1],
                                                                        self.queries.shape[-1])))
        if self.rotation is not None:
            q = self.rotation.queries(q, rows)
        # query head h reads key-value head h // group: the heads of a group as more rows of one product (the keys
        # are not repeated for each of them)
        kv, width = k.shape[1], rows.shape[1]
        grouped = (q * self.scaling).reshape(b, kv, heads // kv * width, q.shape[-1])
        logits = torch.matmul(grouped, k.transpose(-1, -2)).reshape(b, heads, width, k.shape[2])
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        if self.mask is not None and self.mask.dtype != torch.bool:
            logits = logits + self._mask_rows(rows, keys).to(logits.dtype)
        allowed = self._allowed(rows, keys)
        if self.mask is not None and self.mask.dtype == torch.bool:
            allowed = allowed & self._mask_rows(rows, keys)
        logits = logits.masked_fill_(~allowed, float("-inf"))
        if self.sinks is not None:
            sinks = self.sinks.to(logits.dtype).reshape(1, -1, 1, 1).expand(b, -1, rows.shape[1], 1)
            combined = torch.cat([logits, sinks], -1)
            return torch.softmax(combined - combined.amax(-1, keepdim=True), -1)[..., :-1]
        return torch.softmax(logits, -1).nan_to_num_(nan=0.0)  # a row with no key allowed (never a real token's)


def _float(tensor: torch.Tensor) -> torch.Tensor:
    import torch

    return tensor if tensor.dtype == torch.float64 else tensor.float()


def _normed(norm: nn.Module | None, heads: torch.Tensor) -> torch.Tensor:
    """The per-head q / k norm on ``heads`` [B, T, H, d]: per head where its weight has ``d`` entries, over the
    whole projection (before the heads are cut) where it has ``H * d``."""
    if norm is None:
        return heads
    weight = getattr(norm, "weight", None)
    size = weight.numel() if weight is not None else heads.shape[-1]
    if size == heads.shape[-1]:
        return norm(heads)
    b, t, h, d = heads.shape
    return norm(heads.reshape(b, t, h * d)).reshape(b, t, h, d)


def _rotary_function(module: nn.Module):
    return getattr(sys.modules.get(type(module).__module__), "apply_rotary_pos_emb", None)


def _rotary(module: nn.Module, embeddings) -> tuple | str:
    """(the module's family's ``apply_rotary_pos_emb``, cos, sin) from the ``embeddings`` it received, or why not."""
    rotate = _rotary_function(module)
    if rotate is None:
        return (f"{type(module).__name__} receives rotary position embeddings, and its source file has no "
                "apply_rotary_pos_emb to apply them with")
    if not isinstance(embeddings, (tuple, list)) or len(embeddings) != 2:
        return f"{type(module).__name__} receives position embeddings that are not a (cos, sin) pair"
    return rotate, *embeddings


def _rotated_pair(module: nn.Module, q: torch.Tensor, k: torch.Tensor, rotate: Callable, cos, sin) -> tuple | str:
    try:
        return _applied(rotate, q, k, cos, sin)
    except (TypeError, RuntimeError) as exc:
        return (f"{type(module).__name__}'s family applies its rotary embeddings in a way this does not read "
                f"(apply_rotary_pos_emb(q, k, cos, sin): {str(exc).splitlines()[0]})")


def rotate_keys(module: nn.Module, k: torch.Tensor, embeddings) -> torch.Tensor | str:
    """The keys ``k`` [B, kv, T, d] rotated by the module's family function with (cos, sin) ``embeddings``, or why
    they cannot be (one head of the keys stands for the queries the function rotates too)."""
    found = _rotary(module, embeddings)
    if isinstance(found, str):
        return found
    rotated = _rotated_pair(module, k[:, :1], k, *found)
    return rotated if isinstance(rotated, str) else rotated[1]


def _rotation(module: nn.Module, q: torch.Tensor, k: torch.Tensor, embeddings) -> tuple | str:
    """(the queries, the keys ``k`` [B, kv, T, d] rotated, the :class:`Rotation` for the query rows read of ``q``
    [B, H, T, d]) by the module's family function with (cos, sin) ``embeddings``, or why they cannot be rotated. The
    queries are ``q`` as given; where the embeddings are not one (cos, sin) row per position ([B or 1, T, width]),
    every query is rotated now instead, and the rotation is None."""
    import torch

    found = _rotary(module, embeddings)
    if isinstance(found, str):
        return found
    rotate, cos, sin = found
    per_position = (isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor) and cos.dim() == 3
                    and cos.shape == sin.shape and cos.shape[1] == k.shape[2])
    rotated = _rotated_pair(module, k[:, :1] if per_position else _float(q), k, rotate, cos, sin)
    if isinstance(rotated, str):
        return rotated
    return (q, rotated[1], Rotation(rotate, cos, sin)) if per_position else (rotated[0], rotated[1], None)


def _applied(rotate: Callable, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple:
    """``rotate(q, k, cos, sin)`` on whole heads (the family's function rotates the part its embeddings cover:
    GPT-NeoX, Phi-3), else, for a function that rotates whole heads given the rotated part only (Phi), on the first
    ``cos.shape[-1]`` features of each head; the first one's error where neither runs."""
    import torch

    try:
        return rotate(q, k, cos, sin)
    except (TypeError, RuntimeError) as exc:
        width = cos.shape[-1]
        if width >= q.shape[-1]:
            raise
        try:
            q_rot, k_rot = rotate(q[..., :width], k[..., :width], cos, sin)
        except (TypeError, RuntimeError):
            raise exc from None
        return torch.cat([q_rot, q[..., width:]], -1), torch.cat([k_rot, k[..., width:]], -1)


def _number(*values) -> float | None:
    return next((float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v), None)


def read_scores(parts: AttentionParts, projected: dict[str, torch.Tensor], kwargs: dict, padding: torch.Tensor
                ) -> BlockScores | str:
    """The block's :class:`BlockScores` from what its attention module received (``kwargs``, its keyword
    arguments) and its projections' outputs ``projected`` (``"q"`` and ``"k"``, or ``"qkv"`` for a fused
    projection: :meth:`AttentionParts.query_key_sources`), ``padding`` [B, T] the real tokens; or why not."""
    import torch

    module = parts.module
    name = type(module).__name__
    bias = next((key for key in BIAS_ARGUMENTS if isinstance(kwargs.get(key), torch.Tensor)), None)
    if bias is not None:
        return f"{name} adds a position bias of its own ({bias}) to its attention logits"
    q, k = parts.queries_keys(projected)
    q, k = _normed(parts.q_norm, q), _normed(parts.k_norm, k)
    q, k = q.transpose(1, 2), _float(k).transpose(1, 2)  # [B, heads, T, d]; queries converted when read
    if q.shape[1] % max(k.shape[1], 1):
        return f"{name} has {q.shape[1]} query heads and {k.shape[1]} key heads, which do not divide them"
    embeddings = kwargs.get("position_embeddings")
    rotation = None
    if embeddings is not None:
        rotated = _rotation(module, q, k, embeddings)
        if isinstance(rotated, str):
            return rotated
        q, k, rotation = rotated
    config = getattr(module, "config", None)
    scaling = _number(parts.scaling, getattr(module, "softmax_scale", None)) or q.shape[-1] ** -0.5
    softcap = _number(getattr(module, "attn_logit_softcapping", None), getattr(config, "attn_logit_softcapping", None))
    window = getattr(module, "sliding_window", None)
    sinks = getattr(module, "sinks", None)
    mask = kwargs.get("attention_mask")
    mask = mask if isinstance(mask, torch.Tensor) and mask.dim() == 4 else None
    if mask is not None and mask.shape[-2:] != (q.shape[2], k.shape[2]):
        return f"{name} received an attention mask of shape {tuple(mask.shape)} for {q.shape[2]} tokens"
    return BlockScores(q, k, scaling, mask, padding, window if isinstance(window, int) and window > 0 else None,
                       softcap, _float(sinks.detach()) if isinstance(sinks, torch.Tensor) else None, rotation)
