"""Running one piece of work in several threads at once (a model shared by threads)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def in_threads(work: Callable[[int], Any], count: int = 4) -> dict[int, Any]:
    """``{i: work(i)}`` for i in 0..count-1, each call in its own thread, all started before any is joined; the
    first error any of them raised is raised here."""
    results: dict[int, Any] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = work(i)
        except BaseException as exc:  # handed back to the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
