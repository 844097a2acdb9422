"""What the decomposition methods (DecompX, GlobEnc, ALTI, Value Zeroing) need to know of a BERT-style family:
where a post-LayerNorm encoder block keeps its parts, and the head-on-top as a chain of decomposable steps.

A family supports those methods when its :class:`~normx.models.Adapter` has an ``encoder_block`` layout (and,
for DecompX, ``head_steps``); nothing about a family is written anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from normx.models.modules import active_module

if TYPE_CHECKING:
    from torch import nn

PARTS = ("attention", "value", "attention_out", "ln1", "ffn_in", "ffn_act", "ffn_activation", "ffn_out", "ln2")


@dataclass(frozen=True)
class BlockLayout:
    """Dotted paths, relative to one encoder block, of the modules the decomposition methods read."""

    attention: str = "attention.self"  # returns (context, attention probabilities) under eager attention
    value: str = "attention.self.value"  # the value projection
    attention_out: str = "attention.output.dense"  # W_O, b_O
    ln1: str = "attention.output.LayerNorm"  # after attention + residual
    ffn_in: str = "intermediate.dense"  # the FFN's first linear map (its output: the pre-activation)
    ffn_act: str = "intermediate"  # the module whose output is the activation f(ffn_in(x))
    ffn_activation: str = "intermediate.intermediate_act_fn"  # the activation function itself
    ffn_out: str = "output.dense"  # the FFN's second linear map
    ln2: str = "output.LayerNorm"  # after FFN + residual

    def parts(self, block: nn.Module) -> dict[str, nn.Module]:
        """Every part of ``block`` by name; AttributeError naming the first missing one."""
        return {name: block.get_submodule(getattr(self, name)) for name in PARTS}

    def missing(self, block: nn.Module) -> str | None:
        """The path of the first part ``block`` lacks, or None."""
        for name in PARTS:
            try:
                block.get_submodule(getattr(self, name))
            except AttributeError:
                return getattr(self, name)
        return None


BERT_BLOCK = BlockLayout()


@dataclass(frozen=True)
class Step:
    """One step of a head: ``"linear"`` (an affine module), ``"activation"`` (an elementwise function with f(0) = 0)
    or ``"layer_norm"`` (an nn.LayerNorm)."""

    kind: str
    module: Any


def _linear(module) -> Step:
    return Step("linear", active_module(module))


def bert_classifier_steps(model) -> list[Step]:  # pooler dense, tanh, classifier
    pooler = active_module(model.bert.pooler)
    return [_linear(pooler.dense), Step("activation", pooler.activation), _linear(model.classifier)]


def roberta_classifier_steps(model) -> list[Step]:  # RoBERTa and XLM-R: dense, tanh, out_proj
    import torch

    head = active_module(model.classifier)
    return [_linear(head.dense), Step("activation", torch.tanh), _linear(head.out_proj)]


def electra_classifier_steps(model) -> list[Step]:  # dense, GeLU, out_proj
    head = active_module(model.classifier)
    return [_linear(head.dense), Step("activation", head.activation), _linear(head.out_proj)]


def bert_mlm_steps(model) -> list[Step]:
    predictions = active_module(model.cls).predictions
    transform = predictions.transform
    return [_linear(transform.dense), Step("activation", transform.transform_act_fn),
            Step("layer_norm", transform.LayerNorm), _linear(predictions.decoder)]


def roberta_mlm_steps(model) -> list[Step]:
    import torch.nn.functional as F

    head = active_module(model.lm_head)
    return [_linear(head.dense), Step("activation", F.gelu), Step("layer_norm", head.layer_norm),
            _linear(head.decoder)]


def electra_mlm_steps(model) -> list[Step]:
    pred = model.generator_predictions
    return [_linear(pred.dense), Step("activation", pred.activation), Step("layer_norm", pred.LayerNorm),
            _linear(model.generator_lm_head)]
