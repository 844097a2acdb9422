"""One model, many callers: what normx does to a shared model is scoped to the call that does it.

A model is shared by threads (a web demo, a server, a notebook with a thread pool). Three things normx does could
be seen by other callers, and each is handled at the level where it happens:

- **Forward hooks** (:mod:`normx.core.hooks`) act only for the thread that registered them: another thread's forward
  pass through the same module runs them as no-ops. Captures of different threads never mix.
- **Model-wide switches**: eval mode for a model left in training mode, and eager attention for the passes that
  read attention probabilities (DecompX, GlobEnc, ALTI). Every stretch of normx work on a model holds the model's
  :class:`ModelLock` *shared* (:func:`using`); a switch is made only while holding it *exclusively* (no other
  normx work on that model runs meanwhile), and restored before it is released. The exclusive part is one forward
  pass for eager attention, so cheap calls wait at most that long.
- **Tokenizers**: a fast tokenizer's truncation / padding settings are state of the shared Rust object that each
  call sets; :func:`tokenizer_lock` serialises normx's tokenizer calls on one tokenizer (they take microseconds).

``requires_grad`` is never changed: gradient methods differentiate with ``torch.autograd.grad`` with respect to
their input embeddings only, which leaves the parameters' ``.grad`` untouched.

Code outside normx that changes the model (training it in another thread, switching its attention
implementation) is not covered: no lock can see it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from operator import attrgetter, itemgetter

from normx._torch import nn
from normx.models import unwrap_model
from normx.models.structure import module_dicts, submodules

_SHARED, _EXCLUSIVE = "shared", "exclusive"
_FREE = (None, 0)
_TRAINING = attrgetter("training")
_TRAINING_FLAG = itemgetter("training")


class ModelLock:
    """A readers-writer lock that prefers writers and is reentrant per thread.

    ``shared()`` may be held by many threads at once; ``exclusive()`` by one thread, with no shared holder. A
    thread may nest ``shared`` and ``exclusive`` in any order: inside ``exclusive`` everything passes through; an
    ``exclusive`` inside ``shared`` gives the thread's shared hold up while it waits and runs, and takes it back
    after (the caller is between two forward passes then, so nothing it computed depends on the gap). Writers are
    preferred: once one waits, new shared holders wait behind it, so a writer waits at most for the stretches of
    work already running.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()  # held directly (a Condition's own enter and exit are Python calls)
        self._cond = threading.Condition(self._mutex)
        self._readers = 0
        self._writer: int | None = None
        self._writers_waiting = 0
        self._local = threading.local()

    # this thread's hold: (mode or None, depth), one attribute of the thread-local (read on every call)
    def _hold(self) -> tuple[str | None, int]:
        return getattr(self._local, "hold", _FREE)

    def _set(self, mode: str | None, depth: int) -> None:
        self._local.hold = (mode, depth)

    def _acquire_shared(self) -> None:
        with self._mutex:
            while self._writer is not None or self._writers_waiting:
                self._cond.wait()
            self._readers += 1

    def _release_shared(self) -> None:
        with self._mutex:
            self._readers -= 1
            if not self._readers and self._writers_waiting:  # (a reader waits only for writers: none to wake)
                self._cond.notify_all()

    def _acquire_exclusive(self) -> None:
        with self._mutex:
            self._writers_waiting += 1
            try:
                while self._writer is not None or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = threading.get_ident()

    def _release_exclusive(self) -> None:
        with self._mutex:
            self._writer = None
            self._cond.notify_all()

    @contextmanager
    def _nested(self, mode: str, depth: int) -> Iterator[None]:
        """A hold inside a hold this thread already has: only the depth changes."""
        self._set(mode, depth + 1)
        try:
            yield
        finally:
            self._set(mode, depth)

    def shared(self) -> _SharedHold:
        """A context manager holding the lock shared (only the depth changes inside a hold this thread has)."""
        return _SharedHold(self)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        mode, depth = self._hold()
        if mode == _EXCLUSIVE:
            with self._nested(mode, depth):
                yield
            return
        if mode == _SHARED:  # give the shared hold up while exclusive, take it back after
            self._release_shared()
        self._acquire_exclusive()
        self._set(_EXCLUSIVE, 1)
        try:
            yield
        finally:
            self._release_exclusive()
            if mode == _SHARED:
                self._acquire_shared()
            self._set(mode, depth)

    def pause(self) -> None:
        """Between two forward passes of a long stretch of shared work: if a writer waits, let it run first
        (the shared hold is given up and taken back). Does nothing for an exclusive hold or when no writer waits."""
        if self._hold()[0] != _SHARED or not self._writers_waiting:
            return
        self._release_shared()
        self._acquire_shared()

    @property
    def held_by_this_thread(self) -> str | None:
        """``"shared"``, ``"exclusive"`` or ``None``."""
        return self._hold()[0]


class _SharedHold:
    """:meth:`ModelLock.shared` (a class, not a generator: it is entered on every batch of every call)."""

    __slots__ = ("_lock", "_was")

    def __init__(self, lock: ModelLock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        lock = self._lock
        self._was = mode, depth = getattr(lock._local, "hold", _FREE)
        if mode is not None:  # nested: already shared or exclusive
            lock._local.hold = (mode, depth + 1)
            return
        lock._acquire_shared()
        lock._local.hold = (_SHARED, 1)

    def __exit__(self, *exc) -> None:
        lock = self._lock
        if self._was[0] is not None:
            lock._local.hold = self._was
            return
        lock._local.hold = _FREE
        lock._release_shared()


_MODEL_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TOKENIZER_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_GUARD = threading.Lock()


def _lock_of(table: weakref.WeakKeyDictionary, obj, make):
    """``table[obj]``, made with ``make()`` the first time (for as long as ``obj`` lives)."""
    lock = table.get(obj)  # (a dict read is atomic: the guard only for making one)
    if lock is not None:
        return lock
    with _GUARD:
        lock = table.get(obj)
        if lock is None:
            lock = table[obj] = make()
        return lock


def model_lock(model: nn.Module, unwrapped: bool = False) -> ModelLock:
    """The :class:`ModelLock` of ``model`` (the same for a PEFT wrapper and the model inside it, whose modules are
    the shared ones; ``unwrapped``: ``model`` is the model inside already)."""
    return _lock_of(_MODEL_LOCKS, model if unwrapped else unwrap_model(model), ModelLock)


def pause(model: nn.Module) -> None:
    """Call between two forward passes of long work on ``model`` (:meth:`ModelLock.pause`), so that a call waiting to
    hold the model exclusively (one eager-attention pass) does not wait for the whole of this one."""
    model_lock(model).pause()


def _training_modules(model: nn.Module) -> list[nn.Module]:
    """Every module of ``model`` in training mode, read on each call (a user may switch any module between two calls)
    from the model's modules as :func:`normx.models.structure.submodules` keeps them (walking the tree on every call
    costs more than a small model's forward pass on a short text)."""
    return [module for module in (model, *submodules(model)) if module.training]


def _any_training(model: nn.Module) -> bool:
    """Whether any module of ``model`` is in training mode (:func:`_training_modules`, read in C from the modules'
    instance dicts: once per call; through the attribute where a module keeps its flag elsewhere)."""
    try:
        return model.training or any(map(_TRAINING_FLAG, module_dicts(model)))
    except KeyError:
        return model.training or any(map(_TRAINING, submodules(model)))


def using(model: nn.Module, lock: ModelLock | None = None) -> _Using:
    """A stretch of normx work on ``model`` (one batch: its forward passes and head calls) in eval mode.

    Holds the model's lock (``lock``, already looked up by the caller's :class:`~normx.core.handle.ModelHandle`, or
    :func:`model_lock`) shared. A model left in training mode (dropout on) is switched to eval mode for the
    stretch while the lock is held exclusively, and its training flags are restored before the lock is released:
    other normx calls on it wait meanwhile, and never see it half switched.
    """
    return _Using(model, model_lock(model) if lock is None else lock)


class _Using:
    """:func:`using` (a class, not a generator: it is entered on every batch of every call)."""

    __slots__ = ("_held", "_lock", "_model")

    def __init__(self, model: nn.Module, lock: ModelLock) -> None:
        self._model, self._lock = model, lock

    def __enter__(self) -> None:
        lock, model = self._lock, self._model
        held = lock.shared()
        held.__enter__()  # the flags are read under the lock: nobody is switching them meanwhile
        try:
            plain = held._was[0] == _EXCLUSIVE or not _any_training(model)
        except BaseException:
            held.__exit__(None, None, None)
            raise
        if plain:  # (inside an exclusive hold the caller already switched what it needs)
            self._held = held
            return
        held.__exit__(None, None, None)
        switched = ExitStack()  # a model in training mode
        try:
            switched.enter_context(lock.exclusive())
            switched.enter_context(_eval_mode(model))
        except BaseException:
            switched.close()
            raise
        self._held = switched

    def __exit__(self, kind, value, trace) -> bool:
        held, self._held = self._held, None
        return bool(held.__exit__(kind, value, trace))


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Every training module in eval mode for the body, switched back after (call holding the lock exclusively)."""
    training = _training_modules(model)
    for module in training:
        module.training = False
    try:
        yield
    finally:
        for module in training:
            module.training = True


@contextmanager
def _eager(model: nn.Module) -> Iterator[None]:
    """Eager attention in every config of ``model`` for the body, each restored after (hold the lock exclusively)."""
    configs = {id(m.config): m.config for m in model.modules()
               if hasattr(getattr(m, "config", None), "_attn_implementation_internal")}
    saved = {key: config._attn_implementation_internal for key, config in configs.items()}
    try:
        for config in configs.values():
            config._attn_implementation_internal = "eager"
        yield
    finally:
        for key, config in configs.items():
            config._attn_implementation_internal = saved[key]


@contextmanager
def attention_weights(model: nn.Module) -> Iterator[None]:
    """One forward pass of ``model`` with eager attention (which returns the attention probabilities), in eval
    mode, holding the model's lock exclusively; both settings are restored before the lock is released."""
    base = unwrap_model(model)
    with model_lock(base).exclusive(), _eager(base), _eval_mode(base):
        yield


@contextmanager
def frozen_parameters(model: nn.Module) -> Iterator[None]:
    """One forward pass of ``model`` whose parameters do not require gradients (so that its graph keeps no layer's
    input for a weight gradient: what an input-gradient method needs only), in eval mode, holding the model's lock
    exclusively; both settings are restored before the lock is released. Another thread's plain pass meanwhile gets
    the same values and input gradients, and no parameter gradients."""
    base = unwrap_model(model)
    with model_lock(base).exclusive(), _eval_mode(base):
        live = [p for p in base.parameters() if p.requires_grad]
        try:
            for parameter in live:
                parameter.requires_grad_(False)
            yield
        finally:
            for parameter in live:
                parameter.requires_grad_(True)


def tokenizer_lock(tokenizer) -> threading.RLock:
    """The lock normx holds around each call of ``tokenizer`` (fast tokenizers keep truncation settings as state)."""
    return _lock_of(_TOKENIZER_LOCKS, tokenizer, threading.RLock)
