"""Stopping a training job cleanly when it is asked to: finish the step, save, exit 75.

Kubernetes ends a pod by sending SIGTERM (an eviction by a drain, a preemption, a node
shutdown) and SIGKILL after ``terminationGracePeriodSeconds``. Saving from inside the
signal handler would write a state half-way through a step, so the handler only takes
note; the training loop asks `Preemption.should_stop` after each step and, when it says
yes, saves and calls `Preemption.exit`::

    with Preemption() as preemption:
        for step in range(start, total):
            train_one_step()
            if preemption.should_stop():
                checkpointer.save(step, state, blocking=True)
                preemption.exit()        # exit status 75: preempted, resume me

Signal handlers belong to the main thread: enter the context there.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType
from typing import NoReturn

from gpuguard.training.exits import exit_preempted

log = logging.getLogger("gpuguard.training")

_SignalHandler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None
"""What ``signal.signal`` returns: a function, SIG_DFL or SIG_IGN, or None (not set from
Python)."""


class Preemption:
    """Notes SIGTERM (and SIGINT, for a terminal) while active; restores the previous
    handlers on exit. A second signal changes nothing: the step still finishes."""

    def __init__(self, signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT)):
        self.signals = tuple(signals)
        self.received: signal.Signals | None = None
        self._announced = False
        self._previous: dict[signal.Signals, _SignalHandler] = {}

    def __enter__(self) -> Preemption:
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._note)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def should_stop(self) -> bool:
        """True once a stop signal arrived: save a checkpoint now and call `exit`."""
        if self.received is not None and not self._announced:
            self._announced = True  # logged here, not in the handler: logging takes locks
            log.warning("%s received: saving a checkpoint, then exiting", self.received.name)
        return self.received is not None

    def exit(self) -> NoReturn:
        """Exit with status 75 (``EXIT_PREEMPTED``), telling the launcher to resume the job."""
        exit_preempted()

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)
