"""Where a fault lives, on the real API server (docs/remediation.md, "Where a fault lives").

With the real Karpenter (its KWOK provider, the plane shared with test_karpenter.py): a
machine whose InfiniBand port is down is replaced once; its successor at the same rack
position shows the same port down, and the controller holds it (no second replacement),
says so (condition, Event, metric) and lets go once a person marks the position fixed.

On the shared plane, what the controller cannot read is said and never stops it: Nodes
without position labels or with half a label set, two live Nodes claiming one position.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gpuguard.contract.conditions import POSITION_CONDITION
from gpuguard.contract.keys import POSITION_FIXED_ANNOTATION
from gpuguard.controller.loop import Controller
from gpuguard.kube.remediations import NODE_REMEDIATIONS
from gpuguard.kube.rest import KubeApi, load_api
from tests.support.audit import AuditLog
from tests.support.cluster import make_node, set_health, wait_for
from tests.support.controllers import (
    POOL,
    Running,
    new_controller,
    node,
    node_name,
    only_rung,
    reconciled,
    remediations,
    tainted,
)
from tests.support.controlplane import ControlPlane
from tests.support.jobsystem import create_job, finished_as, running_pod, training_job
from tests.support.karpenter import TRAIN_NAMESPACE, nodeclaims
from tests.support.metrics import sample

EVENTS = "/apis/events.k8s.io/v1/namespaces/default/events"
PORT_DOWN: dict[str, Any] = {
    "network": "False",
    "network_action": "REBOOT",
    "network_codes": ("IB_LINK_DOWN",),
    "network_ports": ("mlx5_0/1",),
}
XID_79: dict[str, Any] = {"gpu": "False", "action": "REBOOT", "codes": ("XID_79",)}


def events(api: KubeApi, reason: str, node: str | None = None) -> list[dict[str, Any]]:
    return [
        e
        for e in api.list(EVENTS).items
        if e.get("reason") == reason and (node is None or e["regarding"]["name"] == node)
    ]


def position_condition(api: KubeApi, name: str) -> dict[str, Any]:
    """Our condition on the Node ({} when it has none)."""
    conditions = node(api, name)["status"].get("conditions") or []
    return next((c for c in conditions if c["type"] == POSITION_CONDITION), {})


def open_status(api: KubeApi, name: str) -> dict[str, Any]:
    """The status of the node's open NodeRemediation ({} when none is open)."""
    found = [r for r in remediations(api, name) if r["status"].get("phase") != "Closed"]
    return dict(found[0]["status"]) if found else {}


def at_fault(controller: Controller, position: str, name: str) -> float:
    return sample(
        controller.metrics.registry, "gpuguard_position_at_fault", position=position, node=name
    )


# --- with Karpenter ------------------------------------------------------------------------
def pod_node(pod: dict[str, Any]) -> str:
    return str(pod["spec"]["nodeName"])


def machines_left(api: KubeApi) -> str:
    """What holds the plane's machines ("": none left), for the message of a timeout."""
    nodes = [n["metadata"]["name"] for n in api.list("/api/v1/nodes").items]
    pods = [
        f"{p['metadata']['name']}@{p['spec'].get('nodeName')}:{p['status'].get('phase')}"
        for p in api.list(f"/api/v1/namespaces/{TRAIN_NAMESPACE}/pods").items
    ]
    return f"nodes {nodes}, pods {pods}" if nodes else ""


@pytest.fixture
def karpenter(karpenter_plane: ControlPlane) -> Iterator[KubeApi]:
    """The Karpenter plane with none of an earlier test's work, machines or episodes left:
    a sick node left behind would be this test's controller's to replace. The Jobs are
    suspended (their controller ends their pods and lets them go), then every NodeClaim
    deleted."""
    api = load_api(karpenter_plane.admin_kubeconfig)
    jobs = f"/apis/batch/v1/namespaces/{TRAIN_NAMESPACE}/jobs"
    for job in api.list(jobs).items:
        if not finished_as(api, TRAIN_NAMESPACE, job["metadata"]["name"]):
            api.patch(f"{jobs}/{job['metadata']['name']}", {"spec": {"suspend": True}})
    for claim in nodeclaims(api):
        api.delete(f"/apis/karpenter.sh/v1/nodeclaims/{claim['metadata']['name']}")
    try:
        wait_for(lambda: not machines_left(api), 120, "every machine gone")
    except AssertionError:
        raise AssertionError(f"still there: {machines_left(api)}") from None
    for episode in api.list(NODE_REMEDIATIONS.path()).items:
        api.delete(NODE_REMEDIATIONS.path(episode["metadata"]["name"]))
    try:
        yield api
    finally:
        api.close()


def test_a_fault_that_stays_with_the_position_is_replaced_once_then_held_until_marked_fixed(
    karpenter_plane: ControlPlane, karpenter: KubeApi
) -> None:
    api = karpenter
    user = "gpuguard-positions"
    gpuguard = load_api(karpenter_plane.client_kubeconfig(user))
    position = {"rack": "r1", "position": "u1"}
    where = "rack=r1,position=u1"
    job = create_job(api, TRAIN_NAMESPACE, training_job())
    first = wait_for(
        lambda: running_pod(api, TRAIN_NAMESPACE, job), 90, "a machine, the pod running"
    )
    sick = pod_node(first)
    api.patch(f"/api/v1/nodes/{sick}", {"metadata": {"labels": position}})
    set_health(api, sick)
    # REPLACE is the only rung, so the port fault goes to Karpenter at once.
    controller = new_controller(
        gpuguard, "gpuguard", "karpenter", max_attempts=only_rung("REPLACE")
    )
    running = Running(controller.run)
    try:
        set_health(api, sick, **PORT_DOWN)
        resumed = wait_for(
            lambda: running_pod(api, TRAIN_NAMESPACE, job, not_uid=first["metadata"]["uid"]),
            120,
            "the job's pod running again, on the machine Karpenter launched",
        )
        successor = pod_node(resumed)
        wait_for(
            lambda: (
                [r["status"].get("resolution") for r in remediations(api, sick)] == ["Replaced"]
            ),
            120,
            "the first machine's episode closed Replaced",
        )
        # The data hall's inventory labels the new machine with its slot; its agent reports
        # the same port down: the cable, not the machine.
        api.patch(f"/api/v1/nodes/{successor}", {"metadata": {"labels": position}})
        set_health(api, successor, **PORT_DOWN)
        held = wait_for(
            lambda: open_status(api, successor).get("positionFault"), 60, "the position's fault"
        )
        assert where in held and sick in held and "IB_LINK_DOWN@mlx5_0/1" in held
        reconciled(controller, times=3)  # a few more passes: none of them replaces it
        (claim,) = [c for c in nodeclaims(api) if c["status"].get("nodeName") == successor]
        assert not claim["metadata"].get("deletionTimestamp")
        status = open_status(api, successor)
        assert status["phase"] == "Quarantined" and not status.get("request")
        assert tainted(api, successor)
        assert karpenter_plane.audit_log is not None
        deletes = [
            w
            for w in AuditLog(karpenter_plane.audit_log).writes(user=user, resource="nodeclaims")
            if w.verb == "delete"
        ]
        assert len(deletes) == 1  # the first machine's, never the successor's
        condition = wait_for(
            lambda: (
                position_condition(api, successor).get("status") == "False"
                and position_condition(api, successor)
            ),
            20,
            "GpuguardPositionHealthy=False",
        )
        assert condition["reason"] == "PositionAtFault" and where in condition["message"]
        (event,) = wait_for(lambda: events(api, "PositionAtFault", successor), 20, "the Event")
        assert where in event["note"] and event["type"] == "Warning"
        assert at_fault(controller, where, successor) == 1

        # Repaired: the port comes back and a person marks the position fixed.
        set_health(api, successor)
        api.patch(
            f"/api/v1/nodes/{successor}",
            {"metadata": {"annotations": {POSITION_FIXED_ANNOTATION: "ticket-1"}}},
        )
        wait_for(
            lambda: (
                POSITION_FIXED_ANNOTATION not in node(api, successor)["metadata"]["annotations"]
            ),
            30,
            "the mark taken off",
        )
        wait_for(
            lambda: position_condition(api, successor).get("status", "True") == "True",
            30,
            "the position healthy again",
        )
        wait_for(lambda: not at_fault(controller, where, successor), 20, "the series gone")
        assert len(events(api, "PositionAtFault", successor)) == 1
        assert not [c for c in nodeclaims(api) if c["metadata"].get("deletionTimestamp")]
    finally:
        running.halt()
        gpuguard.close()


# --- bad input on the shared plane -----------------------------------------------------
def test_nodes_without_a_usable_position_are_told_and_a_sick_one_still_quarantined(
    api, start_controller
):
    bare, half, placed = node_name(), node_name(), node_name()
    # A fleet that labels positions (an unlabelled fleet is counted, not told per node).
    make_node(api, placed, labels={POOL: "h100", "rack": "r7", "position": "u1"})
    set_health(api, placed)
    make_node(api, bare, labels={POOL: "h100"})
    make_node(api, half, labels={POOL: "h100", "rack": "r7"})  # no "position" label
    set_health(api, half)
    set_health(api, bare, **XID_79)
    controller = start_controller()
    wait_for(lambda: tainted(api, bare), 30, "the sick node quarantined all the same")
    (told,) = wait_for(lambda: events(api, "PositionUnknown", half), 20, "the Event on half")
    assert "missing: position" in told["note"]
    (told,) = wait_for(lambda: events(api, "PositionUnknown", bare), 20, "the Event on bare")
    assert "none of the position label sets" in told["note"]
    reconciled(controller, times=3)
    assert (
        len(events(api, "PositionUnknown", half)) == len(events(api, "PositionUnknown", bare)) == 1
    )
    for reason in ("unlabelled", "incomplete"):
        count = sample(
            controller.metrics.registry, "gpuguard_controller_nodes_without_position", reason=reason
        )
        assert count >= 1, reason
    (episode,) = remediations(api, bare)
    assert episode["spec"]["position"] == bare  # its name stands for its position


def test_two_live_nodes_claiming_one_position_are_both_held_and_told_once(api, start_controller):
    rack = f"r-{uuid.uuid4().hex[:6]}"
    where = f"rack={rack},position=u3"
    one, two = sorted([node_name(), node_name()])
    for name in (one, two):
        make_node(api, name, labels={POOL: "h100", "rack": rack, "position": "u3"})
        set_health(api, name, **XID_79)
    controller = start_controller(max_attempts=only_rung("REBOOT"))
    (told,) = wait_for(lambda: events(api, "PositionShared", one), 30, "the one Event")
    assert one in told["note"] and two in told["note"] and where in told["note"]
    for name in (one, two):
        wait_for(
            lambda name=name: "is claimed by" in (open_status(api, name).get("lastMessage") or ""),
            30,
            f"{name} held for its shared position",
        )
    reconciled(controller, times=3)
    assert not events(api, "PositionShared", two)  # one Event, about one of them
    assert len(events(api, "PositionShared", one)) == 1
    for name in (one, two):
        status = open_status(api, name)
        assert status["phase"] == "Quarantined" and not status.get("rung")
        assert not status.get("request") and tainted(api, name)
        assert not node(api, name)["spec"].get("unschedulable")
    assert sample(controller.metrics.registry, "gpuguard_controller_shared_positions") >= 1
