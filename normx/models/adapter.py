"""What an adapter is: where a model family keeps its embeddings, blocks, final norm and head-on-top."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal

from normx._torch import torch
from normx.errors import InvalidInputError
from normx.models.decoder_attention import AttentionParts, read_block_attention
from normx.models.encoder import BlockLayout
from normx.models.modules import ModuleRef, resolve
from normx.models.structure import kept

if TYPE_CHECKING:  # torch is imported by the functions that run models, not on import (instant `normx supported`)
    from torch import nn

Pooling = Literal["first", "last", "mask", "mean", "late"]
HeadFn = "Callable[[nn.Module, torch.Tensor, torch.Tensor | None], torch.Tensor]"


class HeadKind(str, Enum):
    """The kind of head-on-top a model has. A ``str`` enum: it compares equal to its value and reads as it in JSON
    and messages."""

    SEQUENCE_CLASSIFICATION = "sequence_classification"
    MASKED_LM = "masked_lm"
    CAUSAL_LM = "causal_lm"

    def __str__(self) -> str:
        return self.value

    @property
    def vocabulary(self) -> bool:
        """Its outputs are the vocabulary (masked- and causal-LM heads), not named classes."""
        return self is not HeadKind.SEQUENCE_CLASSIFICATION


@dataclass(frozen=True)
class Adapter:
    """How normx reaches into one model family.

    Module references are dotted attribute paths from the (PEFT-unwrapped) model, e.g. ``"bert.encoder.layer"``,
    or functions ``model -> module``.

    - ``embeddings``: the module whose output is x^0, i.e. ``hidden_states[0]`` of ``output_hidden_states``; or
      ``None``: x^0 is the input of the first block (what ``hidden_states[0]`` is in every architecture).
    - ``blocks``: the module list of transformer blocks; block l's output is x^(l+1). A module may appear several
      times, in the order it runs (layers shared across the stack, as in ALBERT): each call is read in turn.
    - ``final_norm``: decoders only: the norm the model applies before its head (also applied to every x^l
      before the head is run on it).
    - ``head(model, h, columns)``: the head-on-top applied to token representations ``h`` of shape [N, hidden]
      as if each were the pooled token; returns [N, C]. For LM heads ``columns`` (a LongTensor of vocabulary
      ids) selects the output columns; ``None`` means all of them.
    - ``pooling``: the position whose head output is the model's prediction: ``"first"`` ([CLS]), ``"last"``
      (last non-padding token: decoders) or ``"mask"`` (the mask token, for masked-LM heads); or ``"mean"``: the
      head reads the mean of the real tokens' representations (ModernBERT's ``classifier_pooling="mean"``), so
      LogAt is the head on each token's representation alone; the first token stands as the pooled position; or
      ``"late"``: the prediction is the mean of the head's outputs on every real token (EuroBERT's
      ``classifier_pooling="late"``), so LogAt is exactly each token's term of that mean (times the length).
    - ``reserved_positions(config)``: position-table rows the model keeps for itself (RoBERTa-style tables
      reserve ``padding_idx + 1``), so the longest input is the table's size minus these.
    - ``encoder_block``: for post-LayerNorm BERT-style encoders, where a block keeps its parts
      (:class:`~normx.models.encoder.BlockLayout`): what GlobEnc, ALTI, Value Zeroing and DecompX read.
    - ``head_steps(model)``: the head-on-top as decomposable steps (:class:`~normx.models.encoder.Step`), for
      DecompX.
    - ``decoder_attention(block, config)``: for a decoder family whose attention follows none of the conventions of
      :mod:`normx.models.decoder_attention`, its own reader of one block's self-attention parts
      (:class:`~normx.models.decoder_attention.AttentionParts`, or a sentence saying why not); what every decoder
      attention method reads (:meth:`attention_parts`).
    """

    family: str
    kind: HeadKind  # given as a HeadKind or its value
    embeddings: ModuleRef | None
    blocks: ModuleRef
    head: HeadFn
    pooling: Pooling
    final_norm: ModuleRef | None = None
    word_embeddings: ModuleRef | None = None
    reserved_positions: Callable[[Any], int] | None = None
    encoder_block: BlockLayout | None = None
    head_steps: Callable[[nn.Module], list] | None = None
    decoder_attention: Callable[[nn.Module, Any], AttentionParts | str] | None = None

    def __post_init__(self):
        object.__setattr__(self, "kind", HeadKind(self.kind))

    @property
    def decoder(self) -> bool:
        """A left-to-right decoder: pools the last token, runs without a key-value cache."""
        return self.pooling == "last"

    @property
    def forward_kwargs(self) -> dict[str, Any]:
        """Keyword arguments normx adds to the backbone's forward (decoders: no key-value cache)."""
        return {"use_cache": False} if self.decoder else {}

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
        """The word embedding table (``"word"``), or the module whose output is x^0 (``"layer"``; with
        ``embeddings=None`` the first block, whose *input* x^0 is)."""
        if which == "word":
            if self.word_embeddings is not None:
                return resolve(model, self.word_embeddings)
            return model.get_input_embeddings()
        if self.embeddings is None:
            return self.block_modules(model)[0]
        return resolve(model, self.embeddings)

    def block_modules(self, model: nn.Module) -> list[nn.Module]:
        return list(self._blocks(model))

    def _blocks(self, model: nn.Module) -> tuple[nn.Module, ...]:
        return kept(model, ("blocks", id(self)), lambda: tuple(resolve(model, self.blocks)))

    def attention_parts(self, model: nn.Module, block: nn.Module) -> AttentionParts | str:
        """One decoder block's self-attention parts (``decoder_attention``, else transformers' conventions), or
        why they cannot be read. ``model`` is the (PEFT-unwrapped) model the block belongs to."""
        config = getattr(model, "config", None)
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        return (self.decoder_attention or read_block_attention)(block, config)

    def norm_module(self, model: nn.Module) -> nn.Module | None:
        return None if self.final_norm is None else resolve(model, self.final_norm)

    def num_layers(self, model: nn.Module) -> int:
        return len(self._blocks(model))

    def shared_position(self, width: int) -> int | None:
        """The position every row of a batch pools at when each row fills all ``width`` positions (no padding, none
        ending with the pad token: :attr:`normx.core.forward.Pass.full`), known without reading the batch: the first
        (``"first"``, ``"mean"``, ``"late"``) or the last (``"last"``); None where the tokens decide (``"mask"``)."""
        if self.pooling in ("first", "mean", "late"):
            return 0
        return width - 1 if self.pooling == "last" else None

    def pooled_positions(self, config, inputs: dict[str, torch.Tensor], mask_token_id: int | None = None
                         ) -> torch.Tensor:
        """[B] the position whose head output is the model's prediction, in a padded batch: the first real token
        (``"first"``), the last (``"last"``; a decoder classifier skips trailing pad tokens, as transformers does),
        or the first mask token (``"mask"``; :class:`InvalidInputError` for a row without one)."""
        mask = inputs["attention_mask"]
        if self.pooling in ("first", "mean", "late"):  # the first non-padding position (argmax: the first maximum)
            return (mask if mask.dtype is torch.int64 else (mask != 0).long()).argmax(-1)
        positions = torch.arange(mask.shape[1], device=mask.device)
        if self.pooling == "last":
            keep = mask
            pad = getattr(config, "pad_token_id", None)
            if self.kind is HeadKind.SEQUENCE_CLASSIFICATION and pad is not None:
                # as transformers' decoder classifiers: the last token that is not the pad token (a trailing
                # </s> that doubles as pad token is skipped)
                not_pad = mask * (inputs["input_ids"] != pad)
                keep = torch.where(not_pad.any(-1, keepdim=True), not_pad, mask)
            return (keep * positions).argmax(-1)  # last non-padding position
        found = (inputs["input_ids"] == mask_token_id) & mask.bool()
        missing = (~found.any(-1)).nonzero().flatten().tolist()
        if missing:
            raise InvalidInputError(
                f"a masked-LM head explains the prediction at the mask token, but text(s) {missing} of this batch "
                "contain no mask token; put the tokenizer's mask token where the word to predict goes"
            )
        return found.int().argmax(-1)  # the first mask token

    def pool(self, hidden: torch.Tensor, pooled: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """What the head reads of ``hidden`` [B, T, H] for the prediction: the pooled positions [B], or with
        ``"mean"`` pooling the mean over the real tokens (``mask`` [B, T])."""
        if self.pooling in ("mean", "late"):
            return _masked_mean(hidden, mask)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), pooled]

    def pooled_head(self, model: nn.Module, hidden: torch.Tensor, pooled: torch.Tensor, mask: torch.Tensor,
                    columns: torch.Tensor | None = None) -> torch.Tensor:
        """The model's prediction [B, C] from its last representations ``hidden`` [B, T, H]: the head on what it
        pools (:meth:`pool`), or with ``"late"`` pooling the mean of the head on every real token."""
        if self.pooling == "late":
            out = self.head(model, hidden.reshape(-1, hidden.shape[-1]), columns)
            return _masked_mean(out.reshape(*hidden.shape[:2], -1), mask)
        return self.head(model, self.pool(hidden, pooled, mask), columns)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``values`` [B, T, D] over the real tokens of ``mask`` [B, T] -> [B, D]."""
    weights = mask.to(values.dtype)[..., None]
    return (values * weights).sum(1) / weights.sum(1).clamp_min(1)
