"""What the controller reads from the cluster is untrusted, and its writes are fenced.

An agent may write its own report and its own answer; operators edit the breaker's
ConfigMap; a replica can lose its Lease in the middle of a pass. None of that may stop the
controller from quarantining the rest of the fleet, start a node's ladder over, or let a
replica that no longer leads write anything (rows of docs/reliability.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpuguard.contract.breaker import DATA_KEY
from gpuguard.contract.keys import BREAKER_CONFIGMAP
from gpuguard.contract.times import format_time
from gpuguard.controller.loop import Controller
from gpuguard.kube.errors import KubeFenced
from gpuguard.kube.remediations import NODE_REMEDIATIONS, save_episode
from gpuguard.kube.rest import KubeApi, KubeConflict
from gpuguard.model import Action
from gpuguard.remediation.model import Episode, Phase, Step
from tests.support.cluster import make_node, set_health, stamp, wait_for
from tests.support.controllers import (
    POOL,
    node,
    node_name,
    reconciled,
    remediations,
    status_of,
    tainted,
)
from tests.support.metrics import sample

REPORT = "gpuguard.io/report"


def sick(api: KubeApi) -> str:
    """A node whose agent reports a fatal Xid: tainted within a pass by a working controller."""
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    set_health(api, name, gpu="False", action="REBOOT", codes=("XID_79",))
    return name


def events_about(api: KubeApi, name: str, reason: str) -> list[dict[str, Any]]:
    found = api.list("/apis/events.k8s.io/v1/namespaces/default/events").items
    return [e for e in found if e["regarding"]["name"] == name and e["reason"] == reason]


# rows 19-21 (F2): one agent's garbled report must not blind the controller fleet-wide.
@pytest.mark.parametrize(
    "report",
    [{"layers": []}, {"layers": {"gpu": 5}}, {"layers": {"gpu": {"codes": 5}}}, [1, 2]],
    ids=["layers-list", "layer-int", "codes-int", "not-an-object"],
)
def test_a_garbled_report_is_that_nodes_problem_only(
    api: KubeApi, start_controller: Callable[..., Controller], report: object
) -> None:
    liar = node_name()
    make_node(api, liar, labels={POOL: "h100"})
    set_health(api, liar)
    controller = start_controller(tolerance_s=300)
    api.patch(f"/api/v1/nodes/{liar}", {"metadata": {"annotations": {REPORT: json.dumps(report)}}})
    canary = sick(api)
    wait_for(lambda: tainted(api, canary), what="the canary tainted")
    assert all(thread.is_alive() for thread in controller.watch_threads)
    assert not tainted(api, liar)  # its conditions still say True: nothing to act on
    unreadable = "gpuguard_controller_unreadable_objects_total"
    assert sample(controller.metrics.registry, unreadable, kind="report") >= 1


# F11's other half: what the controller copies from a report into an episode is bounded.
def test_a_report_naming_more_gpus_than_a_node_has_quarantines_without_a_rung(
    api: KubeApi, start_controller: Callable[..., Controller]
) -> None:
    liar = sick(api)
    layer = {"status": "Unhealthy", "action": "RESET_GPU", "codes": ["XID_48"]}
    report = {"reportedAt": stamp(), "layers": {"gpu": {**layer, "gpus": ["0"] * 100}}}
    api.patch(f"/api/v1/nodes/{liar}", {"metadata": {"annotations": {REPORT: json.dumps(report)}}})
    controller = start_controller(tolerance_s=0)
    wait_for(lambda: tainted(api, liar) and remediations(api, liar), what="the liar quarantined")
    reconciled(controller)
    assert "request" not in status_of(api, liar) and status_of(api, liar).get("rung") is None
    canary = sick(api)
    wait_for(lambda: tainted(api, canary), what="the canary tainted")


# row 23 (F2): the same report already on a Node when the controller starts.
def test_a_garbled_report_at_start_up_does_not_stop_the_first_pass(
    api: KubeApi, start_controller: Callable[..., Controller]
) -> None:
    liar = node_name()
    make_node(api, liar, labels={POOL: "h100"})
    set_health(api, liar)
    api.patch(f"/api/v1/nodes/{liar}", {"metadata": {"annotations": {REPORT: '{"layers": []}'}}})
    canary = sick(api)
    start_controller(tolerance_s=300)
    wait_for(lambda: tainted(api, canary), what="the canary tainted")


# row 31 (F12): an operator's garbled breaker state.
def test_a_garbled_breaker_state_reads_as_closed(
    api: KubeApi, namespace: str, start_controller: Callable[..., Controller]
) -> None:
    api.create(
        f"/api/v1/namespaces/{namespace}/configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": BREAKER_CONFIGMAP},
            "data": {DATA_KEY: json.dumps({"open": False, "resetAt": "yesterday"})},
        },
    )
    controller = start_controller(tolerance_s=300)
    canary = sick(api)
    wait_for(lambda: tainted(api, canary), what="the canary tainted")
    reconciled(controller)
    assert sample(controller.metrics.registry, "gpuguard_controller_leader") == 1


# row 27 (F4): an episode the controller cannot read is held, never taken for absent.
def test_an_unreadable_episode_holds_its_node_instead_of_starting_the_ladder_over(
    api: KubeApi, start_controller: Callable[..., Controller]
) -> None:
    name = sick(api)
    opened = time.time() - 60
    rebooted = Episode(
        node=name,
        opened_at=opened,
        phase=Phase.VERIFYING,
        rung=Action.REBOOT,
        attempts={Action.REBOOT: 1},
        phase_since=opened + 30,
        steps=[
            Step(opened, Phase.QUARANTINED, "quarantined"),
            Step(opened + 30, Phase.VERIFYING, "rebooted"),
        ],
    )
    save_episode(api, rebooted, new=True)
    (stored,) = remediations(api, name)
    steps = [*stored["status"]["steps"], {"at": stamp(), "phase": "Bogus", "message": "x"}]
    path = NODE_REMEDIATIONS.path(stored["metadata"]["name"], sub="status")
    api.patch(path, {"status": {"steps": steps}})  # the CRD lets an unknown phase in
    controller = start_controller(tolerance_s=0, verify_timeout_s=0)  # would reboot again
    wait_for(lambda: events_about(api, name, "EpisodeUnreadable"), what="the held-node Event")
    wait_for(lambda: tainted(api, name), what="the held node quarantined")
    reconciled(controller)
    assert len(remediations(api, name)) == 1  # no second episode
    assert "request" not in status_of(api, name)  # and no repair ordered
    assert sample(controller.metrics.registry, "gpuguard_controller_held_nodes") == 1


# F1: a replica's writes are fenced by its leadership, checked before each one.
def test_a_fenced_client_sends_no_write_once_its_fence_is_down(api: KubeApi) -> None:
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    leading = True
    writer = api.fenced(lambda: leading, "test replica does not hold the Lease")
    writer.patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": {"seen": "yes"}}})
    leading = False
    with pytest.raises(KubeFenced, match="does not hold the Lease"):
        writer.patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": {"seen": "no"}}})
    assert node(api, name)["metadata"]["labels"]["seen"] == "yes"
    assert writer.get(f"/api/v1/nodes/{name}")  # reads are not fenced


# F1: an episode write computed from an old version is refused by the API server.
def test_an_episode_write_from_a_stale_version_is_refused(api: KubeApi) -> None:
    episode = Episode(node=node_name(), opened_at=1_796_000_000.0, phase_since=1_796_000_000.0)
    stale = save_episode(api, episode, new=True)
    episode.steps.append(Step(1_796_000_030.0, Phase.QUARANTINED, "the new leader's step"))
    newer = save_episode(api, episode, resource_version=stale)  # the new leader's write
    assert newer != stale
    with pytest.raises(KubeConflict):
        save_episode(api, episode, resource_version=stale)  # the thawed replica's


# row 58 (F7) with row 59's skew: silence is judged on the controller's clock.
def test_an_agent_is_silent_when_its_report_stops_changing_not_when_its_clock_is_behind(
    api: KubeApi, start_controller: Callable[..., Controller]
) -> None:
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    set_health(api, name)
    document = json.loads(node(api, name)["metadata"]["annotations"][REPORT])

    def report(stamp_s: float) -> None:  # the agent's heartbeat, its clock an hour behind
        document["reportedAt"] = format_time(stamp_s)
        api.patch(
            f"/api/v1/nodes/{name}", {"metadata": {"annotations": {REPORT: json.dumps(document)}}}
        )

    behind = time.time() - 3600
    report(behind)
    controller = start_controller(agent_timeout_s=3, unknown_grace_s=0)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # heartbeats keep coming: alive, however stamped
        behind += 1
        report(behind)
        reconciled(controller, times=1)
    assert not tainted(api, name) and not events_about(api, name, "AgentSilent")
    wait_for(lambda: events_about(api, name, "AgentSilent"), what="the AgentSilent Event")
    wait_for(lambda: tainted(api, name), what="the silent agent's node tainted")
    assert "request" not in status_of(api, name)
