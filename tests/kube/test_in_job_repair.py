"""A job's own verdict, end to end on the real API server: a rank of a running job (real
NumPy rank processes with gpuguard.training's JobMonitor, standing for the Job's pod) finds
its GPU slow and writes the verdict on its node; the real agent reads it, the real
controller taints the node at once and leaves the job running until it has saved its next
checkpoint, then drains and replaces the node; the Job controller restarts the pod on a
healthy node and the job completes, no failure charged. A replica mismatch does not wait.
KWOK is the kubelet; the Job is examples/jobs/job.yaml.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from gpuguard.agent.daemon import Agent
from gpuguard.checks.in_job.verdict_check import InJobCheck
from gpuguard.checks.registry import default_checks
from gpuguard.config import Config
from gpuguard.controller.loop import Controller
from gpuguard.kernel_log.followers import FileFollower
from gpuguard.kube.client import NodeApi
from gpuguard.kube.rest import KubeApi, KubeNotFound, load_api
from gpuguard.sources import BundleSources
from gpuguard.training.verdicts import VerdictKind, read_verdicts
from tests.support.cluster import wait_for
from tests.support.controllers import Running, new_controller, remediations, status_of, tainted
from tests.support.controlplane import ControlPlane
from tests.support.in_job_job import start_ranks, stop_ranks
from tests.support.jobsystem import (
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
        # No second measurement of slowness here (the agent runs no deep suite that could
        # find it): confirming it is tests/kube/test_verify_gate.py's.
        started = new_controller(
            api,
            jobs,
            provider="delete-node",
            drain_and_reset={"max_wait_s": 600},
            confirm={"enabled": False},
        )
        running.append(Running(started.run))
        return started

    yield agent, controller
    for item in running:
        item.halt()


def job_ranks(directory: Path, job: str, sick: str, tmp_path: Path, *fault: str):
    """Four ranks of the job (the judge needs three); rank 1 runs on the sick node's GPU,
    the others elsewhere. All write, if named, into the sick node's directory: only rank 1
    ever is."""

    def identity(rank: int) -> dict[str, str]:
        node, gpu = (sick, GPU) if rank == 1 else (f"elsewhere-{rank}", f"0000:{rank:02x}:00.0")
        return {
            "NODE_NAME": node,
            "GPUGUARD_GPU_PCI_BUS_ID": gpu,
            "GPUGUARD_JOB": job,
            "GPUGUARD_IN_JOB_DIR": str(directory),
        }

    reports = tmp_path / "reports"
    reports.mkdir()
    # Far more steps than the test needs: it stops the ranks when it is done.
    return start_ranks(4, 100_000, reports, identity, "--step-s=0.04", *fault)


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
    api, jobs, start, tmp_path
):
    start_agent, start_controller = start
    name, first, healthy = start_on_sick_node(api, jobs, training_job())
    sick = first["spec"]["nodeName"]
    directory = start_agent(sick)
    start_controller()
    checkpoint = tmp_path / "checkpoint-saved"
    slow = (
        "--slow-rank=1",
        "--slow-from=10",
        "--slow-factor=1.3",
        f"--checkpoint-file={checkpoint}",
    )
    ranks = job_ranks(directory, f"{jobs}/{name}", sick, tmp_path, *slow)
    try:
        wait_for(lambda: tainted(api, sick), 60, "the node tainted once rank 1 is named")
        waiting = wait_for(
            lambda: step_saying(api, sick, "deferred repair: waiting for 1 running pods"),
            30,
            "the repair waiting for the job",
        )
        assert GPU in waiting and "IN_JOB_FAIL_SLOW" in waiting
        (verdict,) = read_verdicts(directory)[0]
        assert (verdict.kind, verdict.rank, verdict.node) == (VerdictKind.FAIL_SLOW, 1, sick)
        assert verdict.checkpointed_at is None and verdict.ratio >= 1.1
        pod = api.get(f"/api/v1/namespaces/{jobs}/pods/{first['metadata']['name']}")
        assert pod["status"]["phase"] == "Running" and not pod["metadata"].get("deletionTimestamp")

        checkpoint.touch()  # the job saves its checkpoint; rank 1's verdict says so
        second = resumed(api, jobs, name, first)
        assert second["spec"]["nodeName"] == healthy
        assert read_verdicts(directory)[0][0].checkpointed_at is not None
        wait_for(lambda: replaced(api, sick), 60, "the slow GPU's node replaced")
        assert step_saying(api, sick, "REPLACE attempt 1")
        assert not job_status(api, jobs, name).get("failed")
    finally:
        stop_ranks(ranks)

    end_pod(api, second, 0)
    assert wait_for(lambda: finished_as(api, jobs, name), 30, "the job finished")[0] == "Complete"
    assert not job_status(api, jobs, name).get("failed")


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        (("--corrupt-rank=1", "--corrupt-at=20"), VerdictKind.REPLICA_MISMATCH),
        (
            ("--miscompute-rank=1", "--miscompute-from=20", "--compute-interval=25"),
            VerdictKind.COMPUTE_MISMATCH,
        ),
    ],
    ids=["flipped-parameter", "wrong-gradients"],
)
def test_wrong_results_are_drained_at_once(api, jobs, start, tmp_path, fault, kind):
    start_agent, start_controller = start
    name, first, healthy = start_on_sick_node(api, jobs, training_job())
    sick = first["spec"]["nodeName"]
    directory = start_agent(sick)
    start_controller()
    ranks = job_ranks(directory, f"{jobs}/{name}", sick, tmp_path, *fault)
    try:
        try:
            second = resumed(api, jobs, name, first)
        except AssertionError as stuck:  # seen once in a full run: say which side stopped
            seen = read_verdicts(directory)
            raise AssertionError(f"{stuck}; verdicts {seen}; {remediations(api, sick)}") from None
        (verdict,) = read_verdicts(directory)[0]
        assert (verdict.kind, verdict.rank) == (kind, 1)
    finally:
        stop_ranks(ranks)
    assert second["spec"]["nodeName"] == healthy
    wait_for(lambda: replaced(api, sick), 60, "the corrupting GPU's node replaced")
    assert step_saying(api, sick, "deferred repair") is None
    assert not job_status(api, jobs, name).get("failed")
