"""A deferred repair (drain and reset) end to end on the real API server: the real agent
reads a pending row remap from its GPU backend (a bundle of real nvidia-smi output), the
real controller taints the node at once without touching the pod running on the GPU, the
scheduler admits no new pod, and the GPU is reset when the pod ends (or, when it never
ends, once ``drain_and_reset.max_wait_s`` has passed: drained first). KWOK is the kubelet.
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuguard.agent.daemon import Agent
from gpuguard.agent.repair import BundleRepair, RepairExecutor
from gpuguard.checks.registry import default_checks
from gpuguard.config import Config
from gpuguard.contract.keys import TAINT_KEY
from gpuguard.kernel_log.followers import FileFollower
from gpuguard.kube.client import NodeApi
from gpuguard.kube.rest import Json, KubeApi, load_api
from gpuguard.sources import BundleSources
from tests.support.cluster import wait_for
from tests.support.controllers import (
    POOL,
    Running,
    node,
    remediations,
    repairs,
    status_of,
    tainted,
)
from tests.support.controlplane import ControlPlane
from tests.support.jobsystem import JobSystem, end_pod, make_kwok_node

HEALTHY = Path(__file__).resolve().parents[2] / "examples" / "healthy-h100"
GPU = "0000:00:09.0"  # the bus id in the bundle's nvidia-smi output
REMAP_PENDING = re.compile(r"(Remapped Rows\n(?:.*\n)*?\s+Pending\s+: )No")


class ResetClearsRemap(BundleRepair):
    """The fixture GPU's reset: records it, and the pending remap takes effect (the
    bundle's nvidia-smi output turns healthy again)."""

    def __init__(self, bundle: Path) -> None:
        super().__init__(bundle / "repairs.log")
        self.bundle = bundle

    def reset_gpus(self, gpus: tuple[str, ...]) -> tuple[bool, str]:
        shutil.copy(HEALTHY / "nvidia-smi.txt", self.bundle / "nvidia-smi.txt")
        return super().reset_gpus(gpus)


@pytest.fixture
def start_agent(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """The real agent and its repair executor for a node whose GPU has a row remap pending."""
    running: list[Running] = []

    def start(name: str) -> Path:
        bundle = tmp_path / name
        shutil.copytree(HEALTHY, bundle)
        (bundle / "boot_id").write_text(f"boot-{uuid.uuid4()}\n")
        smi = bundle / "nvidia-smi.txt"
        text, found = REMAP_PENDING.subn(r"\1Yes", smi.read_text(), count=1)
        assert found == 1
        smi.write_text(text)
        config = Config(
            check_interval_s=0.5, heartbeat_interval_s=1, metrics_port=0, expected_gpus=1
        )
        agent = Agent(
            config,
            BundleSources(bundle),
            default_checks(),
            FileFollower(bundle / "kmsg.log", 0.05),
            name,
            NodeApi(load_api(control_plane.admin_kubeconfig)),
        )
        executor = RepairExecutor(
            load_api(control_plane.admin_kubeconfig),
            name,
            ResetClearsRemap(bundle),
            agent.after_repair,
        )
        running.extend([Running(agent.run), Running(executor.run)])
        return bundle

    yield start
    for item in running:
        item.halt()


def gpu_pod(api: KubeApi, namespace: str, pool: str) -> Json:
    name = f"train-{uuid.uuid4().hex[:6]}"
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {POOL: pool},
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": "trainer",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }
    return api.create(f"/api/v1/namespaces/{namespace}/pods", body)


def pod_now(api: KubeApi, pod: Json) -> Json | None:
    meta = pod["metadata"]
    found = api.list(
        f"/api/v1/namespaces/{meta['namespace']}/pods",
        field_selector=f"metadata.name={meta['name']}",
    ).items
    return found[0] if found else None


def phase(api: KubeApi, pod: Json) -> str | None:
    current = pod_now(api, pod)
    return (current.get("status") or {}).get("phase") if current else None


def unschedulable(api: KubeApi, pod: Json) -> bool:
    current = pod_now(api, pod) or {}
    conditions = (current.get("status") or {}).get("conditions") or []
    return any(
        c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions
    )


def steps(api: KubeApi, name: str) -> list[str]:
    return [step["message"] for step in status_of(api, name).get("steps") or []]


def step_saying(api: KubeApi, name: str, text: str) -> str | None:
    found = remediations(api, name)
    messages = [s["message"] for r in found for s in (r.get("status") or {}).get("steps") or []]
    return next((m for m in messages if text in m), None)


def closed(api: KubeApi, name: str) -> dict[str, Any] | None:
    status = status_of(api, name)
    return status if status.get("phase") == "Closed" else None


def sick_node_running_a_pod(
    api: KubeApi, namespace: str, start_agent: Callable[[str], Path]
) -> tuple[str, str, Json, Path]:
    """A KWOK node with a GPU pod running, whose agent then reads a pending row remap."""
    tag = uuid.uuid4().hex[:6]
    name, pool = f"kwok-remap-{tag}", f"remap-{tag}"
    make_kwok_node(api, name, {POOL: pool}, gpus=1)
    pod = gpu_pod(api, namespace, pool)
    wait_for(lambda: phase(api, pod) == "Running", 30, "the GPU pod running")
    bundle = start_agent(name)
    return name, pool, pod, bundle


def test_running_work_finishes_then_the_gpu_is_reset(
    api, job_system: JobSystem, namespace, start_agent, start_controller
):
    start_controller(drain_and_reset={"max_wait_s": 600})
    name, pool, pod, bundle = sick_node_running_a_pod(api, namespace, start_agent)

    wait_for(lambda: tainted(api, name), 30, "the node tainted NoSchedule")
    taints = node(api, name)["spec"]["taints"]
    assert {"key": TAINT_KEY, "effect": "NoSchedule"}.items() <= next(
        t for t in taints if t["key"] == TAINT_KEY
    ).items()
    waiting = wait_for(
        lambda: step_saying(api, name, "deferred repair: waiting for 1 running pods"),
        10,
        "the episode waiting for the pod",
    )
    assert GPU in waiting
    late = gpu_pod(api, namespace, pool)
    wait_for(lambda: unschedulable(api, late), 30, "the new pod refused by the scheduler")
    current = pod_now(api, pod)
    assert current is not None and phase(api, pod) == "Running"
    assert not current["metadata"].get("deletionTimestamp"), "the running pod was evicted"
    assert not repairs(bundle)

    end_pod(api, pod, 0)  # the job finishes on its own
    assert wait_for(lambda: repairs(bundle), 30, "the GPU reset") == [f"reset {GPU}"]
    status = wait_for(lambda: closed(api, name), 30, "the episode closed")
    assert status["resolution"] == "Repaired"
    messages = steps(api, name)
    started = [m for m in messages if m.startswith("running work finished: starting RESET_GPU")]
    assert len(started) == 1 and f"RESET_GPU attempt 1: draining {GPU}" in started[0]
    assert phase(api, pod) == "Succeeded", "the finished pod was left as it ended"
    wait_for(lambda: not tainted(api, name), 10, "the taint removed")
    wait_for(lambda: phase(api, late) == "Running", 30, "the waiting pod admitted after repair")


def test_work_that_never_ends_is_drained_at_max_wait_then_reset(
    api, job_system: JobSystem, namespace, start_agent, start_controller
):
    start_controller(drain_and_reset={"max_wait_s": 3}, drain_timeout_s=30)
    name, _, pod, bundle = sick_node_running_a_pod(api, namespace, start_agent)

    wait_for(lambda: tainted(api, name), 30, "the node tainted NoSchedule")
    wait_for(
        lambda: step_saying(api, name, "deferred repair: waiting for 1 running pods"),
        10,
        "the episode waiting for the pod",
    )
    drained = wait_for(
        lambda: step_saying(api, name, "waited max_wait_s (3s) for 1 running pods: draining"),
        30,
        "the wait given up at max_wait_s",
    )
    assert f"RESET_GPU attempt 1: draining {GPU}" in drained
    assert wait_for(lambda: repairs(bundle), 30, "the GPU reset") == [f"reset {GPU}"]
    assert pod_now(api, pod) is None or phase(api, pod) != "Running", "reset under a running pod"
    status = wait_for(lambda: closed(api, name), 30, "the episode closed")
    assert status["resolution"] == "Repaired"
    wait_for(lambda: not tainted(api, name), 10, "the taint removed")
