"""One padded batch of token ids, as normx gives it to a model: what :func:`normx.core.inputs.encode` makes of a text
(:class:`Encoded`) and how rows are padded into a batch (:func:`collate`). The first-use check
(:mod:`normx.core.verify`) builds its probe with the same function, so what it checks is what normx runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from normx._torch import torch
from normx.errors import InvalidInputError


@dataclass
class Encoded:
    """One tokenised text or pair, unpadded."""

    text: str
    text_pair: str | None
    ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    segments: list[int]  # 0 = text, 1 = text_pair, -1 = special token
    special: list[bool]
    extra: dict[str, list[int]] = field(default_factory=dict)  # e.g. token_type_ids
    warnings: list[str] = field(default_factory=list)


def collate(items: list[Encoded], pad_id: int | None, device) -> dict[str, torch.Tensor]:
    """Pad a list of encodings on the right into a batch of exactly what the tokenizer gives for each text
    (``input_ids``, ``attention_mask`` and its other inputs), nothing added.

    Right padding and nothing else is what keeps every row the computation the model does on the text alone, in
    every family: the padding comes after the row's tokens, so a causal model's tokens never see it and an encoder
    masks it, and each model numbers the row's positions by its own convention (0, 1, ... or RoBERTa's from
    ``padding_idx + 1``), as it does when it is called on the text alone. Left padding would need position ids, and
    a passed ``position_ids`` overrides the model's own numbering. :func:`normx.core.verify.verify` checks a padded
    batch of this function against each row run alone through the model's plain forward."""
    width = max(len(item.ids) for item in items)
    if pad_id is None:
        if any(len(item.ids) != width for item in items):
            raise InvalidInputError("the tokenizer has neither a pad nor an end-of-sequence token, so texts of "
                                    "different lengths cannot share a batch: set tokenizer.pad_token, or pass "
                                    "batch_size=1")
        pad_id = 0  # never written: every row is full width
    names = ["input_ids", "attention_mask", *items[0].extra]
    # one array for all inputs, filled in numpy (a torch op per row costs more), moved in one go
    batch = np.zeros((len(names), len(items), width), np.int64)
    batch[0] = pad_id
    for row, item in enumerate(items):
        n = len(item.ids)
        batch[0, row, :n] = item.ids
        batch[1, row, :n] = 1
        for k in range(2, len(names)):
            batch[k, row, :n] = item.extra[names[k]]
    return dict(zip(names, torch.from_numpy(batch).to(device).unbind(0)))


def id_tensor(ids: Sequence[int], device=None) -> torch.Tensor:
    """A list of token ids (or positions) as a 1-D int64 tensor, on ``device`` when given. Through numpy:
    ``torch.tensor`` of a Python list reads it item by item (~0.4 ms for 2,000 ids, beside a forward pass that takes
    milliseconds on a card), ``np.fromiter`` ten times faster."""
    out = torch.from_numpy(np.fromiter(ids, np.int64, len(ids)))
    return out if device is None else out.to(device)
