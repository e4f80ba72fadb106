"""The simulated clock and its event queue.

Events run in time order; events due at the same time run in the order they were
scheduled. ``at`` returns the event, which ``cancel`` keeps from running: a timer that a
later change makes stale (a job's end once the job has been interrupted) is cancelled
where the change happens, instead of being checked for when it comes due.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import TypeAlias, TypeVar

# (time, order, action, args): a plain tuple, so that the heap compares entries without
# calling into Python code and schedules them without allocating anything else (the
# engine schedules hundreds of thousands). ``order`` breaks ties between events due at
# the same time: first scheduled, first run. The entry is also the handle to cancel by.
Event: TypeAlias = tuple[float, int, Callable[..., None], tuple[object, ...]]
T = TypeVar("T")


class EventQueue:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[Event] = []
        self._order = itertools.count()
        self._current = -1  # the order of the event running now
        self._cancelled: set[int] = set()  # orders of events still queued

    def at(self, t: float, action: Callable[..., None], *args: object) -> Event:
        """Run ``action(*args)`` at ``t`` (now, if ``t`` has passed)."""
        now = self.now
        event = (t if t > now else now, next(self._order), action, args)
        heapq.heappush(self._heap, event)
        return event

    def at_each(
        self, action: Callable[[T], None], items: Sequence[T], when: Callable[[T], float]
    ) -> None:
        """``at(when(item), action, item)`` for every item in turn, the same order among
        equal times, but each joins the heap only when the one before it (in time) runs:
        a run's whole failure stream and workload known up front (a million events for a
        large fleet) would otherwise sit in the heap, in memory and in every push and pop."""
        if not items:
            return
        first = next(self._order)
        self._order = itertools.count(first + len(items))  # their places, reserved
        now = self.now
        times = [max(when(item), now) for item in items]
        ranked = sorted(range(len(items)), key=times.__getitem__)  # stable: ties in order
        stream = ((times[i], first + i, action, (items[i],)) for i in ranked)
        self._next_from(stream)

    def _next_from(self, stream: Iterator[Event]) -> None:
        """Queue the stream's next event; when it runs, the one after it is queued first."""
        event = next(stream, None)
        if event is not None:
            t, order, action, args = event
            heapq.heappush(self._heap, (t, order, self._stream_step, (stream, action, args)))

    def _stream_step(
        self, stream: Iterator[Event], action: Callable[..., None], args: tuple[object, ...]
    ) -> None:
        self._next_from(stream)
        action(*args)

    def cancel(self, event: Event) -> None:
        """Keep a scheduled event from running; one that has run is left as it was."""
        t, order = event[0], event[1]
        # Events run in (time, order) sequence: the ones up to the current event have run.
        if t > self.now or (t == self.now and order > self._current):
            self._cancelled.add(order)

    def run(self, until: float, progress: Callable[[float], None] | None = None) -> None:
        """Run the events due up to ``until``, then stop the clock there. ``progress``
        hears the share of ``until`` reached, about every hundredth of it."""
        step = until / 100
        shown = 0.0
        heap = self._heap
        cancelled = self._cancelled
        # Not ``while heap``: Python 3.11 specialises the code of a function called once
        # only when a loop jumps back unconditionally, and this loop is the whole run.
        while True:
            if not heap:
                break
            t, order, action, args = heapq.heappop(heap)
            if t > until:
                break
            self.now = t
            self._current = order
            if order in cancelled:
                cancelled.remove(order)
            else:
                action(*args)
            if progress is not None and t - shown >= step:
                shown = t
                progress(t / until)
        self.now = until
