"""The controller's service-level metrics on the real API server: GPU-node time in and out
of service as a node is quarantined, and GPU Jobs counted once as they finish (the Job
controller's part, the status conditions, is written by the test)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuguard.controller.loop import Controller
from gpuguard.controller.slis import parse_selector
from gpuguard.kube.rest import KubeApi
from gpuguard.remediation.policy import Policy
from tests.support.cluster import make_node, set_health, stamp, wait_for
from tests.support.controllers import FAST_POLICY, POOL, Running, node_name, reconciled, tainted
from tests.support.controlplane import ControlPlane

FLEET = "gpuguard.test/fleet"


class Replica(Running):
    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        super().__init__(controller.run)

    def sample(self, name: str, **labels: str) -> float | None:
        return self.controller.metrics.registry.get_sample_value(name, labels)


@pytest.fixture
def fleet() -> str:
    """This test's GPU-node label value: nodes other tests leave behind never count."""
    return uuid.uuid4().hex[:8]


@pytest.fixture
def start_controller(api: KubeApi, namespace: str, fleet: str) -> Iterator[Callable[[], Replica]]:
    def start() -> Replica:
        controller = Controller(
            api,
            Policy(**{**FAST_POLICY, "tolerance_s": 300}),  # quarantine only, no repair
            "karpenter",
            namespace=namespace,
            identity=f"test-{uuid.uuid4().hex[:6]}",
            gpu_nodes=parse_selector(f"{FLEET}={fleet}"),
            resync_s=0.2,
            lease_s=3,
            renew_s=1,
        )
        started.append(Replica(controller))
        return started[-1]

    started: list[Replica] = []
    yield start
    for running in started:
        running.halt()


def gpu_node(api: KubeApi, fleet: str) -> str:
    name = node_name()
    make_node(api, name, labels={POOL: "h100", FLEET: fleet})
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
    ready |= {"lastHeartbeatTime": stamp(), "lastTransitionTime": stamp()}
    api.patch(f"/api/v1/nodes/{name}/status", {"status": {"conditions": [ready]}}, "strategic")
    set_health(api, name)
    return name


def test_a_quarantined_node_stops_adding_in_service_seconds(api, fleet, start_controller):
    gpu_node(api, fleet)
    sick = gpu_node(api, fleet)
    make_node(api, node_name(), labels={POOL: "h100"})  # not a GPU node of this fleet
    running = start_controller()
    nodes = "gpuguard_gpu_nodes"
    wait_for(lambda: running.sample(nodes, state="in_service") == 2, what="two nodes in service")
    assert running.sample(nodes, state="out_of_service") == 0

    set_health(api, sick, gpu="False", action="RESET_GPU", codes=("NVLINK_DOWN",))
    wait_for(lambda: tainted(api, sick), what="quarantine")
    wait_for(lambda: running.sample(nodes, state="in_service") == 1, what="one node out")
    assert running.sample(nodes, state="out_of_service") == 1

    def seconds() -> tuple[float, float, float, float]:
        """In and out of service, and the moments just before and after the scrape."""
        before = time.monotonic()
        up = running.sample("gpuguard_gpu_node_seconds_total", state="in_service")
        down = running.sample("gpuguard_gpu_node_seconds_total", state="out_of_service")
        assert up is not None and down is not None
        return up, down, before, time.monotonic()

    up1, down1, before1, after1 = seconds()
    time.sleep(1.0)  # a rate needs real time: the SLIs run on the controller's own clock
    up2, down2, before2, after2 = seconds()
    least, most = before2 - after1, after2 - before1
    # One node in service and one out: both grow at one second per second, not two and zero.
    assert least <= up2 - up1 <= most
    assert least <= down2 - down1 <= most


def make_job(api: KubeApi, namespace: str, *, gpus: int = 1) -> str:
    name = f"job-{uuid.uuid4().hex[:6]}"
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    container = {"name": "main", "image": "busybox", "resources": resources}
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
            "backoffLimit": 0,
        },
    }
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", body)
    return name


def finish(api: KubeApi, namespace: str, name: str, outcome: str) -> None:
    """Write the status the Job controller writes at the end (no Job controller runs here)."""
    now = stamp()
    first, last = (
        ("SuccessCriteriaMet", "Complete") if outcome == "ok" else ("FailureTarget", "Failed")
    )
    conditions = [
        {"type": kind, "status": "True", "lastProbeTime": now, "lastTransitionTime": now}
        for kind in (first, last)
    ]
    status: dict[str, Any] = {"startTime": now, "conditions": conditions}
    if outcome == "ok":
        status |= {"succeeded": 1, "completionTime": now}
    else:
        status |= {"failed": 1}
    api.patch(f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}/status", {"status": status})


def watch_broken(caplog: pytest.LogCaptureFixture) -> bool:
    return any(
        "watch of" in r.getMessage() and "jobs broken" in r.getMessage() for r in caplog.records
    )


def jobs_finished(running: Replica) -> tuple[float | None, float | None]:
    return (
        running.sample("gpuguard_jobs_finished_total", outcome="succeeded"),
        running.sample("gpuguard_jobs_finished_total", outcome="failed"),
    )


def test_gpu_jobs_are_counted_once_as_they_finish(
    api, namespace, control_plane: ControlPlane, start_controller, caplog
):
    early = make_job(api, namespace)
    finish(api, namespace, early, "ok")
    running = start_controller()
    # Finished before the controller started: counted once, by this process.
    wait_for(lambda: jobs_finished(running) == (1, 0), what="the earlier Job counted")

    ok, bad, cpu, pending = (make_job(api, namespace, gpus=g) for g in (1, 8, 0, 1))
    finish(api, namespace, ok, "ok")
    finish(api, namespace, bad, "failed")
    finish(api, namespace, cpu, "ok")  # no GPU: not one of the jobs the SLI is about
    wait_for(lambda: jobs_finished(running) == (2, 1), what="two more Jobs counted")
    # A finished Job changing again (a label, say) is not a second finish.
    api.patch(
        f"/apis/batch/v1/namespaces/{namespace}/jobs/{ok}", {"metadata": {"labels": {"x": "y"}}}
    )

    # The API server goes away: the watch breaks and resumes (or lists again).
    control_plane.stop_apiserver()
    try:
        with caplog.at_level(logging.WARNING, logger="gpuguard.controller"):
            wait_for(lambda: watch_broken(caplog), 10, "the broken watch")
    finally:
        control_plane.start_apiserver()
    finish(api, namespace, pending, "failed")
    wait_for(lambda: jobs_finished(running) == (2, 2), 30, "the Job finished after the outage")
    reconciled(running.controller)  # a while later: nothing else arrives
    assert jobs_finished(running) == (2, 2)

    # A new controller process counts every finished GPU Job still there, once.
    running.halt()
    second = start_controller()
    wait_for(lambda: jobs_finished(second) == (2, 2), 30, "the new process's count")
