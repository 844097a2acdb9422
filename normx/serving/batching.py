"""Dynamic batching of one-pass requests: what a model server does to keep latency low under a crowd.

Requests for the head-on-top methods (``Method.per_position``: one forward pass each) that arrive within
``window_ms`` of each other for the same model, tokenizer, method and settings are explained together: bucketed by
length under a budget of padded tokens, one :func:`normx.explain` call (one padded forward pass) per bucket, each
request getting its own :class:`~normx.explanations.result.Explanation` (what it would get alone, up to float
rounding in the padded batch).

One scheduler thread per :class:`Batcher`, started on first use; nothing else runs in it, with ``threads`` torch
threads of its own. A batch runs like any other normx call on the model (its lock held shared): it never waits for
the expensive work of the server's other lane (:class:`normx.serving.lanes.WorkGate`), which gives it the CPU by
running at a lower OS priority, except for one eager-attention pass, the only work that holds a model exclusively.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

from normx.core.inputs import positive_int, token_budget_batches
from normx.errors import InvalidInputError, NormxError
from normx.explanations.explain import explain
from normx.explanations.result import Explanation


@dataclass
class _Request:
    key: tuple
    model: object
    tokenizer: object
    text: str
    pair: str | None
    tokens: int
    kwargs: dict
    future: Future = field(default_factory=Future)


class Batcher:
    """Collects one-pass requests for ``window_ms`` after the first arrives (at most ``max_batch``) and explains
    them in padded batches of at most ``max_tokens`` tokens (see the module docstring)."""

    def __init__(self, window_ms: float = 10.0, max_batch: int = 32, max_tokens: int = 4096,
                 threads: int | None = None):
        if not window_ms >= 0:
            raise InvalidInputError(f"window_ms must be >= 0, got {window_ms!r}")
        positive_int(max_batch, "max_batch")
        positive_int(max_tokens, "max_tokens")
        positive_int(threads, "threads", none=True)
        self.threads = threads  # torch intra-op threads of the scheduler thread (None: the process's setting)
        self.window = window_ms / 1000
        self.max_batch, self.max_tokens = max_batch, max_tokens
        self._queue: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()
        self.batches: deque[int] = deque(maxlen=1000)  # the sizes of the last batches run (for tests and logs)

    def explain(self, model, tokenizer, text: str, *, text_pair: str | None = None, tokens: int,
                **kwargs) -> Explanation:
        """``normx.explain(model, tokenizer, text, text_pair=text_pair, **kwargs)``, batched with the requests
        that arrive with it; ``tokens``: the text's token count (special tokens included)."""
        key = (id(model), id(tokenizer), text_pair is not None, repr(sorted(kwargs.items())))
        request = _Request(key, model, tokenizer, text, text_pair, tokens, kwargs)
        self._ensure_started()
        self._queue.put(request)
        return request.future.result()

    def _ensure_started(self) -> None:
        with self._start:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="normx-batcher", daemon=True)
                self._thread.start()

    def _serve(self) -> None:
        if self.threads is not None:
            import torch

            torch.set_num_threads(self.threads)  # this thread's own setting (an OpenMP per-thread value)
        while True:
            pending = [self._queue.get()]
            deadline = time.monotonic() + self.window
            while len(pending) < self.max_batch:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    pending.append(self._queue.get(timeout=left))
                except queue.Empty:
                    break
            groups: dict[tuple, list[_Request]] = {}
            for request in pending:
                groups.setdefault(request.key, []).append(request)
            for group in groups.values():
                for bucket in token_budget_batches([r.tokens for r in group], self.max_tokens):
                    self._run([group[i] for i in bucket])

    def _run(self, requests: list[_Request]) -> None:
        first = requests[0]
        self.batches.append(len(requests))
        try:
            results = explain(first.model, first.tokenizer, [r.text for r in requests],
                              text_pair=None if first.pair is None else [r.pair for r in requests],
                              batch_size=len(requests), **first.kwargs)
        except BaseException as exc:  # the waiting request threads get it
            if len(requests) > 1 and isinstance(exc, NormxError):
                for request in requests:  # one bad request must not fail the others: each alone
                    self._run([request])
                return
            for request in requests:
                request.future.set_exception(exc)
            return
        for request, result in zip(requests, results):
            request.future.set_result(result)
