"""Every adapter — registered, built in or discovered — is checked against the model's own outputs before normx
explains with it: one probe forward pass per model, once, cached (thread-safe).

The probe runs the model's own forward on a small batch of token ids with ``output_hidden_states=True`` while the
adapter's capture points are hooked, and compares, as a fraction of the reference's largest magnitude (tolerance
by dtype):

- **embeddings**: the captured x^0 with ``hidden_states[0]``;
- **blocks**: the adapter's stack has ``len(hidden_states) - 1`` blocks, and each block's output is
  ``hidden_states[l]`` (but the last one where a final norm follows it: decoders report it after the norm);
- **head** (with the **final norm** before it): the adapter's head on the last block's output, at the pooled position
  of a classifier or at every position of an LM head, with the model's logits. When it does not match, a second
  look tells the final norm from the head: the norm's output against the backbone's ``last_hidden_state``.

A mismatch is an :class:`~normx.errors.UnsupportedModelError` naming the part and how far off it was — never a
silent wrong attribution. Models whose forward reports no hidden states are checked on the head alone.
"""

from __future__ import annotations

import threading
import weakref

from normx._torch import torch
from normx.core.concurrency import using
from normx.core.forward import capture_layers
from normx.errors import UnsupportedModelError
from normx.models import Adapter, HeadKind, get_adapter, unwrap_model

# by the model's dtype (named, so that importing this module does not import torch)
TOLERANCE = {"float32": 1e-4, "float64": 1e-8, "bfloat16": 3e-2, "float16": 1e-2}
PROBE_LENGTH = 7
_VERIFIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # base model -> the adapter it was checked with
_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_GUARD = threading.Lock()


def verified_adapter(model) -> Adapter:
    """The adapter of ``model`` (PEFT-wrapped or not), checked against the model's own outputs on first use
    (:func:`verify`); the check runs once per model and adapter, and concurrent first calls wait for one check."""
    base = unwrap_model(model)
    adapter = get_adapter(base)
    with _GUARD:
        if _VERIFIED.get(base) is adapter:
            return adapter
        lock = _LOCKS.setdefault(base, threading.Lock())
    with lock:
        if _VERIFIED.get(base) is not adapter:
            verify(model, adapter)
            with _GUARD:
                _VERIFIED[base] = adapter
    return adapter


def probe_inputs(model) -> dict[str, torch.Tensor]:
    """A batch of two short rows of ordinary token ids (no special token), on the model's device."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    vocab = int(getattr(config, "vocab_size", None) or model.get_input_embeddings().num_embeddings)
    special = set()
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id", "mask_token_id"):
        value = getattr(config, name, None)
        special.update(value if isinstance(value, (list, tuple)) else [value])
    ids = [i for i in range(min(vocab, 1000) // 3, vocab) if i not in special][:2 * PROBE_LENGTH]
    if len(ids) < 2 * PROBE_LENGTH:
        ids = [i for i in range(vocab) if i not in special][:2 * PROBE_LENGTH]
    device = next(model.parameters()).device
    ids = torch.tensor(ids, device=device).reshape(2, PROBE_LENGTH).flip(1)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def verify(model, adapter: Adapter) -> None:
    """Check ``adapter`` against ``model``'s own outputs (see the module docstring); raises
    :class:`UnsupportedModelError` naming the part that does not match."""
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
    with using(model), torch.no_grad():
        with capture_layers(base, adapter, range(1, len(blocks) + 1)) as captured:
            out = base(**inputs, **adapter.forward_kwargs, output_hidden_states=True)
        hidden = getattr(out, "hidden_states", None)
        tolerance = TOLERANCE.get(str(next(base.parameters()).dtype).removeprefix("torch."), 1e-4)
        if hidden is not None:
            if len(hidden) != len(blocks) + 1:
                raise _refuse(name, adapter, "blocks", f"the model reports {len(hidden) - 1} layers, the adapter "
                                                       f"has {len(blocks)} blocks")
            _check(name, adapter, "embeddings", captured["x0"], hidden[0], tolerance)
            for layer in range(1, len(blocks)):
                _check(name, adapter, "blocks", captured[layer], hidden[layer], tolerance, f" (layer {layer})")
            # the last block too where no final norm follows it (decoders report their last layer after the norm):
            # a block of another shape is a wrong block, the same shape with other values a final norm left out
            last, reported = captured[len(blocks)], hidden[len(blocks)]
            off = _off(last, reported)
            if adapter.final_norm is None and off > tolerance:
                if last.shape != reported.shape:
                    _check(name, adapter, "blocks", last, reported, tolerance, f" (layer {len(blocks)})")
                raise _refuse(name, adapter, "final norm", "the model reports its last layer after a transformation "
                              f"the adapter does not apply (off by {off:.3g} of its scale)")
        last = captured[len(blocks)]
        norm = adapter.norm_module(base)
        normed = last if norm is None else norm(last)
        positions = _positions(adapter, base, inputs)
        want = out.logits  # [B, T, V] of an LM head; a classifier's [B, C], read at what it pools
        try:
            if positions is None:
                got = adapter.head(base, normed.reshape(-1, normed.shape[-1]), None).reshape(*normed.shape[:-1], -1)
            else:
                got = adapter.pooled_head(base, normed, positions, inputs["attention_mask"])
        except (RuntimeError, TypeError, AttributeError, IndexError) as exc:
            raise _refuse(name, adapter, "head", f"it fails on the last hidden state ({exc})") from None
        if _off(got, want) > tolerance:
            backbone = base.base_model(**inputs, **adapter.forward_kwargs)[0]
            if _off(normed, backbone) > tolerance:
                part, what = ("final norm", "the backbone's last hidden state is not the last block's output" +
                              ("" if norm is None else " after the adapter's final norm"))
                raise _refuse(name, adapter, part, f"{what} (off by {_off(normed, backbone):.3g} of its scale)")
            raise _refuse(name, adapter, "head", f"its head on the last hidden state gives other logits than the "
                                                 f"model (off by {_off(got, want):.3g} of their scale)")


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
