"""The controller's start: the cyclic collector waits until the Node cache is filled,
then comes back with what the start made set aside (controller/main.py)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from gpuguard.controller.main import collect_after_start
from tests.support.cluster import wait_for


@pytest.fixture
def collector() -> Iterator[None]:
    """Whatever a test does to the collector is undone."""
    yield
    gc.enable()
    gc.unfreeze()


def test_the_collector_waits_for_ready_then_sets_the_start_aside(collector: None) -> None:
    ready, stop = threading.Event(), threading.Event()
    collect_after_start(ready, stop)
    assert not gc.isenabled()

    kept = [{"node": i} for i in range(1000)]  # a cache being filled
    ready.set()

    wait_for(gc.isenabled, 10, "the collector back once ready")
    assert gc.get_freeze_count() >= len(kept)
    stop.set()


def test_a_controller_stopped_before_ready_gets_its_collector_back(collector: None) -> None:
    ready, stop = threading.Event(), threading.Event()
    collect_after_start(ready, stop)
    stop.set()
    wait_for(gc.isenabled, 10, "the collector back on stop")


def test_a_controller_not_ready_in_time_gets_its_collector_back(collector: None) -> None:
    ready, stop = threading.Event(), threading.Event()
    collect_after_start(ready, stop, most_s=0.5)  # an API server down at start, say
    wait_for(gc.isenabled, 10, "the collector back after the pause")
    assert not ready.is_set()
    stop.set()
