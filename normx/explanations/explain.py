"""The explanation pipeline behind ``normx.explain``: check and resolve the arguments (:func:`prepare`), encode and
batch the texts, attribute each batch (:func:`attribute_batch`: one forward pass), build the results."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from normx._torch import torch
from normx.core.forward import Pass
from normx.core.handle import ModelHandle, model_handle
from normx.core.inputs import Encoded, batches, encode, positive_int, resolve_max_length, text_inputs, warn_user
from normx.core.labels import LabelSpace
from normx.errors import InvalidInputError, LayerOutOfRangeError, PairNotSupportedError, PairRequiredError
from normx.explanations.kept_plans import kept_plan, key_of
from normx.explanations.result import Explanation, Explanations
from normx.methods import Context, Method, get_method
from normx.models import Adapter, HeadKind, first_parameter

EMBEDDINGS = ("layer", "word")


@overload
def explain(model, tokenizer, texts: str, method: str = ..., target=..., layer: int | str | Sequence[int] | None = ...,
            *, text_pair: str | None = ..., foil=..., embedding: str = ..., batch_size: int = ...,
            truncation: str = ..., max_length: int | None = ..., **options) -> Explanation: ...


@overload
def explain(model, tokenizer, texts: Sequence[str], method: str = ..., target=...,
            layer: int | str | Sequence[int] | None = ..., *, text_pair: Sequence[str] | None = ..., foil=...,
            embedding: str = ..., batch_size: int = ..., truncation: str = ..., max_length: int | None = ...,
            **options) -> list[Explanation]: ...


def explain(model, tokenizer, texts: str | Sequence[str], method: str = "normxlogit", target=None,
            layer: int | str | Sequence[int] | None = None, *, text_pair: str | Sequence[str] | None = None,
            foil=None, embedding: str = "layer", batch_size: int = 16, truncation: str = "warn",
            max_length: int | None = None, **options) -> Explanation | list[Explanation]:
    """Explain the model's prediction on each text.

    Args:
        model: a transformers model with a supported head (``normx.supported_models()``), PEFT-wrapped or not.
        tokenizer: its fast tokenizer.
        texts: one text or a list. A single string returns one :class:`Explanation`, a list returns a list.
        method: a name from ``normx.list_methods()``.
        target: the label(s) to explain: ``None`` = the predicted one, a label name or class index, a vocabulary
            token or id for LM heads, ``"all"`` for every class, or a list of these.
        layer: ``None`` (the method's default: the last layer; layer 0 for ``l2norm``), an index in ``0..L``
            (negative counts from the end), ``"all"``, or a list of indices. All come from one forward pass.
            Gradient methods have no per-layer scores: leave it ``None`` (their result has layer 0).
        text_pair: second texts for sentence-pair models (NLI, STS-B), one per text.
        foil: a label to subtract: scores become score(target) - score(foil) (contrastive explanations).
        embedding: x^0 for the norm: ``"layer"`` = the embedding layer's output (hidden_states[0]; default) or
            ``"word"`` = the raw word embedding.
        batch_size: texts per forward pass.
        truncation: ``"warn"`` truncates over-length inputs and records a warning; ``"error"`` raises.
        max_length: input length cap in tokens (1 .. what the model takes); default: what the model and tokenizer
            accept.
        **options: the method's own options (``normx.methods.registry.get_method(name).options`` has them with their
            defaults), e.g. ``n_steps=300`` for ``integrated_gradients``; recorded in ``settings``.

    Thread-safe: several threads may explain with one model at once, with any methods; each gets what it would
    get alone, and the model is left as it was (:mod:`normx.core.concurrency`).
    """
    single = isinstance(texts, str)
    texts, pairs = text_inputs(texts, text_pair)
    positive_int(batch_size, "batch_size")
    plan = prepare(model, tokenizer, method, target, layer, foil=foil, embedding=embedding, pair=pairs is not None,
                   **options)
    base, adapter = plan.base, plan.adapter
    limit = resolve_max_length(max_length, tokenizer, plan.handle, plan.max_positions)
    param = first_parameter(base)  # (its device: where the inputs go, ModelHandle.device; its dtype: the settings)
    encoded = encode(tokenizer, texts, pairs, limit, truncation)
    warn_user(encoded)
    if adapter.kind is HeadKind.MASKED_LM and tokenizer.mask_token_id is None:
        raise InvalidInputError(f"{type(base).__name__} has a masked-LM head but its tokenizer has no mask token")
    settings = {"method": plan.method.name, "target": target, "foil": foil, "layer": layer, "embedding": embedding,
                **model_settings(plan.handle, param), "max_length": limit,
                "label_dependent": plan.method.label_dependent,
                "reading": plan.reading, **plan.options}
    results: list[Explanation] = []
    for items, inputs in batches(encoded, plan.handle.rows_per_pass(batch_size), tokenizer, param.device):
        out = attribute_batch(plan, inputs, full=full_rows(items, plan.pad_token_id))
        scores = out.scores.cpu().numpy()
        diagnostics = {name: value.float().cpu() for name, value in out.diagnostics.items()}
        pooled = out.pooled.tolist()
        columns = out.columns.tolist()
        # every row's prediction, off the device in one go (its top column is the explained one: no target asked)
        best = None if plan.target_columns is not None else [row[0] for row in columns]
        read = plan.labels.read(out.logits, columns, best)
        for row, item in enumerate(items):  # a row's tokens are its first len(ids) positions (collate pads right)
            results.append(_explanation(item, scores[row][:, :, :len(item.ids)], columns[row],
                                        (read.labels[row], read.probabilities[row]), plan, settings,
                                        int(pooled[row]),
                                        {name: value[row].tolist() for name, value in diagnostics.items()}))
    return results[0] if single else Explanations(results)


def full_rows(items: list[Encoded], pad: int | None) -> bool:
    """Every row fills the batch (no padding), and none starts or ends with the model's pad token (transformers warns
    that such a row may be padded when it gets no attention mask; :attr:`normx.core.forward.Pass.full`)."""
    width = len(items[0].ids)
    return width > 0 and all(len(item.ids) == width and item.ids[0] != pad and item.ids[-1] != pad for item in items)


# ---- the attribution computation on an encoded batch ------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """What :func:`explain` resolves once per call, before any text is encoded: the model's adapter and label
    space, the method with its options, the target / foil columns and the layers."""

    handle: ModelHandle  # the model as given, the transformers model inside, its verified adapter and lock
    method: Method
    options: dict
    labels: LabelSpace
    target_columns: list[int] | None  # None: the predicted label
    foil_column: int | None
    layers: list[int]
    embedding: str
    mask_token_id: int | None
    reads: tuple[int, ...] = ()  # every layer the method's scores read, ``layers`` included (``Method.capture``)
    num_layers: int | None = None  # the model's blocks (its last layer), as the plan was resolved
    reading: str | None = None  # how its scores read (``Method.reading_for`` its options, head and foil)
    pad_token_id: int | None = None  # the config's pad token (:func:`full_rows`)
    max_positions: int | None = ...  # the model's position table (``ModelHandle.max_positions``; ...: not read)

    @property
    def model(self) -> torch.nn.Module:
        return self.handle.model

    @property
    def base(self) -> torch.nn.Module:
        return self.handle.base

    @property
    def adapter(self) -> Adapter:
        return self.handle.adapter


@dataclass
class BatchAttribution:
    """The result of :func:`attribute_batch` for one padded batch of B rows and T positions (tensors on the
    model's device)."""

    scores: torch.Tensor  # [B, K, layers, T] float32, padding positions included
    logits: torch.Tensor | None  # [B, C] float32: the model's prediction (None: not asked for)
    columns: torch.Tensor  # [B, K] the explained columns
    pooled: torch.Tensor  # [B] the pooled position of each row
    diagnostics: dict[str, torch.Tensor]  # per-row [B, K] values the method reports
    run: Pass  # the forward pass the scores read (located only, for methods that run their own)


_PLAIN = "the plain call"  # (a key_of key starts with a tuple: never this)


def prepare(model, tokenizer, method: str = "normxlogit", target=None, layer=None, *, foil=None,
            embedding: str = "layer", pair: bool = False, **options) -> Plan:
    """Check and resolve :func:`explain`'s arguments (same meaning; ``pair``: text pairs will be given) into a
    :class:`Plan` for :func:`attribute_batch`. What it resolves is kept for the next call with the same model,
    tokenizer and arguments, while the model's config and module tree stay as they were
    (:mod:`normx.explanations.kept_plans`)."""
    chosen = get_method(method)
    handle = model_handle(model)
    base, adapter = handle.base, handle.adapter
    tokens = adapter.kind.vocabulary and (target is not None or foil is not None)  # resolved from the vocabulary
    plain = target is None and layer is None and foil is None and not options and type(pair) is bool
    key = None if tokens else (_PLAIN, embedding, pair) if plain and type(embedding) is str else key_of(
        target, layer, foil, embedding, pair, options)  # (the plain call's key without reading each argument)
    resolved = kept_plan(base, tokenizer, key and (chosen.name, id(chosen), *key),  # (the value holds chosen)
                         lambda: _resolve(handle, tokenizer, chosen, target, layer, foil, embedding, pair, options))
    mask_token_id = tokenizer.mask_token_id if adapter.kind is HeadKind.MASKED_LM else None  # (read where used)
    columns = None if resolved.target_columns is None else list(resolved.target_columns)  # (a caller's own copies)
    return Plan(handle, chosen, dict(resolved.options), resolved.labels, columns, resolved.foil_column,
                list(resolved.layers), embedding, mask_token_id, resolved.reads, resolved.num_layers, resolved.reading,
                resolved.pad_token_id, resolved.max_positions)


@dataclass(frozen=True)
class _Resolved:
    """What :func:`prepare` resolves of its arguments against the model's config and module tree (kept: it holds no
    model)."""

    method: Method
    options: dict
    labels: LabelSpace
    target_columns: list[int] | None
    foil_column: int | None
    layers: list[int]
    reads: tuple[int, ...]
    num_layers: int
    reading: str
    pad_token_id: int | None
    max_positions: int | None


def _resolve(handle: ModelHandle, tokenizer, chosen: Method, target, layer, foil, embedding: str, pair: bool,
             options: dict) -> _Resolved:
    options = chosen.resolve_options(options)
    if embedding not in EMBEDDINGS:
        raise InvalidInputError(f"embedding={embedding!r} is not allowed; use one of {EMBEDDINGS}")
    base, adapter = handle.base, handle.adapter
    if pair and (adapter.kind is not HeadKind.SEQUENCE_CLASSIFICATION
                 or getattr(base.config, "normx_inputs", "pair") == "single"):
        raise PairNotSupportedError(
            f"text_pair was given, but {type(base).__name__} takes single texts; drop the pair or use a "
            "sentence-pair model (NLI, STS-B)"
        )
    if not pair and getattr(base.config, "normx_inputs", None) == "pair":
        raise PairRequiredError(
            "this model was trained on sentence pairs (its config says normx_inputs='pair'): give the second "
            "text of each pair with text_pair= (CLI: --pair); one text alone gets a meaningless prediction")
    labels = LabelSpace(adapter.kind, base.config, tokenizer)
    target_columns = labels.resolve_many(target, "target")
    foil_column = None if foil is None else labels.resolve(foil, "foil")
    num_layers = adapter.num_layers(base)
    if chosen.layered:
        layers = parse_layers(layer, num_layers, chosen.default_layer)
    elif layer is not None:
        raise InvalidInputError(f"method {chosen.name!r} attributes to the input embeddings and has no per-layer "
                                f"scores; leave layer unset (got layer={layer!r})")
    else:
        layers = [0]
    return _Resolved(chosen, options, labels, target_columns, foil_column, layers,
                     tuple(chosen.capture(layers, num_layers, options)), num_layers,
                     chosen.reading_for(options, regression=labels.regression, foil=foil is not None),
                     getattr(base.config, "pad_token_id", None), handle.max_positions)


def attribute_batch(plan: Plan, inputs: dict[str, torch.Tensor], columns: torch.Tensor | None = None,
                    prediction: bool = True, full: bool = False) -> BatchAttribution:
    """One batch of :func:`explain` without the tokenising and the result objects: ``inputs`` as
    :func:`normx.core.batch.collate` makes them (``input_ids``, ``attention_mask``, the tokenizer's extra inputs,
    decoders' ``position_ids``), on the model's device; ``columns`` [B, K]: each row's own target columns (by
    default the plan's, or the prediction); ``prediction=False`` with ``columns`` given: the head is not run at the
    pooled position (``logits`` and ``ctx.logits`` are None), for the per-position methods, which never read it;
    ``full``: every row fills the batch (no padding: the attention mask is all ones; :attr:`Pass.full`).
    Runs in eval mode, holding the model shared (:func:`normx.core.concurrency.using`): safe to call from several
    threads on one model. A method that never differentiates runs in inference mode (``Method.grad_mode``), so its
    tensors are inference tensors (read them, or ``.clone()`` one to change it in place or to differentiate
    through it)."""
    ids = inputs["input_ids"]
    given = columns

    def select(logits: torch.Tensor) -> torch.Tensor:
        return plan.labels.target_columns(logits, plan.target_columns) if given is None else given

    foil = None if plan.foil_column is None else torch.full(ids.shape[:1], plan.foil_column, device=ids.device)
    with plan.handle.using(), plan.method.grad_mode():
        run = Pass(plan.base, plan.adapter, inputs, plan.layers, plan.embedding, mask_token_id=plan.mask_token_id,
                   reads=plan.reads, num_layers=plan.num_layers, full=full)
        if plan.method.predicts:  # its own forward pass makes the prediction (ctx.predict)
            ctx = Context(run.locate(), plan.labels, None, foil, options=plan.options, select=select)
            scores = plan.method.compute(ctx).float()
            if ctx.logits is None:
                raise RuntimeError(f"method {plan.method.name!r} has predicts=True but never called ctx.predict()")
            logits, columns = ctx.logits, ctx.columns
        else:
            run.run()
            skip = given is not None and not prediction
            logits = None if skip else run.pooled_logits(every=plan.method.reads_head).float()
            columns = select(logits)
            ctx = Context(run, plan.labels, columns, foil, options=plan.options, logits=logits)
            scores = plan.method.compute(ctx).float()
    return BatchAttribution(scores, logits, columns, run.pooled, ctx.diagnostics, run)


def parse_layers(layer, num_layers: int, default: str) -> list[int]:
    """A layer spec -> sorted list of layer indices in 0..num_layers."""
    if layer is None:
        return [num_layers if default == "last" else 0]
    if isinstance(layer, str):
        if layer == "all":
            return list(range(num_layers + 1))
        if layer.strip().lstrip("-").isdigit():
            layer = int(layer)
        else:
            raise LayerOutOfRangeError(f"layer={layer!r} is not allowed; use an integer in 0..{num_layers}, "
                                       "a list of them, 'all' or None")
    values = list(layer) if isinstance(layer, (list, tuple, range)) else [layer]
    if not values:
        raise LayerOutOfRangeError("layer is an empty list; give at least one layer index")
    out = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise LayerOutOfRangeError(f"layer {value!r} is not an integer; layers are 0..{num_layers}")
        if not -(num_layers + 1) <= value <= num_layers:
            raise LayerOutOfRangeError(
                f"layer {value} is out of range: this model has {num_layers} layers, so layers are 0 (embedding "
                f"output) ..{num_layers} (last block), or -1..-{num_layers + 1} counting from the end"
            )
        out.append(int(value) % (num_layers + 1))
    return sorted(set(out))


def model_settings(handle: ModelHandle, param=None) -> dict:
    """What a result records of the model: its class, whether PEFT wraps it, its dtype and device (of ``param``, its
    first parameter, where the caller has read it)."""
    base = handle.base
    param = first_parameter(base) if param is None else param
    return {"model_class": handle.name, "peft": base is not handle.model,
            "dtype": None if param is None else _name_of(param.dtype),
            "device": None if param is None else _name_of(param.device)}


_NAMES: dict = {}  # a dtype's or device's name, as results record it: made once each


def _name_of(value) -> str:
    name = _NAMES.get(value)
    if name is None:
        name = _NAMES[value] = str(value).replace("torch.", "")  # (a dict write is atomic: two threads, one name)
    return name


def _explanation(item: Encoded, scores: np.ndarray, columns: list[int], predicted: tuple[str | float, dict],
                 plan: Plan, settings: dict, pooled: int, diagnostics: dict) -> Explanation:
    labels = plan.labels
    prediction, probabilities = predicted
    return Explanation(
        text=item.text, text_pair=item.text_pair, tokens=item.tokens, offsets=item.offsets, segments=item.segments,
        special=item.special, scores=scores, labels=[labels.name(c) for c in columns], layers=list(plan.layers),
        prediction=prediction, probabilities=probabilities, method=plan.method.name, settings=settings,
        warnings=list(item.warnings), diagnostics=diagnostics, kind=plan.adapter.kind.value,
        regression=labels.regression, family=plan.adapter.family, pooled=pooled,
    )
