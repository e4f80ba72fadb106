"""Leader election on a real Lease: one leader at a time, failover when it stops renewing,
and a quick hand-over when it releases the Lease on shutdown."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from gpuguard.errors import ConfigError
from gpuguard.kube.lease import LeaderElector, start_leader_election
from gpuguard.kube.rest import KubeApi, load_api
from tests.support.clock import FakeClock
from tests.support.cluster import wait_for
from tests.support.controlplane import ControlPlane

NAMESPACE = "default"
FAST = {"lease_s": 2.0, "renew_s": 0.3, "retry_s": 0.2}


@pytest.fixture
def api(control_plane: ControlPlane) -> Iterator[KubeApi]:
    with load_api(control_plane.admin_kubeconfig) as client:
        yield client


@pytest.fixture
def lease_name() -> str:
    return f"gpuguard-controller-{uuid.uuid4().hex[:8]}"


def test_one_leader_and_failover_when_it_stops_renewing(api, control_plane, lease_name):
    # Expiry is judged on each replica's own clock, never the server's: a stepped clock
    # plays out the lease without waiting for it.
    clock = FakeClock(time.time())
    first = LeaderElector(api, NAMESPACE, lease_name, "replica-a", clock=clock, **FAST)
    second = LeaderElector(api, NAMESPACE, lease_name, "replica-b", clock=clock, **FAST)
    assert first.try_acquire_or_renew()
    assert not second.try_acquire_or_renew()

    # Both campaign for a while: the leader renews, the other never gets in.
    for _ in range(30):
        clock.step(0.1)
        assert first.try_acquire_or_renew()
        assert not second.try_acquire_or_renew()

    # The leader hangs (stops renewing); only the candidate keeps trying.
    stopped_at = clock.monotonic()
    took_over_at = None
    while clock.monotonic() - stopped_at < 6:
        clock.step(0.05)
        won = second.try_acquire_or_renew()
        assert not (won and first.is_leader()), "two leaders at once"
        if won:
            took_over_at = clock.monotonic()
            break
    assert took_over_at is not None
    last_renewal = first.renewed_at
    assert last_renewal is not None
    # Never before a full lease after the last renewal; soon after it (one poll, plus the
    # lag between that renewal and the candidate seeing it).
    assert 2.0 <= took_over_at - last_renewal <= 2.0 + 2 * FAST["retry_s"] + 0.5

    lease = control_plane.request(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{lease_name}"
    )
    spec = lease["spec"]
    assert spec["holderIdentity"] == "replica-b"
    assert spec["leaseDurationSeconds"] == 2
    assert spec["leaseTransitions"] == 1
    assert spec["acquireTime"] == spec["renewTime"]
    assert not first.try_acquire_or_renew()  # the old leader sees it lost


def test_never_two_leaders_while_campaigning_in_threads(api, lease_name):
    electors = [LeaderElector(api, NAMESPACE, lease_name, f"replica-{i}", **FAST) for i in range(3)]
    stop = threading.Event()
    log: list[tuple[str, str]] = []
    lock = threading.Lock()
    threads = []
    for elector in electors:

        def note(event: str, who: str = elector.identity) -> None:
            with lock:
                log.append((event, who))

        threads.append(
            start_leader_election(
                elector,
                stop,
                on_started_leading=lambda note=note: note("started"),
                on_stopped_leading=lambda note=note: note("stopped"),
            )
        )

    # Sampled over real time: these threads wait on the system clock, and 3 s spans many
    # renewals and more than one lease.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert sum(e.is_leader() for e in electors) <= 1
        time.sleep(0.02)
    with lock:
        assert [event for event, _ in log] == ["started"]
        leader = log[0][1]

    # The leader shuts down cleanly: it releases the Lease and another takes it at once,
    # without waiting out the lease duration.
    leader_index = [e.identity for e in electors].index(leader)
    stop_one = threading.Event()
    stop.set()  # stop every thread, then restart the two others on their own event
    for thread in threads:
        thread.join(5)
    released_at = time.time()
    with lock:
        assert log[-1] == ("stopped", leader)
    others = [e for i, e in enumerate(electors) if i != leader_index]
    restarted = [
        start_leader_election(
            e, stop_one, on_started_leading=lambda: None, on_stopped_leading=lambda: None
        )
        for e in others
    ]
    wait_for(lambda: any(e.is_leader() for e in others), 1.5, "a new leader")
    assert time.time() - released_at < 1.5  # well under the 2 s lease
    stop_one.set()
    for thread in restarted:
        thread.join(5)


def test_timings_must_leave_room_for_the_renew_deadline(api):
    with pytest.raises(ConfigError):
        LeaderElector(api, NAMESPACE, "x", "me", lease_s=2, renew_s=2)
