"""Crash safety and leader failover, with real `gpuguard controller` processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuguard.agent.repair import BundleRepair, RepairExecutor
from gpuguard.kube.remediations import NODE_REMEDIATIONS
from gpuguard.kube.rest import KubeApi
from tests.support.cluster import (
    make_node,
    pod_held_by_a_budget,
    set_health,
    wait_for,
)
from tests.support.controllers import PROCESS_POLICY
from tests.support.controlplane import ControlPlane


@pytest.fixture
def controllers(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> Iterator[Callable[[str], subprocess.Popen[str]]]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(PROCESS_POLICY))
    started: list[subprocess.Popen[str]] = []

    def start(identity: str) -> subprocess.Popen[str]:
        log = (tmp_path / f"{identity}.log").open("w")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuguard.cli",
                "controller",
                "--kubeconfig",
                str(control_plane.admin_kubeconfig),
                "--namespace",
                namespace,
                "--identity",
                identity,
                "--provider",
                "delete-node",
                "--policy",
                str(policy),
                "--metrics-port",
                "0",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def episode(api: KubeApi, node: str) -> dict[str, Any]:
    (found,) = [
        r for r in api.list(NODE_REMEDIATIONS.path()).items if r["spec"]["nodeName"] == node
    ]
    return dict(found.get("status") or {})


def lease_holder(api: KubeApi, namespace: str) -> str:
    lease = api.get(
        f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/gpuguard-controller"
    )
    return str(lease["spec"].get("holderIdentity") or "")


def test_controller_killed_between_drain_and_action_finishes_the_episode_once(
    api, namespace, controllers, tmp_path
):
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    make_node(api, node, labels={"karpenter.sh/nodepool": "h100"})
    budget = pod_held_by_a_budget(api, namespace, node, "training")  # the drain waits
    repairs = tmp_path / "repairs.log"
    stop = threading.Event()
    executor = RepairExecutor(api, node, BundleRepair(repairs), lambda *_: None)
    threading.Thread(target=executor.run, args=(stop,), daemon=True).start()
    try:
        set_health(api, node)
        first = controllers("first")
        set_health(api, node, gpu="False", action="REBOOT", codes=("NVLINK_DOWN",))
        wait_for(lambda: episode(api, node).get("phase") == "Draining", 60, "draining")
        os.kill(first.pid, signal.SIGKILL)  # no clean shutdown, no Lease release
        first.wait(10)
        api.delete(budget)

        controllers("second")  # takes the Lease once the dead leader's expires
        wait_for(lambda: episode(api, node).get("phase") == "Verifying", 60, "the reboot done")
        set_health(api, node)  # the agent's fresh report after the reboot
        status = wait_for(lambda: (s := episode(api, node)).get("resolution") and s, 30, "closed")
    finally:
        stop.set()
    assert status["resolution"] == "Repaired"
    assert status["attempts"] == {"REBOOT": 1}
    assert repairs.read_text() == "reboot\n"  # performed exactly once
    acting = [s for s in status["steps"] if s["phase"] == "Acting"]
    assert len(acting) == 1, status["steps"]
    # Our cordon is lifted right after the close is recorded (write-ahead).
    wait_for(
        lambda: not api.get(f"/api/v1/nodes/{node}")["spec"].get("unschedulable"), 10, "uncordon"
    )


def test_leader_failover_within_about_fifteen_seconds(api, namespace, controllers):
    one, two = controllers("one"), controllers("two")
    leader = wait_for(lambda: lease_holder(api, namespace), 30, "a leader")
    dead, survivor = (one, "two") if leader == "one" else (two, "one")
    os.kill(dead.pid, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: lease_holder(api, namespace) == survivor, 30, "failover")
    assert time.monotonic() - killed < 20

    node = f"gpu-{uuid.uuid4().hex[:8]}"
    make_node(api, node, labels={"karpenter.sh/nodepool": "h100"})
    set_health(api, node)
    set_health(api, node, gpu="False", action="NONE", codes=("CHECK_TIMED_OUT",))
    wait_for(
        lambda: any(
            t["key"] == "gpuguard.io/unhealthy"
            for t in api.get(f"/api/v1/nodes/{node}")["spec"].get("taints") or []
        ),
        10,
        "the new leader quarantines",
    )
