"""The registry of attribution methods.

A method turns a :class:`Context` (one batch after its forward pass, with resolved targets) into scores of shape
[batch, targets, layers, tokens]. Register more with :func:`register_method`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from .errors import InvalidInputError, UnknownMethodError
from .forward import Pass
from .targets import LabelSpace


@dataclass
class Context:
    """What a method sees: the batch's forward pass, the label space and the resolved target columns."""

    run: Pass
    labels: LabelSpace
    columns: torch.Tensor | None  # [B, K] target columns (None until ``predict`` for methods that predict)
    foil: torch.Tensor | None  # [B] foil column, for contrastive scores
    options: dict[str, Any] = field(default_factory=dict)  # the method's options, defaults filled in
    diagnostics: dict[str, torch.Tensor] = field(default_factory=dict)  # per-row [B, K] values a method reports
    select: Callable[[torch.Tensor], torch.Tensor] | None = None  # prediction logits [B, C] -> target columns
    logits: torch.Tensor | None = None  # [B, C] float32 the prediction (methods with predicts=True: set by ``predict``)

    def predict(self, logits: torch.Tensor) -> torch.Tensor:
        """For methods with ``predicts=True``: report the model's prediction logits [B, C] (all classes, or the
        whole vocabulary) from the method's own forward pass; returns the target columns [B, K] they select."""
        self.logits = logits.detach().float()
        self.columns = self.select(self.logits)
        return self.columns

    def logat(self) -> torch.Tensor:
        return self.run.logat(self.labels, self.columns, self.foil)

    def expand(self, per_token: torch.Tensor) -> torch.Tensor:
        """A label-independent [B, layers, T] score, repeated for each target -> [B, K, layers, T]."""
        return per_token[:, None].expand(-1, self.columns.shape[1], -1, -1)


@dataclass(frozen=True)
class Method:
    """An attribution method.

    ``layered=False`` methods (gradients) attribute to the input embeddings only: their scores have one layer,
    reported as layer 0. ``predicts=True`` methods run their own forward pass and report the prediction from it
    (:meth:`Context.predict`, which also resolves the targets), so explain skips its capture pass for them: the
    context then has the pooled positions but no captured layers. ``options`` maps each keyword option the method
    takes to its default; ``check_options`` validates the resolved options (raising
    :class:`~normx.errors.InvalidInputError`) and may normalise them. ``cost(tokens, targets, options)`` estimates
    the work for one text of ``tokens`` tokens with ``targets`` explained labels, in forward passes of the model
    on that text (default: one); :mod:`normx.budget` turns it into a work estimate that servers can cap.
    """

    name: str
    compute: Callable[[Context], torch.Tensor]
    description: str
    default_layer: Literal["last", "input"] = "last"
    label_dependent: bool = True
    layered: bool = True
    predicts: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)
    check_options: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    cost: Callable[[int, int, Mapping[str, Any]], float] | None = None

    def passes(self, tokens: int, targets: int = 1, options: Mapping[str, Any] | None = None) -> float:
        """Estimated work for one text, in forward passes of the model on it (see ``cost``)."""
        if self.cost is None:
            return 1.0
        return float(self.cost(tokens, targets, self.resolve_options(dict(options or {}))))

    def resolve_options(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The options for one call: ``given`` over the defaults; unknown names and bad values raise."""
        unknown = sorted(set(given) - set(self.options))
        if unknown:
            takes = ", ".join(f"{k}={v!r}" for k, v in self.options.items()) or "no options"
            raise InvalidInputError(f"method {self.name!r} does not take the option(s) {', '.join(unknown)}; it "
                                    f"takes: {takes}")
        resolved = {**self.options, **given}
        return dict(self.check_options(resolved)) if self.check_options is not None else resolved


# explain's own settings keys, which an option name must not shadow
RESERVED_OPTIONS = frozenset({
    "method", "target", "foil", "layer", "embedding", "model_class", "family", "kind", "regression", "peft",
    "max_length", "dtype", "device", "label_dependent", "pooled_index", "text_pair", "batch_size", "truncation"})


_METHODS: dict[str, Method] = {}


def register_method(method: Method, *, overwrite: bool = False) -> None:
    if not isinstance(method, Method):
        raise TypeError(f"method must be a normx.methods.Method, got {type(method).__name__}")
    clash = sorted(RESERVED_OPTIONS & set(method.options))
    if clash:
        raise ValueError(f"method {method.name!r} has option(s) {clash} named like explain's own arguments")
    if method.name in _METHODS and not overwrite:
        raise ValueError(f"a method named {method.name!r} is already registered; pass overwrite=True to replace it")
    _METHODS[method.name] = method


def get_method(name: str) -> Method:
    if not isinstance(name, str) or name not in _METHODS:
        raise UnknownMethodError(f"unknown method {name!r}; available methods: {', '.join(list_methods())}")
    return _METHODS[name]


def list_methods() -> list[str]:
    """Names of the registered attribution methods."""
    return sorted(_METHODS)


def describe_methods() -> dict[str, str]:
    return {name: _METHODS[name].description for name in list_methods()}


def _normxlogit(ctx: Context) -> torch.Tensor:
    return ctx.run.input_norm[:, None, None, :] * ctx.logat()


def _logat(ctx: Context) -> torch.Tensor:
    return ctx.logat()


def _l2norm(ctx: Context) -> torch.Tensor:
    return ctx.expand(ctx.run.hidden_norms())


register_method(Method(
    "normxlogit", _normxlogit,
    "NormXLogit: ||x_i^0|| x LogAt(x_i^l); the input norm times the head's logit for the label on each token"))
register_method(Method(
    "logat", _logat,
    "LogAt: the head-on-top run on each token's layer-l representation, read at the label (|difference from "
    "the pooled token| for regression)"))
register_method(Method(
    "l2norm", _l2norm,
    "l2 norm of each token's representation (default layer 0, the input embedding); label-independent",
    default_layer="input", label_dependent=False))

from . import decompx as _decompx  # noqa: E402, F401  (registers DecompX)
from . import gradients as _gradients  # noqa: E402, F401  (registers the gradient baselines)
from . import mixing as _mixing  # noqa: E402, F401  (registers GlobEnc, ALTI, Value Zeroing)
