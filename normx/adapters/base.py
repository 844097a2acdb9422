"""What an adapter is: where a model family keeps its embeddings, blocks, final norm and head-on-top."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # torch is imported by the functions that run models, not on import (instant `normx supported`)
    import torch
    from torch import nn

    from .encoder import BlockLayout

Kind = Literal["sequence_classification", "masked_lm", "causal_lm"]
Pooling = Literal["first", "last", "mask"]
ModuleRef = "str | Callable[[nn.Module], nn.Module]"
HeadFn = "Callable[[nn.Module, torch.Tensor, torch.Tensor | None], torch.Tensor]"


@dataclass(frozen=True)
class Adapter:
    """How normx reaches into one model family.

    Module references are dotted attribute paths from the (PEFT-unwrapped) model, e.g. ``"bert.encoder.layer"``,
    or functions ``model -> module``.

    - ``embeddings``: the module whose output is x^0, i.e. ``hidden_states[0]`` of ``output_hidden_states``.
    - ``blocks``: the module list of transformer blocks; block l's output is x^(l+1).
    - ``final_norm``: decoders only: the norm the model applies before its head (also applied to every x^l
      before the head is run on it).
    - ``head(model, h, columns)``: the head-on-top applied to token representations ``h`` of shape [N, hidden]
      as if each were the pooled token; returns [N, C]. For LM heads ``columns`` (a LongTensor of vocabulary
      ids) selects the output columns; ``None`` means all of them.
    - ``pooling``: the position whose head output is the model's prediction: ``"first"`` ([CLS]), ``"last"``
      (last non-padding token: decoders) or ``"mask"`` (the mask token, for masked-LM heads).
    - ``reserved_positions(config)``: position-table rows the model keeps for itself (RoBERTa-style tables
      reserve ``padding_idx + 1``), so the longest input is the table's size minus these.
    - ``encoder_block``: for post-LayerNorm BERT-style encoders, where a block keeps its parts
      (:class:`~normx.adapters.encoder.BlockLayout`): what GlobEnc, ALTI, Value Zeroing and DecompX read.
    - ``head_steps(model)``: the head-on-top as decomposable steps (:class:`~normx.adapters.encoder.Step`), for
      DecompX.
    """

    family: str
    kind: Kind
    embeddings: ModuleRef
    blocks: ModuleRef
    head: HeadFn
    pooling: Pooling
    final_norm: ModuleRef | None = None
    word_embeddings: ModuleRef | None = None
    reserved_positions: Callable[[Any], int] | None = None
    encoder_block: BlockLayout | None = None
    head_steps: Callable[[nn.Module], list] | None = None

    @property
    def decoder(self) -> bool:
        """A left-to-right decoder: pools the last token, pads on the tokenizer's side, gets position ids."""
        return self.pooling == "last"

    @property
    def forward_kwargs(self) -> dict[str, Any]:
        """Keyword arguments normx adds to the backbone's forward (decoders: no key-value cache)."""
        return {"use_cache": False} if self.decoder else {}

    def padding_side(self, tokenizer) -> str:
        """Decoders pad where their tokenizer pads (position ids skip the padding); encoders on the right."""
        return getattr(tokenizer, "padding_side", "right") if self.decoder else "right"

    def max_positions(self, config) -> int | None:
        """The longest input the model's position table takes, or None if it has no limit in its config."""
        for attr in ("max_position_embeddings", "n_positions"):
            value = getattr(config, attr, None)
            if isinstance(value, int) and value > 0:
                return value - (self.reserved_positions(config) if self.reserved_positions is not None else 0)
        return None

    def module(self, model: nn.Module, ref: ModuleRef) -> nn.Module:
        return resolve(model, ref)

    def embedding_module(self, model: nn.Module, which: str = "layer") -> nn.Module:
        if which == "word":
            if self.word_embeddings is not None:
                return resolve(model, self.word_embeddings)
            return model.get_input_embeddings()
        return resolve(model, self.embeddings)

    def block_modules(self, model: nn.Module) -> list[nn.Module]:
        return list(resolve(model, self.blocks))

    def norm_module(self, model: nn.Module) -> nn.Module | None:
        return None if self.final_norm is None else resolve(model, self.final_norm)

    def num_layers(self, model: nn.Module) -> int:
        return len(self.block_modules(model))


def resolve(model: nn.Module, ref: ModuleRef) -> nn.Module:
    if callable(ref) and not isinstance(ref, str):
        return ref(model)
    obj = model
    for part in ref.split("."):
        obj = getattr(obj, part)
    return obj


def active_module(module: nn.Module) -> nn.Module:
    """The module that actually runs: unwraps PEFT's ``ModulesToSaveWrapper`` to the active adapter's copy."""
    if hasattr(module, "modules_to_save") and hasattr(module, "original_module"):
        if getattr(module, "disable_adapters", False):
            return module.original_module
        names = getattr(module, "active_adapters", None) or [getattr(module, "active_adapter", None)]
        for name in names:
            if name in module.modules_to_save:
                return module.modules_to_save[name]
        return module.original_module
    return module


def linear_columns(layer: nn.Module, x: torch.Tensor, columns: torch.Tensor | None) -> torch.Tensor:
    """``layer(x)[..., columns]`` without computing the other columns when ``layer`` is a plain Linear."""
    import torch.nn.functional as F
    from torch import nn

    layer = active_module(layer)
    if columns is None:
        return layer(x)
    if type(layer) is nn.Linear:
        bias = None if layer.bias is None else layer.bias[columns]
        return F.linear(x, layer.weight[columns], bias)
    # A wrapped layer (e.g. LoRA on the LM head) must run whole so its adapter applies.
    return layer(x)[..., columns]
