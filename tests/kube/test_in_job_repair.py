"""A job's own verdict, end to end on the real API server: a rank of a running Job finds
its GPU slow and writes the verdict on its node; the real agent reads it, the real
controller taints the node at once and leaves the job running until it has saved its next
checkpoint, then drains and replaces the node; the Job controller restarts the pod on a
healthy node and the job completes, no failure charged. A replica mismatch does not wait.
KWOK is the kubelet; the Job is examples/jobs/job.yaml.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuguard.agent.daemon import Agent
from gpuguard.agent.kernel_log.followers import FileFollower
from gpuguard.checks.in_job.verdict_check import InJobCheck
from gpuguard.checks.registry import default_checks
from gpuguard.config import Config
from gpuguard.controller.loop import Controller
from gpuguard.kube.client import NodeApi
from gpuguard.kube.rest import KubeApi, KubeNotFound, load_api
from gpuguard.sources import BundleSources
from gpuguard.training.verdicts import Verdict, VerdictKind, write_verdict
from tests.support.cluster import scratch_namespace, wait_for
from tests.support.controllers import Running, new_controller, remediations, status_of, tainted
from tests.support.controlplane import ControlPlane
from tests.support.jobsystem import (
    JobSystem,
    end_pod,
    finished_as,
    job_status,
    resumed,
    start_on_sick_node,
    training_job,
)

HEALTHY = Path(__file__).resolve().parents[2] / "examples" / "healthy-h100"
GPU = "0000:00:09.0"  # the bundle's GPU, as the rank on it names it


@pytest.fixture
def jobs(api: KubeApi, job_system: JobSystem) -> Iterator[str]:
    job_system.check_running()
    with scratch_namespace(api) as name:
        yield name


@pytest.fixture
def start(control_plane: ControlPlane, api: KubeApi, jobs: str, tmp_path: Path):
    """The real agent of a node (a healthy bundle whose in-job/ the job writes to), and
    the controller, replacing nodes by deleting them."""
    running: list[Running] = []

    def agent(name: str) -> Path:
        bundle = tmp_path / name
        shutil.copytree(HEALTHY, bundle)
        (bundle / "boot_id").write_text(f"boot-{uuid.uuid4()}\n")
        (bundle / "in-job").mkdir()
        checks = [InJobCheck(node=name) if c.name == "in-job" else c for c in default_checks()]
        config = Config(check_interval_s=0.5, heartbeat_interval_s=1, metrics_port=0)
        running.append(
            Running(
                Agent(
                    config,
                    BundleSources(bundle),
                    checks,
                    FileFollower(bundle / "kmsg.log", 0.05),
                    name,
                    NodeApi(load_api(control_plane.admin_kubeconfig)),
                ).run
            )
        )
        return bundle / "in-job"

    def controller() -> Controller:
        started = new_controller(
            api, jobs, provider="delete-node", drain_and_reset={"max_wait_s": 600}
        )
        running.append(Running(started.run))
        return started

    yield agent, controller
    for item in running:
        item.halt()


def verdict(kind: VerdictKind, job: str, node: str) -> Verdict:
    now = time.time()
    return Verdict(
        kind=kind,
        job=job,
        rank=3,
        world_size=8,
        node=node,
        gpu=GPU,
        since=now - 90,
        written_at=now,
        ratio=1.16 if kind is VerdictKind.FAIL_SLOW else 0.0,
        steps=(1200, 1260),
        evidence="compute median 0.348 s vs peers' 0.300 s for 3 windows",
    )


def step_saying(api: KubeApi, node: str, text: str) -> str | None:
    messages = [
        s["message"]
        for r in remediations(api, node)
        for s in (r.get("status") or {}).get("steps") or []
    ]
    return next((m for m in messages if text in m), None)


def node_exists(api: KubeApi, node: str) -> bool:
    try:
        api.get(f"/api/v1/nodes/{node}")
    except KubeNotFound:
        return False
    return True


def replaced(api: KubeApi, node: str) -> bool:
    return not node_exists(api, node) and status_of(api, node).get("resolution") == "Replaced"


def test_a_slow_gpu_waits_for_the_checkpoint_then_the_job_resumes_on_a_healthy_node(
    api, jobs, start: tuple[Callable[[str], Path], Callable[[], Controller]]
):
    start_agent, start_controller = start
    name, first, healthy = start_on_sick_node(api, jobs, training_job())
    sick = first["spec"]["nodeName"]
    directory = start_agent(sick)
    start_controller()
    slow = verdict(VerdictKind.FAIL_SLOW, f"{jobs}/{name}", sick)
    write_verdict(directory, slow)

    wait_for(lambda: tainted(api, sick), 30, "the node tainted at once")
    waiting = wait_for(
        lambda: step_saying(api, sick, "deferred repair: waiting for 1 running pods"),
        30,
        "the repair waiting for the job",
    )
    assert GPU in waiting and "IN_JOB_FAIL_SLOW" in waiting
    pod = api.get(f"/api/v1/namespaces/{jobs}/pods/{first['metadata']['name']}")
    assert pod["status"]["phase"] == "Running" and not pod["metadata"].get("deletionTimestamp")
    assert node_exists(api, sick)

    # The job saves its checkpoint; the rank on the slow GPU says so in its verdict.
    write_verdict(directory, dataclasses.replace(slow, checkpointed_at=time.time()))
    second = resumed(api, jobs, name, first)
    assert second["spec"]["nodeName"] == healthy
    wait_for(lambda: replaced(api, sick), 60, "the slow GPU's node replaced")
    assert step_saying(api, sick, "REPLACE attempt 1")
    assert not job_status(api, jobs, name).get("failed")

    end_pod(api, second, 0)
    assert wait_for(lambda: finished_as(api, jobs, name), 30, "the job finished")[0] == "Complete"
    assert not job_status(api, jobs, name).get("failed")


def test_a_replica_mismatch_is_drained_at_once(api, jobs, start):
    start_agent, start_controller = start
    name, first, healthy = start_on_sick_node(api, jobs, training_job())
    sick = first["spec"]["nodeName"]
    directory = start_agent(sick)
    start_controller()
    write_verdict(directory, verdict(VerdictKind.REPLICA_MISMATCH, f"{jobs}/{name}", sick))

    second = resumed(api, jobs, name, first)
    assert second["spec"]["nodeName"] == healthy
    wait_for(lambda: replaced(api, sick), 60, "the corrupting GPU's node replaced")
    assert step_saying(api, sick, "deferred repair") is None
    assert not job_status(api, jobs, name).get("failed")
