"""The example JobSet (examples/jobs/jobset.yaml) run by the real JobSet controller, on the
real Karpenter: gpuguard's REPLACE and KILL_JOB restart the gang on healthy nodes without
charging its maxRestarts (the platformDisruption rule), so do the failures gpuguard
attributes (the pod condition, gpuguard run's exit 76), and an application error still
fails it (applicationError).

One control plane for the module, as test_karpenter.py's (Karpenter's CRDs and its node
lifecycle controller need one of their own); the nodes Karpenter launches stay between the
tests (the NodePool never consolidates), so only the first waits for a whole gang's nodes.
Each test has a namespace of its own, so the example keeps its name and its torchrun
master address.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuguard.contract.keys import INFRASTRUCTURE_FAILURE_CONDITION
from gpuguard.kube.rest import Json, KubeApi, load_api
from gpuguard.training.contract import EXIT_INFRASTRUCTURE
from tests.support import controlplane
from tests.support.audit import AuditLog, Write, evictions
from tests.support.cluster import set_health, wait_for
from tests.support.controllers import Running, new_controller, only_rung, status_of, tainted
from tests.support.controlplane import ControlPlane
from tests.support.jobset import (
    JOBSET_CONTROLLERS,
    JobSetController,
    create_jobset,
    gang_size,
    jobset_finished,
    jobset_status,
    running_gang,
    training_jobset,
)
from tests.support.jobsystem import end_pod
from tests.support.karpenter import KarpenterCluster, node_gone, nodeclaims

NODE_LAUNCH_S = 120  # Karpenter launching nodes for a pending gang, KWOK starting its pods


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The plane (audited), Karpenter and the JobSet controller on it."""
    workdir = Path(tmp_path_factory.mktemp("jobset"))
    with ControlPlane(workdir, controlplane.testenv_bin(), audit=True) as plane:
        # Karpenter's own repair never acts here (no test reports its conditions): only
        # gpuguard's REPLACE takes a node.
        karpenter = KarpenterCluster(
            plane, workdir, repair_toleration="1h", controllers=JOBSET_CONTROLLERS
        )
        jobsets = JobSetController(plane, workdir)
        try:
            with load_api(plane.admin_kubeconfig) as api:
                karpenter.start(api, namespaces=("gpuguard",))
                jobsets.start(api)
                yield plane
        finally:
            jobsets.stop()
            karpenter.stop()


@pytest.fixture
def namespace(cluster: ControlPlane) -> Iterator[str]:
    name = f"train-{uuid.uuid4().hex[:6]}"
    with load_api(cluster.admin_kubeconfig) as api:
        api.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
    yield name


def start_gang(api: KubeApi, namespace: str) -> tuple[str, int, list[Json]]:
    jobset = training_jobset()
    size = gang_size(jobset)
    name = create_jobset(api, namespace, jobset)
    gang = wait_for(
        lambda: running_gang(api, namespace, name, size, 0), NODE_LAUNCH_S, "the gang running"
    )
    return name, size, gang


def restarted_gang(api: KubeApi, namespace: str, name: str, size: int) -> list[Json]:
    """The whole gang running again after one restart; fails at once if it ended instead."""
    outcome = wait_for(
        lambda: (
            running_gang(api, namespace, name, size, 1) or jobset_finished(api, namespace, name)
        ),
        NODE_LAUNCH_S,
        "the gang restarted and running",
    )
    assert isinstance(outcome, list), f"the JobSet ended: {jobset_status(api, namespace, name)}"
    return outcome


def nodes_of(pods: list[Json]) -> set[str]:
    return {str(pod["spec"]["nodeName"]) for pod in pods}


def complete(api: KubeApi, namespace: str, name: str, gang: list[Json]) -> Json:
    """Every member exits 0; the JobSet's status once it is Completed."""
    for pod in gang:
        end_pod(api, pod, 0)
    done = wait_for(lambda: jobset_finished(api, namespace, name), 60, "the JobSet finished")
    assert done == ("Completed", "AllJobsCompleted")
    return jobset_status(api, namespace, name)


def uncharged_restarts(status: Json) -> None:
    """One restart, none charged to maxRestarts (restartsCountTowardsMax is omitted at 0)."""
    assert status["restarts"] == 1
    assert status.get("restartsCountTowardsMax", 0) == 0


def claimed_nodes(api: KubeApi) -> set[str]:
    """The nodes of Karpenter's NodeClaims, those being terminated included."""
    return {(claim.get("status") or {}).get("nodeName", "") for claim in nodeclaims(api)}


def gpuguard_writes(cluster: ControlPlane, user: str, **where: Any) -> list[Write]:
    assert cluster.audit_log is not None
    return AuditLog(cluster.audit_log).writes(user=user, **where)


def test_replace_restarts_the_gang_on_healthy_nodes_and_the_replacement_uncharged(
    cluster: ControlPlane, namespace: str
) -> None:
    api = load_api(cluster.admin_kubeconfig)
    user = "gpuguard-replace"
    gpuguard = load_api(cluster.client_kubeconfig(user))
    name, size, first = start_gang(api, namespace)
    before = nodes_of(first)
    assert len(before) == size  # a node of 8 GPUs each
    sick = sorted(before)[0]
    set_health(api, sick)  # the agent's first report: healthy
    # Only REPLACE is left on the ladder: drain, then the NodeClaim to Karpenter.
    attempts = only_rung("REPLACE")
    controller = new_controller(gpuguard, "gpuguard", "karpenter", max_attempts=attempts)
    running = Running(controller.run)
    try:
        set_health(api, sick, gpu="False", action="REBOOT", codes=("XID_79",))
        second = restarted_gang(api, namespace, name, size)
        assert sick not in nodes_of(second)
        (replacement,) = nodes_of(second) - before  # the others are the gang's old nodes
        set_health(api, replacement)  # the new machine's agent: healthy
        # A machine Karpenter launched: its NodeClaim names the Node a moment after the Node
        # registers (the gang may already run on it).
        wait_for(lambda: replacement in claimed_nodes(api), 30, "the replacement's NodeClaim")
        # Karpenter's termination ends with the NodeClaim, seconds after the Node.
        wait_for(lambda: sick not in claimed_nodes(api), 60, "Karpenter terminating the node")
        assert node_gone(api, sick)
        wait_for(
            lambda: status_of(api, sick).get("resolution") == "Replaced",
            60,
            "the episode closed Replaced",
        )
        wait_for(
            lambda: status_of(api, sick).get("replacement") == replacement,
            30,
            "the episode naming the node that took over",
        )
        writes = gpuguard_writes(cluster, user, resource="nodeclaims")
        assert [(w.verb, w.succeeded) for w in writes] == [("delete", True)]  # once
        uncharged_restarts(jobset_status(api, namespace, name))
        uncharged_restarts(complete(api, namespace, name, second))
    finally:
        running.halt()
        gpuguard.close()
        api.close()


def test_kill_job_restarts_the_gang_off_the_quarantined_node_uncharged(
    cluster: ControlPlane, namespace: str
) -> None:
    api = load_api(cluster.admin_kubeconfig)
    user = "gpuguard-kill"
    gpuguard = load_api(cluster.client_kubeconfig(user))
    name, size, first = start_gang(api, namespace)
    sick = sorted(nodes_of(first))[0]
    set_health(api, sick)
    attempts = only_rung("KILL_JOB")
    controller = new_controller(gpuguard, "gpuguard", "karpenter", max_attempts=attempts)
    running = Running(controller.run)
    try:
        set_health(api, sick, gpu="False", action="KILL_JOB", codes=("XID_13",))
        second = restarted_gang(api, namespace, name, size)
        # The node stays quarantined while its fault stands: the gang went elsewhere.
        assert tainted(api, sick) and sick not in nodes_of(second)
        ours = gpuguard_writes(cluster, user, resource="pods")
        killed = {w.name for w in ours if w.verb == "delete" and w.succeeded}
        on_sick = [p for p in first if p["spec"]["nodeName"] == sick]
        assert killed == {p["metadata"]["name"] for p in on_sick}  # that pod, no other
        assert not evictions(ours)  # killed, not drained
        assert not gpuguard_writes(cluster, user, resource="nodeclaims")
        uncharged_restarts(jobset_status(api, namespace, name))
        set_health(api, sick)  # the job's fault went with its pod
        wait_for(lambda: not tainted(api, sick), 30, "the quarantine lifted")
        uncharged_restarts(complete(api, namespace, name, second))
    finally:
        running.halt()
        gpuguard.close()
        api.close()


def marked(api: KubeApi, pod: Json) -> bool:
    meta = pod["metadata"]
    current = api.get(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")
    return any(
        c["type"] == INFRASTRUCTURE_FAILURE_CONDITION and c["status"] == "True"
        for c in current["status"].get("conditions") or []
    )


def test_failures_gpuguard_attributes_restart_the_gang_uncharged(
    cluster: ControlPlane, namespace: str
) -> None:
    """A member on a node gpuguard finds at fault is marked while it runs and then fails
    with exit 1; after that restart a member's gpuguard run reads an NCCL error and exits
    76. Two gang restarts, neither charged to maxRestarts."""
    api = load_api(cluster.admin_kubeconfig)
    name, size, first = start_gang(api, namespace)
    sick = sorted(nodes_of(first))[0]
    set_health(api, sick)
    # A long tolerance: the node stays quarantined, never drained, so the member ends by
    # the fault itself.
    controller = new_controller(api, "gpuguard", "karpenter", tolerance_s=3600)
    running = Running(controller.run)
    try:
        network = {"network_action": "REBOOT", "network_codes": ("IB_LINK_DOWN",)}
        set_health(api, sick, network="False", **network)
        member = next(pod for pod in first if pod["spec"]["nodeName"] == sick)
        wait_for(lambda: marked(api, member), 30, "the member marked while it runs")
        end_pod(api, member, 1, "NCCL error: remote process exited or there was a network error")
        second = restarted_gang(api, namespace, name, size)
        assert sick not in nodes_of(second)  # quarantined: the gang went elsewhere
        uncharged_restarts(jobset_status(api, namespace, name))

        end_pod(api, second[0], EXIT_INFRASTRUCTURE)  # gpuguard run's own verdict
        third = wait_for(
            lambda: (
                running_gang(api, namespace, name, size, 2) or jobset_finished(api, namespace, name)
            ),
            NODE_LAUNCH_S,
            "the gang restarted again",
        )
        assert isinstance(third, list), jobset_status(api, namespace, name)
        status = jobset_status(api, namespace, name)
        assert status["restarts"] == 2 and not status.get("restartsCountTowardsMax")
        set_health(api, sick)
        status = complete(api, namespace, name, third)
        assert status["restarts"] == 2 and not status.get("restartsCountTowardsMax")
    finally:
        running.halt()
        api.close()


def test_an_application_error_fails_the_jobset(cluster: ControlPlane, namespace: str) -> None:
    """The script exits 1: the applicationError rule, FailJobSet, no restart at all."""
    api = load_api(cluster.admin_kubeconfig)
    try:
        name, _, gang = start_gang(api, namespace)
        end_pod(api, gang[-1], 1)
        failed = wait_for(lambda: jobset_finished(api, namespace, name), 60, "the JobSet failed")
        assert failed == ("Failed", "FailJobSetFailurePolicyAction")
        status = jobset_status(api, namespace, name)
        assert not status.get("restarts") and not status.get("restartsCountTowardsMax")
    finally:
        api.close()
