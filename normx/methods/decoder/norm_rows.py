"""Norm-based attention rows of a response, read while a pass on a key/value cache runs (the presence reading's plain
pass): for the response's rows q_t and every key j,

    N_(t,j) = sum_(l, h) alpha^(l,h)_(q_t,j) * || W_O^h v_j^(l,h) ||,

the attention probability of head h of block l times the size of what it moves from token j (the ``norm`` family
of :mod:`normx.methods.calibrated.readings` summed over blocks and heads), without a pass of its own: the value
vectors are captured from each block's value projection in every pass that builds the cache and in the rows' pass
(:meth:`NormRows.values`), the probabilities from the attention modules of the rows' pass, run with eager attention
(:meth:`NormRows.rows`). As :mod:`~normx.methods.decoder.maps` does, every block is checked at the rows read: its
probabilities sum to one over the keys, and the value vectors mixed by them and pushed through the output projection
give the module's own output; a model that fails either is refused (:class:`~normx.errors.UnsupportedModelError`).

Layer 3 (methods): imports ``normx.core``, ``normx.models`` and the decoder heads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from normx._torch import torch
from normx.core.concurrency import attention_weights
from normx.core.hooks import hooked
from normx.errors import UnsupportedModelError
from normx.methods.decoder.heads import block_attention
from normx.methods.decoder.maps import _check_sums, check_mix, repeat_values


class NormRows:
    """The norm-based attention rows [n, keys] of the last ``n`` rows of one pass on a cache (see the module's
    docstring), for ``blocks`` blocks of ``heads`` query heads."""

    def __init__(self, model, blocks: int, heads: int, n: int, method: str) -> None:
        self.model, self.heads, self.n, self.method = model, heads, n, method
        self.read = block_attention(model, list(range(1, blocks + 1)), method, values=True)
        self.captured: dict[int, list[torch.Tensor]] = {layer: [] for layer in self.read}
        self.found: torch.Tensor | None = None

    @contextmanager
    def values(self) -> Iterator[None]:
        """Keep each block's value vectors of every pass run inside (the cache's, then the rows')."""
        def keep(key, _args, _kwargs, output):
            layer = int(key)
            self.captured[layer].append(self.read[layer].value_vectors(output)[0].detach())

        with hooked({str(layer): block.values for layer, block in self.read.items()}, keep):
            yield

    def seed(self, values: dict[int, torch.Tensor]) -> None:
        """Start each block's value vectors with ``values`` {block: [keys, kv heads, d]} (the first keys' from a pass
        run before, in place of capturing them again: :meth:`normx.methods.ablation.prefix.Prefix.values_until`);
        before any pass inside :meth:`values`. The rows' pass checks them (:func:`~normx.methods.decoder.maps.
        check_mix`)."""
        if any(self.captured.values()) or set(values) != set(self.read):
            raise ValueError(f"{self.method}: value vectors are seeded once, for blocks {sorted(self.read)}, before "
                             f"any pass; got blocks {sorted(values)}")
        for layer, vectors in values.items():
            self.captured[layer].append(vectors)

    @contextmanager
    def rows(self) -> Iterator[None]:
        """The rows' pass run inside (with eager attention, the model's lock held exclusively, and inside
        :meth:`values`): each block's probabilities at its last ``n`` rows, weighted by the value vectors' sizes."""
        def read(key, _args, _kwargs, output):
            layer, block = int(key), self.read[int(key)]
            probs = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
            values = torch.cat(self.captured[layer])  # [keys, kv heads, d]
            if not isinstance(probs, torch.Tensor) or probs.dim() != 4 or probs.shape[-1] != len(values):
                got = tuple(probs.shape) if isinstance(probs, torch.Tensor) else type(probs).__name__
                raise UnsupportedModelError(
                    f"{self.method} reads the attention probabilities [batch, heads, rows, {len(values)} keys] that "
                    f"block {layer}'s {type(block.attention).__name__} returns with eager attention on a cache; it "
                    f"returned {got}")
            total = probs.shape[2]
            alpha = probs[:, :, total - self.n:]
            alpha = alpha if alpha.dtype == torch.float64 else alpha.float()
            values = repeat_values(values[None], self.heads, block, self.method)  # [1, keys, heads, d]
            _check_sums(alpha, block, self.method, probs.dtype)
            check_mix(alpha, values, output, block, torch.arange(total - self.n, total, device=alpha.device)[None],
                      self.method)
            w_o = block.head_projections(self.heads)  # [heads, d, hidden]
            gram = torch.einsum("hdo,heo->hde", w_o, w_o)  # ||W_O^h v||^2 = v^T W_O^h (W_O^h)^T v
            size = torch.einsum("thd,hde,the->th", values[0].to(gram.dtype), gram,
                                values[0].to(gram.dtype)).clamp_min(0).sqrt()  # [keys, heads]
            part = torch.einsum("hqt,th->qt", alpha[0].to(size.dtype), size)
            self.found = part if self.found is None else self.found + part
            return None

        with attention_weights(self.model), hooked({str(layer): block.attention
                                                    for layer, block in self.read.items()}, read):
            yield

    def result(self) -> torch.Tensor:
        """[n, keys] float32 (float64 for a float64 model), on the model's device."""
        if self.found is None:
            raise UnsupportedModelError(f"{self.method}: no block's attention was read in the rows' pass")
        return self.found
