"""The registry of attribution methods: what a method is (:class:`Method`, its :class:`Option` s, the :class:`Context`
it computes from) and the registry by name. It imports no implementation.

A method turns a :class:`Context` (one batch after its forward pass, with resolved targets) into scores of shape [batch,
targets, layers, tokens]. Implementations register themselves when imported (the package :mod:`normx.methods` imports
the built-in ones); register more with :func:`register_method`. Everything about a method (options, what it supports,
cost, display name) is on its :class:`Method`: the command line, the demo, the evaluation and the benchmarks read it
from there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from normx._torch import torch
from normx.core.labels import is_regression
from normx.errors import InvalidInputError, UnknownMethodError
from normx.models import Adapter, HeadKind, get_adapter, unwrap_model

if TYPE_CHECKING:
    from normx.core.forward import Pass
    from normx.core.labels import LabelSpace
    from normx.methods.response import ResponseContext, ResponseRows


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

    def expand(self, per_token: torch.Tensor) -> torch.Tensor:
        """A label-independent [B, layers, T] score, repeated for each target -> [B, K, layers, T]."""
        return per_token[:, None].expand(-1, self.columns.shape[1], -1, -1)


@dataclass(frozen=True)
class Option:
    """One keyword option of a method: its default, what it means, and the values it takes.

    ``type`` is ``int``, ``float``, ``bool`` or ``str`` (``None``: not checked); ``choices`` lists the allowed
    values; ``none`` allows ``None`` too. ``flag`` is the command-line spelling when it is not ``--name`` (for a
    ``bool`` option: ``--name`` when the default is False, ``--no-name`` when it is True).
    """

    name: str
    default: Any
    help: str
    type: type | None = None
    choices: tuple | None = None
    none: bool = False
    flag: str | None = None

    def check(self, value: Any, method: str) -> Any:
        """``value`` checked and normalised (numpy scalars to Python); :class:`InvalidInputError` otherwise."""
        if value is None and (self.none or self.default is None):
            return None
        if self.type is bool:
            if not isinstance(value, (bool, np.bool_)):
                raise InvalidInputError(f"{method}: {self.name} must be True or False, got {value!r}")
            return bool(value)
        if self.type is int:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise InvalidInputError(f"{method}: {self.name} must be an integer, got {value!r}")
            value = int(value)
        elif self.type is float:
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise InvalidInputError(f"{method}: {self.name} must be a number, got {value!r}")
            value = float(value)
        elif self.type is str and not isinstance(value, str):
            raise InvalidInputError(f"{method}: {self.name} must be a string, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise InvalidInputError(f"{self.name}={value!r} is not allowed; use one of {self.choices}")
        return value


@dataclass(frozen=True)
class Method:
    """An attribution method and every fact about it.

    ``display``: its name in tables and figures. ``layered=False`` methods (gradients) attribute to the input
    embeddings only: their scores have one layer, reported as layer 0. ``predicts=True`` methods run their own
    forward pass and report the prediction from it (:meth:`Context.predict`, which also resolves the targets), so
    explain skips its capture pass for them: the context then has the pooled positions but no captured layers.
    ``options``: the keyword options it takes (:class:`Option`; given as a sequence, kept by name);
    ``check_options`` validates what the types cannot (raising :class:`~normx.errors.InvalidInputError`) and may
    normalise. ``supports(adapter)`` says why a model family is not supported (``None``: it is; the default:
    every family). ``diagnostics``: the per-text values the method reports. ``regression_distance``: on a
    regression head the score is how far a token's head output is from the prediction (LogAt, NormXLogit), which an
    evaluation may rank farthest or closest first. ``cost(tokens, targets, options)``
    estimates the work for one text of ``tokens`` tokens with ``targets`` explained labels, in forward passes of
    the model on that text (default: one); :mod:`normx.serving.budget` turns it into a work estimate servers can cap.
    ``reads_layers(layer, num_layers, options)``: the layers the score at ``layer`` reads (default: that layer),
    which the forward pass then captures too. ``experimental=True``: a candidate under study (docs/variants.md),
    usable by name but left out of :func:`list_methods` and so of every default list (CLI, demo, evaluations).
    """

    name: str
    compute: Callable[[Context], torch.Tensor]
    description: str
    display: str = ""
    default_layer: Literal["last", "input"] = "last"
    label_dependent: bool = True
    layered: bool = True
    predicts: bool = False
    options: Mapping[str, Option] = field(default_factory=dict)
    check_options: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    supports: Callable[[Any], str | None] | None = None
    diagnostics: tuple[str, ...] = ()
    cost: Callable[[int, int, Mapping[str, Any]], float] | None = None
    regression_distance: bool = False  # on a regression head its score is a distance from the prediction
    shares: bool = False  # its scores are non-negative shares summing to one over the tokens (a mixing-map row)
    reads_layers: Callable[[int, int, Mapping[str, Any]], Iterable[int]] | None = None
    experimental: bool = False  # usable by name, not offered by default
    explains_regression: bool = True  # False: it needs a head with two or more classes
    foil_curve: bool = False  # evidence alignment also reads its score for the foil (LogAt's target and foil curves)
    # its score at position i reads only position i's representations in the pass that makes the prediction (the
    # head-on-top methods): in a causal LM one pass over a prompt and its continuation holds every generation step
    per_position: bool = False
    # its scores read the head at all its columns on every position (the head-on-top methods, Pass.every_head): on a
    # head of a few columns the prediction is read off that same run, not a second run at the pooled position
    reads_head: bool = False
    # label-independent methods whose score for the prediction at query position q is row q of a per-query map that
    # one forward pass holds (decoder attention maps): query_rows(ctx, queries [B, Q]) -> [B, Q, layers, T] runs that
    # pass itself on ctx.run (located only; its captured layers are there after) and returns the rows at each
    # batch row's own query positions; in a causal LM one pass over a prompt and its continuation holds every step
    query_rows: Callable[[Context, torch.Tensor], torch.Tensor] | None = None
    # it holds the model exclusively for a forward pass (eager attention, a model-wide switch): every other call on
    # the model waits meanwhile, so a server runs it in its lane for expensive work, never beside long work
    exclusive: bool = False
    # its computation reads its forward pass and never differentiates: run in torch.inference_mode, which skips
    # autograd's bookkeeping (a per-position method always is; ``grad_mode``)
    inference: bool = False
    # response-level computation (normx.methods.response): scores a causal LM's whole response from its own passes
    # (the ablations; the gradient methods' one backward pass of the response's log-probability), which
    # explain_generation runs with scope="response"; ``response_only`` methods have no other computation (their
    # ``compute`` refuses normx.explain), are always run that way and are listed only by
    # ``list_methods(response_only=True)``
    response: Callable[[ResponseContext], ResponseRows] | None = None
    response_only: bool = False
    # every generation step of one sequence from ONE forward pass over it (normx.methods.step_gradients: the
    # gradient methods and AttnLRP, one backward pass per step or batch of steps): explain_generation's per-step
    # computation for the method, same context and rows as ``response`` (rows[t] is step t's own row)
    steps: Callable[[ResponseContext], ResponseRows] | None = None
    # its scores read only the token ids and the attention mask (ctx.run.inputs) and ctx.columns, never the model
    # (random, recency): explain_generation runs no forward pass for it
    model_free: bool = False
    # how its scores read, which decides how every view draws them (normx.explanations.display): "signed" (the sign
    # says toward / away from the label, 0 is no effect), "relative" (a logit-like score whose zero is arbitrary:
    # compare tokens, not signs) or "magnitude" (unsigned amounts); or a function of the options that decide it
    reading: str | Callable[[Mapping[str, Any]], str] = "relative"
    # what besides its options decides its scores on a model, as plain data (calibrated_attention: the sha256 of the
    # weights it would read): a stored result is reused only under the same (normx evaluate context's records)
    state: Callable[[Any, Mapping[str, Any]], dict] | None = None

    def __post_init__(self):
        options = self.options
        if not isinstance(options, Mapping):
            options = {option.name: option for option in options}
        bad = [name for name, option in options.items() if not isinstance(option, Option) or option.name != name]
        if bad:
            raise TypeError(f"method {self.name!r}: options must be normx.Option objects, got {bad}")
        object.__setattr__(self, "options", dict(options))
        object.__setattr__(self, "display", self.display or self.name)

    def reading_for(self, options: Mapping[str, Any] | None = None, *, regression: bool = False,
                    foil: bool = False) -> str:
        """How its scores read with ``options`` (see ``reading``): on a regression head the head-on-top methods'
        distances are magnitudes; a contrast with a foil of a label-dependent method is signed."""
        reading = self.reading(self.resolve_options(dict(options or {}))) if callable(self.reading) else self.reading
        if regression and self.regression_distance:
            return "magnitude"
        if foil and self.label_dependent and reading == "relative":
            return "signed"
        return reading

    @property
    def explains_generation(self) -> bool:
        """It reads what a causal LM writes by one of explain_generation's own computations (one pass for every
        step, per-step or response-level passes, or no model at all), not by a pass per prefix of its own."""
        return bool(self.per_position or self.query_rows or self.steps or self.response or self.model_free)

    @property
    def all_layers(self) -> str | None:
        """The ``layer`` argument for every layer it has: ``"all"``, or ``None`` for a method without per-layer
        scores (gradients: layer 0 only)."""
        return "all" if self.layered else None

    @property
    def defaults(self) -> dict[str, Any]:
        """Option name -> default value."""
        return {name: option.default for name, option in self.options.items()}

    def unsupported(self, model_or_adapter) -> str | None:
        """Why this method cannot explain a model (given as the model, PEFT-wrapped or not, or its adapter), or
        ``None`` if it can. Only a model shows whether its head does regression (``explains_regression``)."""
        given_model = not isinstance(model_or_adapter, Adapter)
        adapter = get_adapter(model_or_adapter) if given_model else model_or_adapter
        if given_model and not self.explains_regression and adapter.kind is HeadKind.SEQUENCE_CLASSIFICATION:
            if is_regression(unwrap_model(model_or_adapter).config):
                return "it compares the label with the other classes, and this is a regression head (one output)"
        return None if self.supports is None else self.supports(adapter)

    def capture(self, layers: list[int], num_layers: int, options: Mapping[str, Any]) -> list[int]:
        """The layers a forward pass must capture for scores at ``layers`` (``reads_layers``)."""
        if self.reads_layers is None:
            return list(layers)
        read = {int(j) for layer in layers for j in self.reads_layers(layer, num_layers, options)}
        return sorted(read | set(layers))

    def passes(self, tokens: int, targets: int = 1, options: Mapping[str, Any] | None = None) -> float:
        """Estimated work for one text, in forward passes of the model on it (see ``cost``)."""
        if self.cost is None:
            return 1.0
        return float(self.cost(tokens, targets, self.resolve_options(dict(options or {}))))

    def grad_mode(self):
        """The autograd mode its pass runs in: ``torch.inference_mode()`` for a method that never differentiates
        (``inference``, ``per_position``), else ``torch.no_grad()`` (a gradient method enables gradients inside)."""
        return torch.inference_mode() if self.inference or self.per_position else torch.no_grad()

    def resolve_options(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The options for one call: ``given`` over the defaults; unknown names and bad values raise."""
        unknown = sorted(set(given) - set(self.options))
        if unknown:
            takes = ", ".join(f"{k}={v!r}" for k, v in self.defaults.items()) or "no options"
            raise InvalidInputError(f"method {self.name!r} does not take the option(s) {', '.join(unknown)}; it "
                                    f"takes: {takes}")
        resolved = {name: self.options[name].check(value, self.name) if name in given else value
                    for name, value in {**self.defaults, **given}.items()}
        return dict(self.check_options(resolved)) if self.check_options is not None else resolved


# explain's own settings keys, which an option name must not shadow
RESERVED_OPTIONS = frozenset({
    "method", "target", "foil", "layer", "embedding", "model_class", "family", "kind", "regression", "peft",
    "max_length", "dtype", "device", "label_dependent", "reading",
    "pooled_index", "text_pair", "batch_size", "truncation"})


_METHODS: dict[str, Method] = {}


def register_method(method: Method, *, overwrite: bool = False) -> None:
    if not isinstance(method, Method):
        raise TypeError(f"method must be a normx.Method, got {type(method).__name__}")
    clash = sorted(RESERVED_OPTIONS & set(method.options))
    if clash:
        raise ValueError(f"method {method.name!r} has option(s) {clash} named like explain's own arguments")
    if method.name in _METHODS and not overwrite:
        raise ValueError(f"a method named {method.name!r} is already registered; pass overwrite=True to replace it")
    _METHODS[method.name] = method


def get_method(name: str) -> Method:
    if not isinstance(name, str) or name not in _METHODS:
        import difflib

        known = list_methods(experimental=True, response_only=True)
        close = difflib.get_close_matches(name, known, n=1) if isinstance(name, str) else []
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UnknownMethodError(f"unknown method {name!r}; {hint}available methods: {', '.join(known)}")
    return _METHODS[name]


def list_methods(*, experimental: bool = False, response_only: bool = False) -> list[str]:
    """Names of the registered attribution methods; ``experimental=True`` adds the experimental ones (candidates
    under study, usable by name: ``Method.experimental``); ``response_only=True`` the methods that only score a
    whole response's sources (the ablations: ``Method.response_only``, for explain_generation and
    explain_context)."""
    return sorted(name for name, method in _METHODS.items()
                  if (experimental or not method.experimental) and (response_only or not method.response_only))


def describe_methods(*, experimental: bool = False) -> dict[str, str]:
    return {name: _METHODS[name].description for name in list_methods(experimental=experimental)}


def display_name(name: str) -> str:
    """A method's display name (``Method.display``); the name itself for one not registered here (e.g. a method
    in a stored report)."""
    return _METHODS[name].display if name in _METHODS else name


def methods_for(model_or_adapter) -> list[str]:
    """Names of the registered methods that support a model (or adapter)."""
    return [name for name in list_methods() if _METHODS[name].unsupported(model_or_adapter) is None]
