"""Each step's time, split where the rank enters its first collective.

In a synchronous job every rank leaves a collective together, so the total step time is
the same on all of them and says nothing about which one is slow. What differs is when a
rank *arrives*: the slow rank's compute (step start to its first collective) is long, and
its peers' communication is long because they wait for it there. So the timer keeps the
two apart: compute up to the first `communicating` mark, communication from there to the
end of the step. A step without a mark is all compute.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpuguard.clock import SYSTEM_CLOCK


@dataclass(frozen=True)
class WindowRecord:
    """What one rank measured over a window of steps: the record ranks exchange."""

    rank: int
    first_step: int
    last_step: int
    steps: int  # how many steps were timed in the window (0: none, medians are 0)
    compute_s: float  # median compute seconds per step
    comm_s: float  # median communication seconds per step

    def to_wire(self) -> list[float | int]:
        return [self.rank, self.first_step, self.last_step, self.steps, self.compute_s, self.comm_s]

    @classmethod
    def from_wire(cls, data: list[float | int]) -> WindowRecord:
        rank, first, last, steps, compute, comm = data
        return cls(int(rank), int(first), int(last), int(steps), float(compute), float(comm))


class StepTimer:
    """``begin(step)``, optionally ``communicating()``, then ``end()``; `take_window`
    returns the window's medians and starts the next one."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._step: int | None = None
        self._started = 0.0
        self._comm_from: float | None = None
        self._compute: list[float] = []
        self._comm: list[float] = []
        self._first_step: int | None = None

    def begin(self, step: int) -> None:
        self._step = step
        if self._first_step is None:
            self._first_step = step
        self._comm_from = None
        self._started = SYSTEM_CLOCK.monotonic()

    def communicating(self) -> None:
        """The rank enters a collective; only the first call of a step counts."""
        if self._comm_from is None and self._step is not None:
            self._comm_from = SYSTEM_CLOCK.monotonic()

    def end(self) -> int | None:
        """Close the step begun last; its number, or None when none was begun."""
        now = SYSTEM_CLOCK.monotonic()
        step, self._step = self._step, None
        if step is None:
            return None
        split = now if self._comm_from is None else self._comm_from
        self._compute.append(split - self._started)
        self._comm.append(now - split)
        return step

    def take_window(self, last_step: int) -> WindowRecord:
        first = last_step if self._first_step is None else self._first_step
        record = WindowRecord(
            rank=self.rank,
            first_step=first,
            last_step=last_step,
            steps=len(self._compute),
            compute_s=statistics.median(self._compute) if self._compute else 0.0,
            comm_s=statistics.median(self._comm) if self._comm else 0.0,
        )
        self._compute, self._comm, self._first_step = [], [], None
        return record
