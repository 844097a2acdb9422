"""One handle per model: what normx resolves of a model once per call and hands down to every layer below.

A call (``explain``, a faithfulness run, a mixing map) starts from the model the user gave, PEFT-wrapped or not.
:func:`model_handle` resolves it once: the transformers model inside, its adapter verified against the model's own
outputs (:func:`normx.core.verify.verified_adapter`, checked once per model), and the model's lock
(:func:`normx.core.concurrency.model_lock`). The pipeline, the input layer (the longest input the model takes) and
the concurrency layer (:meth:`ModelHandle.using`) receive that handle instead of looking the model up again.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from normx.core.concurrency import ModelLock, model_lock, using
from normx.core.verify import takes_padding, verified_adapter
from normx.models import Adapter, first_parameter, unwrap_model

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True)
class ModelHandle:
    """A model as one normx call sees it."""

    model: nn.Module  # as the caller gave it (PEFT-wrapped or not): what runs the forward pass
    base: nn.Module  # the transformers model inside
    adapter: Adapter  # verified against the model's own outputs
    lock: ModelLock  # shared by every caller of this model

    @property
    def name(self) -> str:
        """The transformers class name (e.g. ``"BertForSequenceClassification"``)."""
        return type(self.base).__name__

    @property
    def config(self):
        return self.base.config

    @property
    def device(self) -> torch.device:
        """Where the inputs go: the device of the model's first parameter (its embeddings under a device map)."""
        return first_parameter(self.base).device

    @property
    def max_positions(self) -> int | None:
        """The longest input the model's position table takes, as its adapter reads it; None without a limit."""
        return self.adapter.max_positions(self.base.config)

    def rows_per_pass(self, batch_size: int) -> int:
        """``batch_size``, or 1 for a model whose right-padded batches differ from each text run alone (found by
        the first-use check: :func:`normx.core.verify.takes_padding`): such a model gets one text per pass."""
        return batch_size if takes_padding(self.base) else 1

    def using(self) -> AbstractContextManager[None]:
        """A stretch of normx work on the model (:func:`normx.core.concurrency.using`) under this handle's lock."""
        return using(self.base, self.lock)


def model_handle(model) -> ModelHandle:
    """The :class:`ModelHandle` of ``model`` (a handle is returned as it is); the first call on a model verifies its
    adapter (:class:`~normx.errors.UnsupportedModelError` naming the part that does not match)."""
    if isinstance(model, ModelHandle):
        return model
    base = unwrap_model(model)
    return ModelHandle(model, base, verified_adapter(model), model_lock(base, unwrapped=True))
