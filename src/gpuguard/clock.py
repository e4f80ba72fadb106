"""The one clock: every component that measures or stamps time takes a :class:`Clock`.

Two readings, for two different questions. ``monotonic()`` measures how long something
took or is left to wait (it never jumps when NTP steps the machine's time); ``now()`` is
seconds since the epoch, for stamps other machines read (conditions, Events, Lease
records), formatted by :mod:`gpuguard.contract.times`. Tests pass a fake they step by hand
instead of sleeping.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that only moves forward; only differences mean anything."""
        ...

    def now(self) -> float:
        """Seconds since the epoch (UTC), as stamped on what others read."""
        ...


class SystemClock:
    """This machine's clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> float:
        return time.time()


SYSTEM_CLOCK: Clock = SystemClock()


class OffsetClock:
    """A clock whose wall time is set wrong by ``offset_s`` (a machine whose NTP failed);
    its monotonic time is the base clock's. The clock-skew tests start a controller on it."""

    def __init__(self, offset_s: float, base: Clock = SYSTEM_CLOCK) -> None:
        self.offset_s = offset_s
        self._base = base

    def monotonic(self) -> float:
        return self._base.monotonic()

    def now(self) -> float:
        return self._base.now() + self.offset_s
