"""A clock the test moves by hand, for code that takes a :class:`gpuguard.clock.Clock`."""

from __future__ import annotations


class FakeClock:
    """One reading serves both ``monotonic()`` and ``now()``: it moves only when the test
    calls :meth:`set` or :meth:`step`."""

    def __init__(self, start: float = 0.0) -> None:
        self._at = start

    def monotonic(self) -> float:
        return self._at

    def now(self) -> float:
        return self._at

    def set(self, seconds: float) -> None:
        self._at = seconds

    def step(self, seconds: float) -> None:
        self._at += seconds
