"""One forward pass with layer capture, and everything derived from it for one batch.

:class:`Pass` runs the backbone once with hooks on the embedding output and the requested blocks, then computes
the prediction by running the head at the pooled position, and LogAt by running the head on every token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .adapters import Adapter
from .errors import InvalidInputError
from .hooks import capture
from .targets import LabelSpace


@dataclass
class Pass:
    """The captured representations of one batch and the quantities the methods need.

    ``layers`` are the layers the caller asked for (0 = embedding output, L = last block); the last layer is
    always captured too, since the prediction is read from it, and so are the ``reads`` layers a method reads
    besides them (``Method.reads_layers``).
    """

    model: torch.nn.Module  # the transformers model (PEFT-unwrapped)
    adapter: Adapter
    inputs: dict[str, torch.Tensor]
    layers: list[int]
    embedding: str = "layer"
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    input_norm: torch.Tensor | None = None  # [B, T] float32: ||x_i^0||
    pooled: torch.Tensor | None = None  # [B] position of the pooled token
    mask_token_id: int | None = None  # masked-LM heads: the prediction is read at this token
    reads: tuple[int, ...] = ()  # more layers to capture
    _normed: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)  # decoders: norm(x^L)

    def run(self) -> Pass:
        model, adapter = self.model, self.adapter
        num_layers = adapter.num_layers(model)
        blocks = adapter.block_modules(model)
        layer_output = adapter.embedding_module(model, "layer")
        modules = {"x0": adapter.embedding_module(model, self.embedding)}
        for layer in sorted(set(self.layers) | set(self.reads) | {num_layers}):
            modules[f"h{layer}"] = layer_output if layer == 0 else blocks[layer - 1]
        transforms = {"x0": lambda t: t.float().norm(dim=-1)}  # keep only the norms of x^0, not x^0 itself
        kwargs = adapter.forward_kwargs
        with capture(modules, transforms) as store:
            model.base_model(**self.inputs, **kwargs)
        self.input_norm = store.pop("x0")
        self.hidden = {int(key[1:]): value for key, value in store.items()}
        return self.locate()

    def locate(self) -> Pass:
        """Only find the pooled positions, without the forward pass (for methods that run their own)."""
        self.pooled = self._pooled_positions()
        return self

    # ---- positions -------------------------------------------------------------------------------------------------
    def _pooled_positions(self) -> torch.Tensor:
        mask = self.inputs["attention_mask"]
        positions = torch.arange(mask.shape[1], device=mask.device)
        if self.adapter.pooling == "first":
            return (mask * (mask.shape[1] - positions)).argmax(-1)  # first non-padding position
        if self.adapter.decoder:
            keep = mask
            pad = getattr(self.model.config, "pad_token_id", None)
            if self.adapter.kind == "sequence_classification" and pad is not None:
                # as transformers' decoder classifiers: the last token that is not the pad token (a trailing
                # </s> that doubles as pad token is skipped)
                not_pad = mask * (self.inputs["input_ids"] != pad)
                keep = torch.where(not_pad.any(-1, keepdim=True), not_pad, mask)
            return (keep * positions).argmax(-1)  # last non-padding position
        return self.mask_positions

    @property
    def mask_positions(self) -> torch.Tensor:
        found = (self.inputs["input_ids"] == self.mask_token_id) & self.inputs["attention_mask"].bool()
        missing = (~found.any(-1)).nonzero().flatten().tolist()
        if missing:
            raise InvalidInputError(
                f"a masked-LM head explains the prediction at the mask token, but text(s) {missing} of this batch "
                "contain no mask token; put the tokenizer's mask token where the word to predict goes"
            )
        return found.int().argmax(-1)  # the first mask token

    # ---- head --------------------------------------------------------------------------------------------------------
    def head_input(self, layer: int) -> torch.Tensor:
        """x^l as the head sees it: decoders apply their final norm first, as the model does. The last layer's,
        read by both the prediction and the scores, is normed once and kept."""
        hidden = self.hidden[layer]
        norm = self.adapter.norm_module(self.model)
        if norm is None:
            return hidden
        if layer != max(self.hidden):
            return norm(hidden)
        if layer not in self._normed:
            self._normed[layer] = norm(hidden)
        return self._normed[layer]

    def head(self, hidden: torch.Tensor, columns: torch.Tensor | None = None) -> torch.Tensor:
        """The head-on-top on every position of ``hidden`` [B, T, H] -> [B, T, C]."""
        b, t, h = hidden.shape
        return self.adapter.head(self.model, hidden.reshape(b * t, h), columns).reshape(b, t, -1)

    def pooled_logits(self) -> torch.Tensor:
        """The model's prediction logits [B, C] (all classes, or the whole vocabulary), from the last layer."""
        last = self.head_input(max(self.hidden))
        rows = torch.arange(last.shape[0], device=last.device)
        return self.adapter.head(self.model, last[rows, self.pooled], None)

    def logat(self, labels: LabelSpace, columns: torch.Tensor, foil: torch.Tensor | None) -> torch.Tensor:
        """LogAt scores [B, K, len(layers), T] for target columns [B, K] (minus the foil column [B], if given)."""
        return torch.stack([self.logat_at(layer, labels, columns, foil) for layer in self.layers], dim=2)

    def logat_at(self, layer: int, labels: LabelSpace, columns: torch.Tensor, foil: torch.Tensor | None
                 ) -> torch.Tensor:
        """LogAt scores [B, K, T] at one captured layer."""
        hidden = self.head_input(layer)
        if labels.regression:
            rows = torch.arange(columns.shape[0], device=columns.device)
            out = self.head(hidden).float()  # [B, T, 1]
            pooled = out[rows, self.pooled]  # HoT(CLS) at the same layer
            return (out - pooled[:, None, :]).abs().permute(0, 2, 1)
        if labels.is_vocabulary:
            wanted = columns if foil is None else torch.cat([columns, foil[:, None]], dim=1)
            vocab, index = torch.unique(wanted, return_inverse=True)
            out = self.head(hidden, vocab).float()  # [B, T, U] only the needed vocabulary columns
            index_t, index_f = (index, None) if foil is None else (index[:, :-1], index[:, -1])
        else:
            out = self.head(hidden).float()  # [B, T, C]
            index_t, index_f = columns, foil
        scores = torch.gather(out, 2, index_t[:, None, :].expand(-1, out.shape[1], -1))  # [B, T, K]
        if index_f is not None:
            scores = scores - torch.gather(out, 2, index_f[:, None, None].expand(-1, out.shape[1], 1))
        return scores.permute(0, 2, 1)  # [B, K, T]

    def hidden_norms(self) -> torch.Tensor:
        """||x_i^l|| for the requested layers [B, len(layers), T]; layer 0 is the chosen input embedding."""
        norms = [self.input_norm if layer == 0 else self.hidden[layer].float().norm(dim=-1) for layer in self.layers]
        return torch.stack(norms, dim=1)
