"""How an offline preset is trained (plain data: importing it costs nothing; :mod:`normx.zoo.training` runs it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    """How a preset is trained."""

    task: str  # a normx.data.glue task, or "blimp" (a masked LM on BLiMP pairs, normx.zoo.blimp_training)
    target_modules: tuple[str, ...]  # LoRA targets
    modules_to_save: tuple[str, ...]  # trained in full and saved (the head)
    rank: int = 8
    alpha: int = 16
    dropout: float = 0.1
    lr: float = 5e-4
    epochs: float = 1.0
    batch_size: int = 32
    max_length: int = 128
    warmup: float = 0.06
    train_limit: int | None = None  # train on a seeded subset of this many examples
    eval_batch_size: int = 64


def metric_name(task: str) -> str:
    return "pearson" if task == "stsb" else "accuracy"
