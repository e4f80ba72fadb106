"""Quarantine never waits behind a reconcile pass: a node that turns unhealthy while a
pass is still writing is tainted as its change arrives, and the pass that follows opens
its episode (controller/quarantine.py). On the real API server, with the pass in progress
held open by the test."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from gpuguard.contract.keys import EXCLUDE_LABEL
from gpuguard.controller.loop import Controller
from gpuguard.kube.rest import KubeApi
from tests.support.cluster import make_node, set_health, wait_for
from tests.support.controllers import (
    POOL,
    Running,
    new_controller,
    node_name,
    reconciled,
    remediations,
    status_of,
    tainted,
)

HOLD_S = 30.0  # the longest the test holds a pass open


class HeldPasses:
    """While ``hold`` is set, each pass waits (up to HOLD_S) before it starts: a pass
    that is still busy with its records, as far as the Node watch can tell."""

    def __init__(self, controller: Controller) -> None:
        self.hold = threading.Event()
        self.release = threading.Event()
        self.waiting = threading.Event()
        real = controller.reconcile

        def reconcile():  # type: ignore[no-untyped-def]
            if self.hold.is_set():
                self.waiting.set()
                self.release.wait(HOLD_S)
            return real()

        controller.reconcile = reconcile  # type: ignore[method-assign]


@pytest.fixture
def held(api: KubeApi, namespace: str, request: pytest.FixtureRequest) -> Iterator[HeldPasses]:
    controller = new_controller(api, namespace, dry_run=getattr(request, "param", False))
    passes = HeldPasses(controller)
    running = Running(controller.run)
    try:
        wait_for(controller.leading.is_set, 20, "the controller to lead")
        reconciled(controller)
        yield passes
    finally:
        passes.release.set()
        running.halt()


def healthy_nodes(api: KubeApi, count: int, **labels: str) -> list[str]:
    names = [node_name() for _ in range(count)]
    for name in names:
        make_node(api, name, labels={POOL: "h100", **labels})
        set_health(api, name)
    return names


def flip(api: KubeApi, name: str) -> None:
    set_health(api, name, gpu="False", action="RESET_GPU", codes=("XID_48",))


def test_a_node_flipping_during_a_pass_is_tainted_before_the_pass_ends(api, held):
    first, second = healthy_nodes(api, 2)
    held.hold.set()
    flip(api, first)  # wakes a pass, which the test holds: still writing, as seen here
    wait_for(held.waiting.is_set, 10, "a pass in progress")
    flip(api, second)
    wait_for(lambda: tainted(api, second), 5, "the taint, while the pass is still held")
    assert tainted(api, first)
    assert not remediations(api, second), "the episode is the pass's to open, not the watch's"
    held.release.set()
    held.hold.clear()
    wait_for(lambda: remediations(api, second), 10, "the episode opened by the next pass")
    assert tainted(api, second)


def test_a_fault_gone_before_the_pass_still_leaves_its_episode(api, held):
    (name,) = healthy_nodes(api, 1)
    held.hold.set()
    flip(api, name)
    wait_for(held.waiting.is_set, 10, "a pass in progress")
    wait_for(lambda: tainted(api, name), 5, "the taint, ahead of the pass")
    set_health(api, name)  # healthy again before any pass has seen the fault
    held.release.set()
    held.hold.clear()
    # The episode is created first and its steps written to status after.
    wait_for(
        lambda: remediations(api, name) and status_of(api, name).get("steps"),
        10,
        "the quarantine recorded all the same",
    )
    first = status_of(api, name)["steps"][0]["message"]
    assert first.startswith("quarantined: gpu False") and "(now all layers True)" in first, first
    wait_for(lambda: status_of(api, name).get("resolution") == "Transient", 20, "closed")
    # The closing RECORD is written before the untaint it leads to.
    wait_for(lambda: not tainted(api, name), 10, "the taint taken off")


def test_no_taint_ahead_of_the_pass_for_an_excluded_node(api, held):
    (excluded,) = healthy_nodes(api, 1, **{EXCLUDE_LABEL: "true"})
    (witness,) = healthy_nodes(api, 1)
    held.hold.set()
    flip(api, excluded)
    wait_for(held.waiting.is_set, 10, "a pass in progress")
    flip(api, witness)
    wait_for(lambda: tainted(api, witness), 5, "the witness tainted ahead of the pass")
    assert not tainted(api, excluded)


@pytest.mark.parametrize("held", [True], indirect=True, ids=["dry-run"])
def test_dry_run_taints_nothing_ahead_of_the_pass(api, held):
    (name,) = healthy_nodes(api, 1)
    held.hold.set()
    flip(api, name)
    wait_for(held.waiting.is_set, 10, "a pass in progress")
    held.release.set()
    held.hold.clear()
    wait_for(lambda: remediations(api, name), 10, "the episode recorded")
    assert not tainted(api, name)
