"""One forward pass with layer capture, and what a method reads of it for one batch.

:class:`Pass` runs the backbone once with hooks on the embedding output and the requested blocks, finds the pooled
positions (the adapter's rule), and runs the model's head: at the pooled position (the prediction) or on every
token's representation at a captured layer (what the head-on-top methods score). Where the model's own forward
returns those very tensors when asked for its hidden states by index (transformers' output capturing, found by the
first-use check: :class:`OwnForward`), the pass asks for them instead of hooking (hooks cost more than a short text's
forward pass does on a card).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from normx._torch import torch
from normx.core.hooks import capture
from normx.errors import HookNotFiredError
from normx.models import Adapter
from normx.models.structure import kept, recalled


@dataclass(frozen=True)
class OwnForward:
    """What the first-use check (:mod:`normx.core.verify`) found of the model's own forward, kept in its tree under
    :data:`OWN_FORWARD` (a change to its modules drops it; absent: a pass hooks and passes every input)."""

    # the layers whose hidden states its forward returns, asked for them by index (``output_hidden_states=[...]``:
    # transformers' output capturing), as the very tensors :func:`capture_layers` hooks (x^0 as layer 0)
    states: frozenset[int] = frozenset()
    # its backbone computes exactly the same without an all-ones attention mask as with it: a pass on rows that fill
    # their batch leaves the mask out (building and checking a mask of ones costs more than a short text's forward
    # pass does on a card)
    unmasked: bool = False


OWN_FORWARD = "the model's own forward"


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
    num_layers: int | None = None  # the model's blocks, where the caller has counted them (else counted here)
    full: bool = False  # every row fills the batch (its attention mask is all ones), as the caller who padded knows
    at: int | None = None  # the position every row pools at, where ``full`` makes it known on the host
    _normed: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)  # decoders: norm(x^L)
    _every: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)  # every_head's runs, by layer

    def run(self) -> Pass:
        model, adapter = self.model, self.adapter
        last = adapter.num_layers(model) if self.num_layers is None else self.num_layers
        layers = sorted(set(self.layers) | set(self.reads) | {last})
        inputs, own = self.inputs, recalled(model, OWN_FORWARD, _HOOKED)
        if self.full and own.unmasked:
            inputs = {name: value for name, value in inputs.items() if name != "attention_mask"}
        wanted = sorted({0, *layers})
        if self.embedding == "layer" and own.states.issuperset(wanted):  # the tensors the hooks would capture
            reported = model.base_model(**inputs, **adapter.forward_kwargs, output_hidden_states=wanted).hidden_states
            if len(reported) != last + 1 or any(reported[layer] is None for layer in wanted):
                raise HookNotFiredError(f"{type(model).__name__} reported {len(reported) - 1} layers' hidden states "
                                        f"without some of layers {wanted}, where its first-use check read {last} "
                                        "blocks")
            self.input_norm = _norms(reported[0])
            self.hidden = {layer: reported[layer] for layer in layers}
            return self.locate()
        # only the norms of x^0 are kept, not x^0 itself
        with capture_layers(model, adapter, layers, self.embedding, x0=_norms) as captured:
            model.base_model(**inputs, **adapter.forward_kwargs)
        self.input_norm = captured["x0"]  # [B, T]
        self.hidden = {layer: captured[layer] for layer in layers}
        return self.locate()

    def locate(self) -> Pass:
        """Only find the pooled positions, without the forward pass (for methods that run their own)."""
        self.pooled = self.adapter.pooled_positions(self.model.config, self.inputs, self.mask_token_id)
        if self.full:
            self.at = self.adapter.shared_position(self.inputs["input_ids"].shape[-1])
        return self

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

    def every_head(self, layer: int) -> torch.Tensor:
        """The head on every position of x^l at all its columns [B, T, C], run once per layer and kept: for heads
        of a few columns (classifiers, regression), which the head-on-top methods read whole; a vocabulary head is
        run at the columns a method needs instead (:meth:`head`)."""
        if self.adapter.kind.vocabulary:
            raise ValueError("every_head runs a head at all its columns on every position: not a vocabulary head's")
        if layer not in self._every:
            self._every[layer] = self.head(self.head_input(layer))
        return self._every[layer]

    def pooled_logits(self, every: bool = False) -> torch.Tensor:
        """The model's prediction logits [B, C] (all classes, or the whole vocabulary), from the last layer.
        ``every``: read off :meth:`every_head` (run now if it was not: the caller's method reads it too, at the
        layers asked for) where the head pools one position and the last layer is asked for; the same head on the
        same representation as run at the pooled position alone."""
        layer = max(self.hidden)
        if every and layer in self.layers and self.positional and not self.adapter.kind.vocabulary:
            return self.pooled_rows(self.every_head(layer))
        return self.pooled_head(self.head_input(layer))

    @property
    def positional(self) -> bool:
        """The head's prediction is its output at one position (not a mean over the tokens)."""
        return self.adapter.pooling not in ("mean", "late")

    def pooled_rows(self, every: torch.Tensor) -> torch.Tensor:
        """Each row's values at its pooled position: [B, T, ...] -> [B, ...]."""
        if self.at is not None:
            return every.select(1, self.at)
        index = self.pooled.reshape(-1, *[1] * (every.dim() - 1))
        return torch.take_along_dim(every, index, dim=1).squeeze(1)

    def pooled_head(self, hidden: torch.Tensor, columns: torch.Tensor | None = None) -> torch.Tensor:
        """The head on what it reads for the prediction (the pooled position, or the mean: ``Adapter.pool``) of
        ``hidden`` [B, T, H] -> [B, C]."""
        return self.adapter.pooled_head(self.model, hidden, self.pooled, self.inputs["attention_mask"], columns)

    def hidden_norms(self) -> torch.Tensor:
        """||x_i^l|| for the requested layers [B, len(layers), T]; layer 0 is the chosen input embedding."""
        norms = [self.input_norm if layer == 0 else _norms(self.hidden[layer]) for layer in self.layers]
        return torch.stack(norms, dim=1)


_HOOKED = OwnForward()  # nothing found (yet, or since the module tree changed): hooks, every input


def _norms(hidden: torch.Tensor) -> torch.Tensor:
    """||x_i|| in float32 over the last dimension [..., H] -> [...] (``Tensor.norm``'s Python wrapper costs more
    than the norm of a short text's tokens; this is the op it calls)."""
    return torch.linalg.vector_norm(hidden.float(), dim=-1)


@contextmanager
def capture_layers(model, adapter: Adapter, layers: Iterable[int], embedding: str = "layer",
                   x0: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Iterator[dict]:
    """Hook the adapter's capture points for one forward pass run in the body; the yielded dict is filled, after the
    body, with ``"x0"`` (the chosen input embedding: ``"layer"``, hidden_states[0], or ``"word"``; passed through
    ``x0`` inside the hook when given, so only what it returns is kept) and x^l for each of ``layers`` (0 = embedding
    output, l = block l's output). A block module that the adapter lists several times (layers shared across the
    stack) is read at each of its calls in order."""
    layers = tuple(layers)
    points = kept(model, ("capture", id(adapter), layers, embedding), lambda: _capture_points(model, adapter, layers,
                                                                                             embedding))
    captured: dict = {}
    with capture(points.modules, None if x0 is None else {"x0": x0}, inputs=points.inputs,
                 every_call=points.calls) as store:
        yield captured
    captured["x0"] = store["x0"]
    for layer, key, nth in points.reads:
        if key == "h0":
            captured[layer] = store[key]
            continue
        runs = store[key]
        if nth >= len(runs):
            raise HookNotFiredError(f"block {layer} ({type(points.modules[key]).__name__}) ran {len(runs)} time(s) "
                                    f"in the forward pass, not the {nth + 1} the adapter's stack of blocks says")
        captured[layer] = runs[nth]


@dataclass(frozen=True)
class _CapturePoints:
    """Where :func:`capture_layers` hooks a model: the modules by key, the keys read at their input and those read
    at every call, and for each layer (key, which call)."""

    modules: dict
    inputs: frozenset
    calls: frozenset
    reads: tuple


def _capture_points(model, adapter: Adapter, layers: tuple[int, ...], embedding: str) -> _CapturePoints:
    blocks = adapter.block_modules(model)
    first_input = adapter.embeddings is None  # x^0 is the first block's input
    layer_output = blocks[0] if first_input else adapter.embedding_module(model, "layer")
    word = embedding == "word"
    modules = {"x0": adapter.embedding_module(model, "word") if word else layer_output}
    inputs = {"x0"} if first_input and not word else set()
    reads = []
    if 0 in layers:
        modules["h0"] = layer_output
        inputs |= {"h0"} if first_input else set()
        reads.append((0, "h0", 0))
    first, call, seen = {}, [], Counter()  # a module's first index in the stack; which of its calls each block is
    for index, block in enumerate(blocks):
        first.setdefault(id(block), index)
        call.append(seen[id(block)])
        seen[id(block)] += 1
    for layer in layers:
        if layer > 0:  # keyed by the first layer whose output the module gives
            key = f"h{first[id(blocks[layer - 1])] + 1}"
            modules[key] = blocks[layer - 1]
            reads.append((layer, key, call[layer - 1]))
    calls = frozenset(key for key in modules if key.startswith("h") and key != "h0")
    return _CapturePoints(modules, frozenset(inputs), calls, tuple(reads))
