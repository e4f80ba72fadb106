"""Long-running parts, one shape for all: each part is a ``run(stop)`` on its own named
daemon thread until the process's one stop event is set, and the process watches them.
A part whose thread died stops the process: it would otherwise leave its last verdict
standing (a healthy one, say) or the fleet without a leader, so the process exits
non-zero and its supervisor (the kubelet) starts a fresh one."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

Run = Callable[[threading.Event], None]  # a part's loop: returns once ``stop`` is set


def start(name: str, run: Run, stop: threading.Event) -> threading.Thread:
    """``run(stop)`` on a daemon thread called ``name``, started."""
    thread = threading.Thread(target=run, args=(stop,), name=name, daemon=True)
    thread.start()
    return thread


def dead(threads: Iterable[threading.Thread]) -> str:
    """Why the process must stop ("thread a, b died"), or "" while every part runs."""
    names = [thread.name for thread in threads if not thread.is_alive()]
    return f"thread {', '.join(names)} died" if names else ""


def supervise(
    threads: Iterable[threading.Thread],
    stop: threading.Event,
    every_s: float,
    on_death: Callable[[str], None],
) -> None:
    """Until ``stop``: every ``every_s``, when a part's thread has died, ``on_death(why)``
    and set ``stop``."""
    watched = list(threads)
    while not stop.wait(every_s):
        why = dead(watched)
        if why:
            on_death(why)
            stop.set()
