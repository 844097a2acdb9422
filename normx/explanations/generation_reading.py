"""What every way of explaining a generation reads the same way: the model's next-token logits at each step (the
generated token's probability, the top token, the shown alternatives) and the NaN after each step's own position,
each done for all steps at once (one top-k and one copy off the device; one mask), never in a loop over steps."""

from __future__ import annotations

import numpy as np

from normx._torch import torch
from normx.core.labels import LabelSpace


def step_readings(labels: LabelSpace, logits: torch.Tensor, made: list[int]
                  ) -> tuple[np.ndarray, list[int], list[dict[str, float]]]:
    """From the logits [n, V] predicting each generated token ``made`` [n]: (each one's probability [n] float32,
    the top token at each step, the probabilities of the top tokens and the generated one at each step)."""
    read = labels.read(logits.float(), [[token] for token in made])
    return np.array([p for p, in read.wanted], np.float32).reshape(len(made)), read.best, read.probabilities


def mask_after(matrix: np.ndarray, length: int) -> None:
    """NaN at and after each step's own position in ``matrix`` [..., steps, T] (step t explains the token at
    ``length + t``)."""
    steps, width = matrix.shape[-2:]
    np.copyto(matrix, np.float32(np.nan), where=np.arange(width)[None, :] >= length + np.arange(steps)[:, None])
