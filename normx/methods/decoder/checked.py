"""Which attention readings have been checked on a model (:mod:`normx.methods.decoder.maps`): the checks (rows that
sum to one over the keys; value vectors that, mixed by them and projected, give the module's own output) run on a
model's first pass of each kind, not on every call; a kind whose recomputed rows were found unreadable goes straight
to the eager pass after. A kind is what can change the reading: the method and blocks read, the device and dtype,
whether rows are padded (a batch of several) and whether the tokens outrun a block's sliding window."""

from __future__ import annotations

from normx.core.verdicts import Verdicts

_SEEN = Verdicts()  # model -> {kind: True read | False unreadable}


def pass_kind(inputs: dict, read: dict, method: str) -> tuple:
    """The kind of a pass over ``inputs`` reading blocks ``read`` (layer -> BlockAttention) for ``method``."""
    ids = inputs["input_ids"]
    blocks = list(read.values())
    weights = [getattr(block.output, "weight", None) for block in blocks if block.output is not None]
    weights += [next(blocks[0].attention.parameters(), None)] if blocks else []
    dtype = next((str(w.dtype) for w in weights if w is not None), None)
    windows = [getattr(block.attention, "sliding_window", None) for block in blocks]
    outrun = any(isinstance(w, int) and 0 < w < ids.shape[1] for w in windows)
    return method, tuple(sorted(read)), str(ids.device), dtype, ids.shape[0] > 1, outrun


def verdict(model, kind: tuple) -> bool | None:
    """True: this kind was read and checked on ``model``; False: found unreadable (eager); None: not yet."""
    return _SEEN.get(model, kind)


def record(model, kind: tuple, readable: bool) -> None:
    _SEEN.record(model, kind, readable)
