"""The one shape of a long-running part (threads.py): named daemon threads on one stop
event, and a process that stops when one of them dies."""

from __future__ import annotations

import threading

from gpuguard import threads
from tests.support.cluster import wait_for


def test_a_part_runs_on_its_named_daemon_thread_until_stop():
    seen: list[str] = []

    def part(stop: threading.Event) -> None:
        seen.append(threading.current_thread().name)
        stop.wait()

    stop = threading.Event()
    thread = threads.start("the-part", part, stop)
    wait_for(lambda: seen == ["the-part"])
    assert thread.daemon and thread.is_alive() and threads.dead([thread]) == ""
    stop.set()
    thread.join(5)
    assert not thread.is_alive()


def test_a_part_that_dies_stops_the_process_and_says_which():
    stop = threading.Event()
    alive = threads.start("alive", lambda stop: stop.wait(), stop)
    dying = threads.start("dying", lambda stop: None, stop)
    why: list[str] = []
    supervisor = threads.start(
        "supervise", lambda stop: threads.supervise([alive, dying], stop, 0.01, why.append), stop
    )
    wait_for(lambda: stop.is_set())
    assert why == ["thread dying died"]
    supervisor.join(5)
    alive.join(5)
    assert not alive.is_alive() and not supervisor.is_alive()
