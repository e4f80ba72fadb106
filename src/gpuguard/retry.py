"""Retrying: a backoff whose waits end at once when the component is told to stop, and a
bounded retry of one call.

A loop that sleeps with ``time.sleep`` cannot be stopped until the sleep ends; every wait
here is ``stop.wait``, so shutdown is never held up by a pause between tries.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Backoff:
    """Waits of ``first_s``, then each ``factor`` times the last, never above ``max_s``,
    until :meth:`reset` (after a success) starts again from ``first_s``."""

    def __init__(self, first_s: float, max_s: float, *, factor: float = 2.0) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self.factor = factor
        self.failures = 0  # waits handed out since the last reset: the streak so far

    def next(self) -> float:
        """The wait after one more failure."""
        wait = min(self.max_s, self.first_s * self.factor**self.failures)
        self.failures += 1
        return wait

    def reset(self) -> None:
        self.failures = 0

    def wait(self, stop: threading.Event) -> bool:
        """Wait out :meth:`next` unless ``stop`` is set first; True when stopped."""
        return stop.wait(self.next())


def retry(
    attempt: Callable[[], T],
    *,
    on: type[Exception] | tuple[type[Exception], ...],
    attempts: int,
    before_retry: Callable[[Exception], None] | None = None,
) -> T:
    """``attempt()``, tried again (up to ``attempts`` tries in all) while it raises ``on``;
    the last failure propagates. ``before_retry`` runs between tries with the failure
    (to read what changed, say)."""
    for left in range(attempts - 1, -1, -1):
        try:
            return attempt()
        except on as exc:
            if not left:
                raise
            if before_retry is not None:
                before_retry(exc)
    raise ValueError("retry needs at least one attempt")
