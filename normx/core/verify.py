"""Every adapter — registered, built in or discovered — is checked against the model's own outputs before normx
explains with it: one probe per model, once, cached (thread-safe).

The reference is the model as its user runs it: its plain forward on one text's ids alone (``input_ids`` and an
all-ones ``attention_mask``, nothing else; ``output_hidden_states=True``). What is checked is normx's own forward as
:func:`normx.explain` runs it: a right-padded batch built by :func:`normx.core.batch.collate` (two rows of
different lengths, the second a prefix of the first), run through ``base_model`` with the adapter's keyword
arguments while its capture points are hooked. For each row, at its real positions, as a fraction of the
reference's largest magnitude (tolerance by dtype):

- **embeddings**: the captured x^0 with ``hidden_states[0]``;
- **blocks**: the adapter's stack has ``len(hidden_states) - 1`` blocks, and each block's output is
  ``hidden_states[l]`` (but the last one where a final norm follows it: decoders report it after the norm);
- **head** (with the **final norm** before it): the adapter's head on the last block's output, at the pooled position
  of a classifier or at every position of an LM head, with the model's logits. When it does not match, a second
  look tells the final norm from the head: the norm's output against the backbone's ``last_hidden_state``;
- **causality** (causal-LM adapters): the prefix row's logits equal the long row's at the same positions, which is
  what lets one pass over a prompt and its continuation hold every generation step.

Two verdicts are kept beside (in the model's kept tree, so a change to its modules drops them): the layers whose
hidden states the model's own forward, asked for them by index, returns as the very tensors the hooks capture
(a pass then asks for them instead of hooking), and whether its backbone gives exactly the same hidden states
without an all-ones attention mask as with it (a batch whose rows fill it then runs without one):
:class:`normx.core.forward.OwnForward`.

So anything normx's batching or forward adds that changes the model's computation (padding, a position numbering
of its own, a keyword argument) is a mismatch too. A mismatch is an :class:`~normx.errors.UnsupportedModelError`
naming the part and how far off it was — never a silent wrong attribution. Models whose forward reports no hidden
states are checked on the head alone.
"""

from __future__ import annotations

import threading
import weakref

from normx._torch import torch
from normx.core.batch import Encoded, collate
from normx.core.concurrency import using
from normx.core.forward import OWN_FORWARD, OwnForward, capture_layers
from normx.errors import HookNotFiredError, UnsupportedModelError
from normx.models import Adapter, HeadKind, get_adapter, unwrap_model
from normx.models.structure import remember

# by the model's dtype (named, so that importing this module does not import torch)
TOLERANCE = {"float32": 1e-4, "float64": 1e-8, "bfloat16": 3e-2, "float16": 1e-2}
PROBE_LENGTH = 7
PREFIX_LENGTH = 4
_VERIFIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # base model -> the adapter it was checked with
_UNPADDED: weakref.WeakSet = weakref.WeakSet()  # base models whose padded batches differ from each text alone
_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_GUARD = threading.Lock()


def verified_adapter(model) -> Adapter:
    """The adapter of ``model`` (PEFT-wrapped or not), checked against the model's own outputs on first use
    (:func:`verify`); the check runs once per model and adapter, and concurrent first calls wait for one check."""
    base = unwrap_model(model)
    adapter = get_adapter(base)
    if _VERIFIED.get(base) is adapter:  # (a dict read is atomic: the guard only for a first use)
        return adapter
    with _GUARD:
        if _VERIFIED.get(base) is adapter:
            return adapter
        lock = _LOCKS.setdefault(base, threading.Lock())
    with lock:
        if _VERIFIED.get(base) is not adapter:
            pads = verify(model, adapter)
            with _GUARD:
                _VERIFIED[base] = adapter
                if pads:
                    _UNPADDED.discard(base)
                else:
                    _UNPADDED.add(base)
    return adapter


def takes_padding(model) -> bool:
    """Whether a right-padded batch of the (verified) model equals each of its texts run alone; where not (a model
    that ignores the attention mask: FNet's Fourier mixing, Nyströmformer's landmarks, ...), normx runs it one text
    per forward pass."""
    return unwrap_model(model) not in _UNPADDED


def probe_rows(model) -> list[list[int]]:
    """Two rows of ordinary token ids (no special token): one of ``PROBE_LENGTH`` ids and a shorter prefix of it."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    vocab = int(getattr(config, "vocab_size", None) or model.get_input_embeddings().num_embeddings)
    special = set()
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id", "mask_token_id"):
        value = getattr(config, name, None)
        special.update(value if isinstance(value, (list, tuple)) else [value])
    ids = [i for i in range(min(vocab, 1000) // 3, vocab) if i not in special][:PROBE_LENGTH]
    if len(ids) < PROBE_LENGTH:
        ids = [i for i in range(vocab) if i not in special][:PROBE_LENGTH]
    ids = ids[::-1]
    return [ids, ids[:PREFIX_LENGTH]]


def probe_inputs(model, rows: list[int] | None = None) -> dict[str, torch.Tensor]:
    """The probe rows (or those of ``rows``) as normx batches them (:func:`normx.core.batch.collate`: padded on
    the right), on the model's device."""
    base = unwrap_model(model)
    config = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
    pad = getattr(config, "pad_token_id", None)
    pad = pad if isinstance(pad, int) and not isinstance(pad, bool) and pad >= 0 else 0
    probe = probe_rows(base)
    items = [Encoded(text="", text_pair=None, ids=probe[r], tokens=[], offsets=[], segments=[], special=[])
             for r in (range(len(probe)) if rows is None else rows)]
    return collate(items, pad, next(base.parameters()).device)


def verify(model, adapter: Adapter) -> bool:
    """Check ``adapter`` against ``model``'s own outputs (see the module docstring); raises
    :class:`UnsupportedModelError` naming the part that does not match on a text alone. Returns whether a
    right-padded batch also matches each of its rows alone (:func:`takes_padding`)."""
    base = unwrap_model(model)
    name = type(base).__name__
    try:
        inputs = probe_inputs(base)
    except (AttributeError, NotImplementedError, TypeError, ValueError) as exc:
        raise _refuse(name, adapter, "embeddings", f"no probe input can be made for it ({exc})") from None
    try:
        blocks = adapter.block_modules(base)
        adapter.embedding_module(base, "layer")
    except (AttributeError, TypeError) as exc:
        raise _refuse(name, adapter, "blocks", f"its module paths do not resolve ({exc})") from None
    tolerance = TOLERANCE.get(str(next(base.parameters()).dtype).removeprefix("torch."), 1e-4)
    lengths = [len(row) for row in probe_rows(base)]
    alone = [probe_inputs(base, [r]) for r in range(len(lengths))]  # each text alone: nothing to pad
    with using(model), torch.no_grad():
        plain = [base(**{k: row[k] for k in ("input_ids", "attention_mask")}, output_hidden_states=True)
                 for row in alone]  # the user's call, text by text
        for r, (row, n) in enumerate(zip(alone, lengths)):  # normx's own forward on each text alone
            try:
                captured = _normx_forward(base, adapter, blocks, row)
            except HookNotFiredError as exc:
                raise _refuse(name, adapter, "blocks", f"normx's forward pass does not run them ({exc})") from None
            where = f" (probe row {r}, {n} tokens)"
            _check_hidden(name, adapter, captured, plain[r], 0, n, len(blocks), tolerance, where)
            _check_head(name, adapter, base, row, captured, plain[r], 0, n, len(blocks), tolerance, where)
        if adapter.kind is HeadKind.CAUSAL_LM:
            short, long = plain[1].logits[0], plain[0].logits[0, :lengths[1]]
            if _off(short, long) > tolerance:
                raise _refuse(name, adapter, "causality", "its logits at the first tokens change with the tokens "
                              f"after them (off by {_off(short, long):.3g} of their scale): it is not a left-to-right "
                              "causal LM (a model that can be both is one only with is_decoder=True / causal=True in "
                              "its config), so one pass cannot hold each generation step")
        unmasked = all(_unmasked(base, adapter, row, out) for row, out in zip(alone, plain))
        remember(base, OWN_FORWARD, OwnForward(_own_states(base, adapter, blocks, alone[0]), unmasked))
        captured = _normx_forward(base, adapter, blocks, inputs)  # and on the padded batch
        try:
            for r, n in enumerate(lengths):
                where = f" (probe row {r}, {n} tokens, in a right-padded batch)"
                _check_hidden(name, adapter, captured, plain[r], r, n, len(blocks), tolerance, where)
                _check_head(name, adapter, base, inputs, captured, plain[r], r, n, len(blocks), tolerance, where)
        except UnsupportedModelError:
            return False
    return True


def _normx_forward(base, adapter: Adapter, blocks: list, inputs: dict) -> dict:
    """x^0 and every block's output as normx's forward pass captures them (:class:`normx.core.forward.Pass`)."""
    with capture_layers(base, adapter, range(1, len(blocks) + 1)) as captured:
        base.base_model(**inputs, **adapter.forward_kwargs)
    return captured


def _own_states(base, adapter: Adapter, blocks: list, inputs: dict) -> frozenset[int]:
    """The layers (0 = x^0) whose hidden states the model's own forward, asked for them by index
    (``output_hidden_states=[...]``), returns as the very tensor objects normx's hooks capture; none where it takes no
    index or returns layers not asked for (keeping every layer would cost memory). Two passes, the even layers asked
    for and then the odd ones, so that each layer is seen both asked for and not."""
    every = range(len(blocks) + 1)
    found = set()
    for asked in (every[0::2], every[1::2]):
        try:
            with capture_layers(base, adapter, every[1:]) as captured:
                reported = base.base_model(**inputs, **adapter.forward_kwargs,
                                           output_hidden_states=list(asked)).hidden_states
        except (TypeError, ValueError, AttributeError, IndexError):
            return frozenset()
        if reported is None or len(reported) != len(every):
            return frozenset()
        for layer in every:
            if layer not in asked and reported[layer] is not None:
                return frozenset()
            if layer in asked and reported[layer] is captured["x0" if layer == 0 else layer]:
                found.add(layer)
    return frozenset(found)


def _unmasked(base, adapter: Adapter, row: dict, plain) -> bool:
    """Whether the backbone gives exactly the same hidden states (every layer's, and its last) on ``row`` (one text
    alone: its attention mask all ones) without the attention mask as the model's plain call on it with the mask,
    ``plain``, reported them (none reported: not known, so False)."""
    reported = getattr(plain, "hidden_states", None)
    if not reported:
        return False
    try:
        out = base.base_model(**{name: value for name, value in row.items() if name != "attention_mask"},
                              **adapter.forward_kwargs, output_hidden_states=True)
    except (TypeError, ValueError, AttributeError, IndexError, RuntimeError):
        return False
    bare, masked = [out[0], *(getattr(out, "hidden_states", None) or ())], [reported[-1], *reported]
    return len(masked) == len(bare) and all(isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                                            and a.shape == b.shape and torch.equal(a, b) for a, b in zip(masked, bare))


def _check_hidden(name: str, adapter: Adapter, captured: dict, plain, r: int, n: int, num_blocks: int,
                  tolerance: float, where: str) -> None:
    """The captured x^0 and block outputs of row ``r`` (its ``n`` real positions) against the plain call's
    ``hidden_states``."""
    hidden = getattr(plain, "hidden_states", None)
    if hidden is None:
        return
    if len(hidden) != num_blocks + 1:
        raise _refuse(name, adapter, "blocks", f"the model reports {len(hidden) - 1} layers, the adapter has "
                                               f"{num_blocks} blocks")
    _check(name, adapter, "embeddings", captured["x0"][r:r + 1, :n], hidden[0], tolerance, where)
    for layer in range(1, num_blocks):
        _check(name, adapter, "blocks", captured[layer][r:r + 1, :n], hidden[layer], tolerance,
               f" (layer {layer}){where}")
    # the last block too where no final norm follows it (decoders report their last layer after the norm): a block
    # of another shape is a wrong block, the same shape with other values a final norm left out
    last, reported = captured[num_blocks][r:r + 1, :n], hidden[num_blocks]
    off = _off(last, reported)
    if adapter.final_norm is None and off > tolerance:
        if last.shape != reported.shape:
            _check(name, adapter, "blocks", last, reported, tolerance, f" (layer {num_blocks}){where}")
        raise _refuse(name, adapter, "final norm", "the model reports its last layer after a transformation the "
                      f"adapter does not apply (off by {off:.3g} of its scale){where}")


def _check_head(name: str, adapter: Adapter, base, inputs: dict, captured: dict, plain, r: int, n: int,
                num_blocks: int, tolerance: float, where: str) -> None:
    """The adapter's head (after its final norm) on row ``r``'s captured last layer against the plain call's
    logits: at every position of an LM head, at the pooled position of a classifier."""
    last = captured[num_blocks][r:r + 1, :n]
    norm = adapter.norm_module(base)
    normed = last if norm is None else norm(last)
    row = {key: value[r:r + 1, :n] for key, value in inputs.items()}
    positions = _positions(adapter, base, row)
    want = plain.logits  # [1, n, V] of an LM head; a classifier's [1, C], read at what it pools
    try:
        if positions is None:
            got = adapter.head(base, normed.reshape(-1, normed.shape[-1]), None).reshape(*normed.shape[:-1], -1)
        else:
            got = adapter.pooled_head(base, normed, positions, row["attention_mask"])
    except (RuntimeError, TypeError, AttributeError, IndexError) as exc:
        raise _refuse(name, adapter, "head", f"it fails on the last hidden state ({exc})") from None
    if _off(got, want) > tolerance:
        backbone = base.base_model(**row, **adapter.forward_kwargs)[0]
        if _off(normed, backbone) > tolerance:
            part, what = ("final norm", "the backbone's last hidden state is not the last block's output" +
                          ("" if norm is None else " after the adapter's final norm"))
            raise _refuse(name, adapter, part, f"{what} (off by {_off(normed, backbone):.3g} of its scale)")
        raise _refuse(name, adapter, "head", f"its head on the last hidden state gives other logits than the model "
                                             f"(off by {_off(got, want):.3g} of their scale){where}")


def _positions(adapter: Adapter, base, inputs) -> torch.Tensor | None:
    """The pooled positions of a classifier's probe rows; None for LM heads (compared at every position)."""
    if adapter.kind is not HeadKind.SEQUENCE_CLASSIFICATION:
        return None
    return adapter.pooled_positions(base.config, inputs)


def _off(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| as a fraction of max |want| (inf for a shape mismatch or non-finite values)."""
    if got.shape != want.shape:
        return float("inf")
    got, want = got.float(), want.float()
    scale = want.abs().max().clamp_min(1e-12)
    off = ((got - want).abs().max() / scale).item()
    return off if off == off else float("inf")


def _check(name: str, adapter: Adapter, part: str, got, want, tolerance: float, where: str = "") -> None:
    off = _off(got, want)
    if off > tolerance:
        raise _refuse(name, adapter, part, f"the captured representation is not the model's hidden_states{where} "
                                           f"(off by {off:.3g} of its scale)")


def _refuse(name: str, adapter: Adapter, part: str, detail: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"normx checked its reading of {name} (the {adapter.family} {adapter.kind} adapter) against the model's own "
        f"outputs, and it does not match at the {part}: {detail}. normx will not explain it with wrong attributions; "
        f"register a corrected adapter with normx.register_adapter({name!r}, normx.Adapter(...))")
