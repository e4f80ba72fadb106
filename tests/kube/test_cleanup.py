"""``gpuguard cleanup`` (the chart's uninstall hook) on the real API server: it lists by
default, and with ``--apply`` takes off exactly what gpuguard put on a Node."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from gpuguard.contract.conditions import POSITION_CONDITION
from gpuguard.contract.keys import (
    CORDONED_BY_US_ANNOTATION,
    MEMORY_ANNOTATION,
    REPORT_ANNOTATION,
    VERIFY_REQUEST_ANNOTATION,
)
from gpuguard.kube.rest import KubeApi
from tests.support.cluster import make_node, make_pod, stamp
from tests.support.controllers import node, node_name
from tests.support.controlplane import ControlPlane

FOREIGN_TAINT = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
# The agent's, and the controller's own (a position at fault).
OURS = ["GpuguardGPUHealthy", "GpuguardNetworkHealthy", "GpuguardKernelHealthy", POSITION_CONDITION]


def marked(api: KubeApi) -> str:
    """A Node as gpuguard leaves it mid-episode, beside what others wrote on it."""
    name = node_name()
    make_node(
        api,
        name,
        annotations={
            REPORT_ANNOTATION: "{}",
            MEMORY_ANNOTATION: "{}",
            VERIFY_REQUEST_ANNOTATION: stamp(),
            CORDONED_BY_US_ANNOTATION: "true",
            "example.com/keep": "yes",
        },
        unschedulable=True,
    )
    api.patch(
        f"/api/v1/nodes/{name}",
        {
            "spec": {
                "taints": [FOREIGN_TAINT, {"key": "gpuguard.io/unhealthy", "effect": "NoSchedule"}]
            }
        },
    )
    kinds = [*OURS, "AcceleratedHardwareReady", "Ready"]
    conditions = [
        {"type": kind, "status": "False", "reason": "Test", "lastTransitionTime": stamp()}
        for kind in kinds
    ]
    api.patch(f"/api/v1/nodes/{name}/status", {"status": {"conditions": conditions}}, "strategic")
    return name


def cleanup(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gpuguard.cli", "cleanup"]
    command += ["--kubeconfig", str(plane.admin_kubeconfig), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def state(api: KubeApi, name: str) -> dict[str, Any]:
    found = node(api, name)
    return {
        "conditions": sorted(c["type"] for c in found["status"].get("conditions") or []),
        "annotations": sorted(found["metadata"].get("annotations") or {}),
        "taints": [t["key"] for t in found["spec"].get("taints") or []],
        "unschedulable": bool(found["spec"].get("unschedulable")),
    }


def test_a_dry_run_lists_what_it_would_remove_and_changes_nothing(api, control_plane):
    name = marked(api)
    before = state(api, name)
    done = cleanup(control_plane, "--node", name)
    assert done.returncode == 0, done.stderr
    assert f"would remove {name}: condition GpuguardGPUHealthy" in done.stdout
    assert "our cordon" in done.stdout and "dry run" in done.stdout
    assert state(api, name) == before


@pytest.mark.parametrize(
    ("profile", "kept"),
    [("gpuguard", ["AcceleratedHardwareReady", "Ready"]), ("eks", ["Ready"])],
)
def test_apply_takes_off_what_gpuguard_wrote_and_nothing_else(api, control_plane, profile, kept):
    name = marked(api)
    foreign = node_name()  # cordoned by a person, tainted by another controller
    make_node(api, foreign, unschedulable=True)
    api.patch(f"/api/v1/nodes/{foreign}", {"spec": {"taints": [FOREIGN_TAINT]}})
    untouched = state(api, foreign)
    for target in (name, foreign):
        done = cleanup(control_plane, "--apply", "--profile", profile, "--node", target)
        assert done.returncode == 0, done.stderr
    assert state(api, name) == {
        "conditions": kept,  # an EKS name is gpuguard's only under the eks profile
        "annotations": ["example.com/keep"],
        "taints": ["nvidia.com/gpu"],
        "unschedulable": False,  # our cordon, by our marker
    }
    assert state(api, foreign) == untouched


def test_it_waits_for_the_agents_to_be_gone_first(api, control_plane, namespace):
    name = node_name()
    make_node(api, name)
    make_pod(api, namespace, "agent", name, labels={"app.kubernetes.io/name": "gpuguard"})
    selector = "app.kubernetes.io/name=gpuguard"
    waited = cleanup(
        control_plane,
        "--apply",
        "--node",
        name,
        "--wait-for-pods",
        selector,
        "--namespace",
        namespace,
        "--wait-s",
        "1",
    )
    assert waited.returncode == 1 and "still run after 1s" in waited.stderr
    api.delete(f"/api/v1/namespaces/{namespace}/pods/agent", {"gracePeriodSeconds": 0})
    args = ["--apply", "--node", name, "--wait-for-pods", selector, "--namespace", namespace]
    done = cleanup(control_plane, *args)
    assert done.returncode == 0, done.stderr


def test_a_node_it_may_not_read_is_one_line_and_exit_1(control_plane):
    unknown = node_name()  # no such Node
    done = cleanup(control_plane, "--apply", "--node", unknown)
    assert done.returncode == 1
    assert done.stderr.strip().startswith("gpuguard cleanup: cannot read the Nodes: 404")
    assert "Traceback" not in done.stderr
