"""Finding, ending and reaping every process a job started, wherever it went.

A job is more than the process the launcher started: DataLoader workers, and ``torchrun``'s
workers, which it starts in sessions of their own so that a signal to torchrun's process
group does not reach them. If torchrun dies, those workers would live on holding the GPUs.
So the launcher makes itself a *child subreaper* (Linux ``prctl``): orphans of the job are
re-parented to it instead of to init, stay in its process tree, and can be found through
``/proc``, ended and reaped. Inside a container the launcher is PID 1 and reaps anyway.
"""

from __future__ import annotations

import ctypes
import os
import signal
from contextlib import suppress

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Adopt the job's orphans; False where the kernel does not offer it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (children first), from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # it exited while we looked
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    frontier = [root]
    while frontier:
        below = [child for parent in frontier for child in children.get(parent, [])]
        found.extend(below)
        frontier = below
    return found


def signal_all(pids: list[int], signum: signal.Signals) -> None:
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signum)


def exited(pid: int) -> bool:
    """True once ``pid`` (our child) has exited; it stays a zombie, so its pid cannot be
    reused while we end what it left behind."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return info is not None and info.si_pid == pid


def reap(pid: int) -> int:
    """Collect an exited child; its return code as `subprocess` gives it (negative: signal)."""
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def reap_exited(pids: list[int]) -> None:
    """Collect those of ``pids`` that are our exited children, without blocking."""
    for pid in pids:
        with suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def reap_orphans(keep: int | None) -> None:
    """Collect exited children other than ``keep`` (adopted orphans), without blocking."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == 0 or info.si_pid == keep:
            return
        os.waitpid(info.si_pid, 0)
