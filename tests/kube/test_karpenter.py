"""REPLACE through the real Karpenter: gpuguard deletes the sick node's NodeClaim once,
Karpenter drains and terminates it and launches a replacement, and the training Job
(examples/jobs/job.yaml) resumes on the new node and completes, its failures uncounted,
and the episode closes Replaced naming the new node.

A control plane of its own (``karpenter_plane``, shared with test_positions.py): Karpenter's
real NodeClaim CRD would clash with the shared API server's stand-in, and the node lifecycle
controller Karpenter needs would mark the other tests' kubelet-less nodes NotReady.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest

from gpuguard.contract.conditions import PROFILES
from gpuguard.kube.remediations import NODE_REMEDIATIONS, report_result
from gpuguard.kube.rest import KubeApi, load_api
from gpuguard.model import Action
from gpuguard.remediation.model import ActionResult
from tests.support.audit import AuditLog
from tests.support.cluster import set_health, stamp, wait_for
from tests.support.controllers import Running, new_controller, only_rung, remediations, tainted
from tests.support.controlplane import ControlPlane
from tests.support.jobsystem import (
    create_job,
    end_pod,
    finished_as,
    job_status,
    running_pod,
    training_job,
)
from tests.support.karpenter import (
    KARPENTER_TOLERATION_S,
    KARPENTER_USER,
    TRAIN_NAMESPACE,
    node_gone,
    nodeclaims,
)

NAMESPACE = TRAIN_NAMESPACE
TOLERATION_S = KARPENTER_TOLERATION_S


@pytest.fixture
def cluster(karpenter_plane: ControlPlane) -> ControlPlane:
    return karpenter_plane


def node_of(pod: dict[str, Any]) -> str:
    return str(pod["spec"]["nodeName"])


def eks_agent_reports_xid79(api: KubeApi, node: str) -> None:
    """What gpuguard's agent on condition_profile eks publishes for an Xid 79: the EKS
    names (AcceleratedHardwareReady False), gpuguard's own removed, and its report."""
    report = {"status": "Unhealthy", "action": "REBOOT", "codes": ["XID_79"], "gpus": []}
    healthy = {"status": "Healthy", "action": "NONE", "codes": [], "gpus": []}
    layers = {"gpu": report, "network": healthy, "kernel": healthy}
    document = json.dumps({"reportedAt": stamp(), "layers": layers})
    api.patch(
        f"/api/v1/nodes/{node}", {"metadata": {"annotations": {"gpuguard.io/report": document}}}
    )
    statuses = {
        "AcceleratedHardwareReady": "False",
        "NetworkingReady": "True",
        "KernelReady": "True",
    }
    conditions: list[dict[str, str]] = [
        {
            "type": kind,
            "status": status,
            "reason": "Xid79" if status == "False" else "Healthy",
            "lastTransitionTime": stamp(),
            "lastHeartbeatTime": stamp(),
        }
        for kind, status in statuses.items()
    ]
    conditions += [{"$patch": "delete", "type": kind} for kind in PROFILES["gpuguard"].values()]
    api.patch(f"/api/v1/nodes/{node}/status", {"status": {"conditions": conditions}}, "strategic")


def test_replace_hands_the_node_to_karpenter_once_and_the_job_resumes_on_its_replacement(
    cluster: ControlPlane,
) -> None:
    api = load_api(cluster.admin_kubeconfig)
    gpuguard = load_api(cluster.client_kubeconfig("gpuguard-controller"))
    job = create_job(api, NAMESPACE, training_job())
    first = wait_for(
        lambda: running_pod(api, NAMESPACE, job), 90, "a node launched, the pod running"
    )
    sick = node_of(first)
    set_health(api, sick)  # the agent's first report: healthy
    # Only REPLACE is left on the ladder, so the fault goes straight to Karpenter.
    attempts = only_rung("REPLACE")
    controller = new_controller(gpuguard, "gpuguard", "karpenter", max_attempts=attempts)
    running = Running(controller.run)
    try:
        set_health(api, sick, gpu="False", action="REBOOT", codes=("XID_79",))
        resumed = wait_for(
            lambda: running_pod(api, NAMESPACE, job, not_uid=first["metadata"]["uid"]),
            120,
            "the job's pod running again, on a new node",
        )
        replacement = node_of(resumed)
        assert replacement != sick
        set_health(api, replacement)  # the new machine's agent: healthy
        (episode,) = api.list(NODE_REMEDIATIONS.path()).items
        wait_for(
            lambda: (
                api.get(NODE_REMEDIATIONS.path(episode["metadata"]["name"]))["status"].get(
                    "resolution"
                )
                == "Replaced"
            ),
            120,
            "the episode closed Replaced once the old Node is gone",
        )
        wait_for(
            lambda: (
                api.get(NODE_REMEDIATIONS.path(episode["metadata"]["name"]))["status"].get(
                    "replacement"
                )
                == replacement
            ),
            30,
            "the episode naming the node that replaced the sick one",
        )
        # Karpenter removes the old NodeClaim a moment after its Node.
        wait_for(
            lambda: [c["status"].get("nodeName") for c in nodeclaims(api)] == [replacement],
            30,
            "the replacement's NodeClaim the only one",
        )
        assert cluster.audit_log is not None
        deletes = [
            w
            for w in AuditLog(cluster.audit_log).writes(
                user="gpuguard-controller", resource="nodeclaims"
            )
            if w.verb == "delete"
        ]
        assert len(deletes) == 1 and deletes[0].succeeded  # once, whatever the re-sent REPLACE
        end_pod(api, resumed, 0)
        done = wait_for(lambda: finished_as(api, NAMESPACE, job), 60, "the job done")
        assert done[0] == "Complete"
        assert not job_status(api, NAMESPACE, job).get("failed")  # the eviction cost nothing
    finally:
        running.halt()
        gpuguard.close()
        api.close()


def test_with_karpenters_node_repair_on_a_node_it_will_replace_is_left_to_it(
    cluster: ControlPlane,
) -> None:
    """One authority per node (policy karpenter_repair): an agent on the eks profile says
    AcceleratedHardwareReady=False; gpuguard quarantines the node and takes no rung, and
    Karpenter's repair replaces it once, after its toleration."""
    api = load_api(cluster.admin_kubeconfig)
    gpuguard = load_api(cluster.client_kubeconfig("gpuguard-deferring"))
    job = create_job(api, NAMESPACE, training_job())
    first = wait_for(lambda: running_pod(api, NAMESPACE, job), 90, "the pod running")
    sick = node_of(first)
    controller = new_controller(gpuguard, "gpuguard", "karpenter", karpenter_repair=True)
    running = Running(controller.run)
    try:
        eks_agent_reports_xid79(api, sick)
        wait_for(lambda: tainted(api, sick), 30, "gpuguard's quarantine")
        wait_for(lambda: node_gone(api, sick), 120, "Karpenter's repair replacing the node")
        (episode,) = [
            e for e in api.list(NODE_REMEDIATIONS.path()).items if e["spec"]["nodeName"] == sick
        ]
        assert episode["status"].get("rung") is None  # no rung of ours was started
        assert cluster.audit_log is not None
        ours = AuditLog(cluster.audit_log).writes(user="gpuguard-deferring")
        assert not [w for w in ours if w.resource == "nodeclaims" or w.subresource == "eviction"]
        assert not [w for w in ours if "unschedulable" in json.dumps(w.body)]  # never cordoned
        # Karpenter's repair deleted the node's NodeClaim itself (its termination flow
        # deletes more than once; gpuguard's user wrote none of it).
        log = AuditLog(cluster.audit_log)
        by_karpenter = log.writes(user=KARPENTER_USER, resource="nodeclaims")
        assert any(w.verb == "delete" and w.succeeded for w in by_karpenter)
    finally:
        running.halt()
        gpuguard.close()
        api.close()


def running_jobs(api: KubeApi, count: int, **annotations: str) -> list[dict[str, Any]]:
    """``count`` training Jobs' pods running, one node each (8 GPUs a pod); ``annotations``
    on their pods."""
    jobs = []
    for _ in range(count):
        job = training_job()
        job["spec"]["template"].setdefault("metadata", {})["annotations"] = annotations
        jobs.append(create_job(api, NAMESPACE, job))
    return [
        wait_for(lambda job=job: running_pod(api, NAMESPACE, job), 90, "a pod running")
        for job in jobs
    ]


def open_episode(api: KubeApi, node: str) -> dict[str, Any]:
    """The node's open NodeRemediation ({} if none; a node may have closed ones too)."""
    found = [r for r in remediations(api, node) if r["status"].get("phase") != "Closed"]
    return found[0] if found else {}


def claim_of(api: KubeApi, node: str) -> dict[str, Any]:
    (claim,) = [c for c in nodeclaims(api) if c["status"].get("nodeName") == node]
    return claim


def test_a_reboot_longer_than_karpenters_toleration_is_not_cut_short(
    cluster: ControlPlane,
) -> None:
    """gpuguard owns the ladder (its own condition names): a REBOOT whose answer takes
    longer than Karpenter's repair toleration is left alone by Karpenter, while on the
    same cluster in the same time Karpenter's repair replaces a node the EKS node
    monitoring agent would have reported (NetworkingReady=False): the toleration did pass."""
    api = load_api(cluster.admin_kubeconfig)
    gpuguard = load_api(cluster.client_kubeconfig("gpuguard-rebooting"))
    rebooting, other = (node_of(p) for p in running_jobs(api, 2))
    claim = claim_of(api, rebooting)["metadata"]["name"]
    set_health(api, rebooting)
    attempts = only_rung("REBOOT")
    controller = new_controller(
        gpuguard, "gpuguard", "karpenter", max_attempts=attempts, action_timeout_s=600
    )
    running = Running(controller.run)
    try:
        set_health(api, rebooting, gpu="False", action="REBOOT", codes=("XID_79",))

        def asked() -> dict[str, Any] | None:
            episode = open_episode(api, rebooting)
            request = episode.get("status", {}).get("request")
            return episode if request and request["action"] == "REBOOT" else None

        episode = wait_for(asked, 60, "the reboot asked of the node's agent")
        asked_at = time.monotonic()
        down = {"type": "NetworkingReady", "status": "False", "reason": "Test"}
        down |= {"lastTransitionTime": stamp(), "lastHeartbeatTime": stamp()}
        api.patch(f"/api/v1/nodes/{other}/status", {"status": {"conditions": [down]}}, "strategic")
        wait_for(lambda: node_gone(api, other), 120, "Karpenter's repair of the other node")
        assert time.monotonic() - asked_at >= TOLERATION_S
        assert not node_gone(api, rebooting)
        assert not claim_of(api, rebooting)["metadata"].get("deletionTimestamp")
        assert cluster.audit_log is not None
        touched = [
            w
            for w in AuditLog(cluster.audit_log).writes(resource="nodeclaims")
            if w.verb == "delete" and w.name == claim
        ]
        assert not touched, touched
        name = episode["metadata"]["name"]
        assert api.get(NODE_REMEDIATIONS.path(name))["status"]["phase"] == "Acting"
        done = ActionResult(1, Action.REBOOT, True, time.time(), "rebooted (test)")
        report_result(api, name, done)
        set_health(api, rebooting)  # back healthy after the reboot
        wait_for(
            lambda: api.get(NODE_REMEDIATIONS.path(name))["status"].get("resolution") == "Repaired",
            60,
            "the episode closed Repaired",
        )
        wait_for(
            lambda: not api.get(f"/api/v1/nodes/{rebooting}")["spec"].get("unschedulable"),
            30,
            "the node uncordoned",
        )
    finally:
        running.halt()
        gpuguard.close()
        api.close()


def test_a_pod_that_asks_not_to_be_disrupted_holds_the_replacement_until_it_ends(
    cluster: ControlPlane,
) -> None:
    """karpenter.sh/do-not-disrupt on the job's pod: gpuguard quarantines the node and
    starts no rung while the pod runs (Karpenter would not evict it either); once the pod
    has finished, the REPLACE goes ahead, once."""
    api = load_api(cluster.admin_kubeconfig)
    gpuguard = load_api(cluster.client_kubeconfig("gpuguard-respectful"))
    (pod,) = running_jobs(api, 1, **{"karpenter.sh/do-not-disrupt": "true"})
    sick = node_of(pod)
    set_health(api, sick)
    attempts = only_rung("REPLACE")
    controller = new_controller(gpuguard, "gpuguard", "karpenter", max_attempts=attempts)
    running = Running(controller.run)
    try:
        set_health(api, sick, gpu="False", action="REBOOT", codes=("XID_79",))

        def held() -> bool:
            steps = open_episode(api, sick).get("status", {}).get("steps") or []
            return any("carries karpenter.sh/do-not-disrupt" in s["message"] for s in steps)

        wait_for(held, 30, "the episode saying why it holds")
        assert tainted(api, sick)
        node = api.get(f"/api/v1/nodes/{sick}")
        assert not node["spec"].get("unschedulable") and not node_gone(api, sick)
        assert cluster.audit_log is not None
        ours = AuditLog(cluster.audit_log).writes(user="gpuguard-respectful")
        assert not [w for w in ours if w.resource == "nodeclaims" or w.subresource == "eviction"]
        end_pod(api, pod, 0)  # the protected work is done
        wait_for(lambda: node_gone(api, sick), 120, "the replacement, once the pod ended")
        deletes = [
            w
            for w in AuditLog(cluster.audit_log).writes(
                user="gpuguard-respectful", resource="nodeclaims"
            )
            if w.verb == "delete"
        ]
        assert len(deletes) == 1 and deletes[0].succeeded
    finally:
        running.halt()
        gpuguard.close()
        api.close()


def test_a_storm_past_karpenters_limit_leaves_every_node_quarantined_and_whole(
    cluster: ControlPlane,
) -> None:
    """More than Karpenter's 20 % of the nodes (two of three, say) say
    AcceleratedHardwareReady=False, so its repair refuses (NodeRepairBlocked), and
    gpuguard (karpenter_repair) takes no rung either: every such node quarantined, none
    cordoned, drained nor replaced."""
    api = load_api(cluster.admin_kubeconfig)
    gpuguard = load_api(cluster.client_kubeconfig("gpuguard-storm"))
    while len(api.list("/api/v1/nodes").items) < 3:  # a Job's pod each, a node each
        job = create_job(api, NAMESPACE, training_job())
        wait_for(lambda job=job: running_pod(api, NAMESPACE, job), 90, "a pod running")
    nodes = sorted(n["metadata"]["name"] for n in api.list("/api/v1/nodes").items)
    controller = new_controller(gpuguard, "gpuguard", "karpenter", karpenter_repair=True)
    running = Running(controller.run)
    try:
        # Karpenter allows ceil(20 % of the pool's nodes) unhealthy: one more is a storm.
        storm = nodes[: math.ceil(len(nodes) * 0.2) + 1]
        for name in storm:
            eks_agent_reports_xid79(api, name)

        def blocked() -> bool:
            events = api.list("/api/v1/events").items
            return any(
                e.get("reason") == "NodeRepairBlocked"
                and (e.get("involvedObject") or {}).get("name") in storm
                for e in events
            )

        wait_for(blocked, 90, "Karpenter's repair refusing past its 20 % limit")
        for name in storm:
            wait_for(lambda name=name: tainted(api, name), 30, "gpuguard's quarantine")
            assert not node_gone(api, name) and not api.get(f"/api/v1/nodes/{name}")["spec"].get(
                "unschedulable"
            )
        assert cluster.audit_log is not None
        ours = AuditLog(cluster.audit_log).writes(user="gpuguard-storm")
        assert not [w for w in ours if w.resource == "nodeclaims" or w.subresource == "eviction"]
    finally:
        running.halt()
        gpuguard.close()
        api.close()
