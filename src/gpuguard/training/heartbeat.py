"""The job's progress, as the launcher's watchdog sees it.

A hung NCCL collective leaves a process alive, holding its GPUs, doing nothing; only the
job knows it stopped making progress. So the job reports its step and the launcher ends a
job whose step has not moved for ``--progress-timeout`` seconds. The channel is a small
file named by ``$GPUGUARD_HEARTBEAT_FILE``, overwritten in place with a fixed-width step
(one ``pwrite``: cheap enough to call every step, and a reader never sees half a number).
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuguard.clock import SYSTEM_CLOCK
from gpuguard.training.contract import HEARTBEAT_FILE_ENV

_WIDTH = 20


class Heartbeat:
    """``beat(step)`` after each step. Without a heartbeat file (not under ``gpuguard
    run``), it does nothing. Writes at most every ``min_interval_s`` seconds; every rank
    of a job may beat into the same file."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *, min_interval_s: float = 0.1):
        target = path if path is not None else os.environ.get(HEARTBEAT_FILE_ENV) or None
        self._fd = None if target is None else os.open(target, os.O_WRONLY | os.O_CREAT, 0o644)
        self._min_interval_s = min_interval_s
        self._last_write = -float("inf")

    def beat(self, step: int) -> None:
        if self._fd is None:
            return
        now = SYSTEM_CLOCK.monotonic()
        if now - self._last_write < self._min_interval_s:
            return
        self._last_write = now
        os.pwrite(self._fd, f"{step:>{_WIDTH}}\n".encode(), 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_heartbeat(path: Path) -> int | None:
    """The step last reported in ``path``; None before the first beat."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return int(text)
    except ValueError:
        return None
