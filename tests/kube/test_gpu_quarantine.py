"""Per-GPU quarantine with DRA device taints, against the real scheduler and the real
device-taint-eviction-controller: a plane of its own, with DeviceTaintRule served
(resource.k8s.io/v1alpha3) and the DRADeviceTaints gate on the API server, the scheduler
and kube-controller-manager; KWOK runs the node. Pods are placed by the scheduler (a pod
with ``nodeName`` would skip it, and no claim would be allocated)."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuguard.controller.gpu_quarantine import GpuQuarantine, install
from gpuguard.controller.loop import Controller
from gpuguard.kube import dra
from gpuguard.kube.api_errors import KubeNotFound
from gpuguard.kube.rest import KubeApi, load_api
from gpuguard.remediation.policy import Policy
from tests.support import controlplane
from tests.support.cluster import install_crds, make_node, scratch_namespace, set_health, wait_for
from tests.support.controllers import (
    FAST_POLICY,
    POOL,
    Running,
    status_of,
    tainted,
)
from tests.support.controlplane import ControlPlane
from tests.support.jobsystem import JobSystem, make_kwok_node
from tests.support.metrics import sample

log = logging.getLogger(__name__)
DRIVER = "gpu.test.gpuguard.io"
CLASS = "gpuguard-test-gpu"
GATES = "DRADeviceTaints=true"
RESOURCE = "/apis/resource.k8s.io/v1"
# No rung starts within a test: the device taint alone acts, and a healthy report ends
# the episode (Transient), which is the repair the tests stand for.
POLICY: dict[str, Any] = {**FAST_POLICY, "tolerance_s": 600}


@pytest.fixture(scope="module")
def dra_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The plane, the scheduler and the two DRA controllers (eviction, claims)."""
    workdir = Path(tmp_path_factory.mktemp("dra"))
    started = time.monotonic()
    flags = ("--runtime-config=resource.k8s.io/v1alpha3=true", f"--feature-gates={GATES}")
    with ControlPlane(workdir, controlplane.testenv_bin(), extra_args=flags) as plane:
        (workdir / "system").mkdir()
        system = JobSystem(
            plane,
            workdir / "system",
            controllers=("device-taint-eviction", "resourceclaim"),
            feature_gates=GATES,
        )
        try:
            system.start()
            log.info("the DRA plane started in %.1fs", time.monotonic() - started)
            yield plane
        finally:
            system.stop()


@pytest.fixture(scope="module")
def dra_api(dra_plane: ControlPlane) -> Iterator[KubeApi]:
    """An admin client, gpuguard's CRDs and a DeviceClass of the test driver's GPUs."""
    with load_api(dra_plane.admin_kubeconfig) as api:
        install_crds(api)
        selector = {"cel": {"expression": f'device.driver == "{DRIVER}"'}}
        api.create(
            f"{RESOURCE}/deviceclasses",
            {"metadata": {"name": CLASS}, "spec": {"selectors": [selector]}},
        )
        yield api


def pci(index: int) -> str:
    return f"0000:{0x18 + index:02x}:00.0"


def gpu_slice(node: str, count: int = 8) -> dict[str, Any]:
    """The ResourceSlice a DRA driver publishes: ``gpu-<i>`` with uuid and pcieBusID."""
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "uuid": {"string": f"GPU-{uuid.uuid4()}"},
                "pcieBusID": {"string": pci(i)},
            },
        }
        for i in range(count)
    ]
    return {
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def claim_pod(api: KubeApi, namespace: str, node: str, name: str, count: int) -> None:
    """A claim for ``count`` GPUs and a pod using it, placed by the scheduler."""
    request = {"deviceClassName": CLASS, "allocationMode": "ExactCount", "count": count}
    api.create(
        f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
        {
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": request}]}},
        },
    )
    container = {"name": "main", "image": "train", "resources": {"claims": [{"name": "gpus"}]}}
    api.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
                "containers": [container],
            },
        },
    )


def pod(api: KubeApi, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    except KubeNotFound:
        return None


def running(api: KubeApi, namespace: str, name: str) -> bool:
    found = pod(api, namespace, name)
    return found is not None and found.get("status", {}).get("phase") == "Running"


def unschedulable(api: KubeApi, namespace: str, name: str) -> bool:
    found = pod(api, namespace, name) or {}
    return any(
        c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
        for c in found.get("status", {}).get("conditions") or []
    )


def devices_of(api: KubeApi, namespace: str, claim: str) -> list[str]:
    found = api.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{claim}")
    allocation = (found.get("status") or {}).get("allocation") or {}
    return [r["device"] for r in allocation.get("devices", {}).get("results", [])]


def release(api: KubeApi, namespace: str, names: list[str]) -> None:
    """Delete the pods (at once: no kubelet) and then their claims."""
    for name in names:
        api.delete(f"/api/v1/namespaces/{namespace}/pods/{name}", {"gracePeriodSeconds": 0})
    wait_for(lambda: not any(pod(api, namespace, n) for n in names), 30, "the pods gone")
    for name in names:
        api.delete(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}")


def rules(api: KubeApi, node: str) -> list[dict[str, Any]]:
    return dra.our_rules(api, dra.discover(api), node)


def gpu_node(api: KubeApi) -> str:
    """A KWOK node whose 8 GPUs the driver publishes in one ResourceSlice."""
    node = f"kwok-dra-{uuid.uuid4().hex[:6]}"
    make_kwok_node(api, node, {"kubernetes.io/hostname": node, POOL: node})
    api.create(f"{RESOURCE}/resourceslices", gpu_slice(node))
    return node


def start(
    api: KubeApi, namespace: str, attach: Callable[[Controller], None] | None = None
) -> tuple[Controller, Running]:
    controller = Controller(
        api,
        Policy(**POLICY),
        "delete-node",
        namespace=namespace,
        identity=f"test-{uuid.uuid4().hex[:6]}",
        resync_s=0.2,
        lease_s=3,
        renew_s=1,
        gpu_quarantine=attach or install(DRIVER),
    )
    return controller, Running(controller.run)


def test_a_gpu_finding_taints_that_device_not_the_node(dra_api):
    api = dra_api
    with scratch_namespace(api) as namespace:
        node = gpu_node(api)
        ones = [f"one-{i}" for i in range(8)]
        for name in ones:
            claim_pod(api, namespace, node, name, 1)
        wait_for(lambda: all(running(api, namespace, n) for n in ones), 60, "8 pods running")
        on = {devices_of(api, namespace, n)[0]: n for n in ones}
        assert sorted(on) == [f"gpu-{i}" for i in range(8)]
        controller, thread = start(api, namespace)
        try:
            set_health(
                api, node, gpu="False", action="RESET_GPU", codes=("XID_48",), gpus=(pci(3),)
            )
            (rule,) = wait_for(lambda: rules(api, node), 30, "the device's rule")
            assert rule["metadata"]["name"] == f"gpuguard-{node}-gpu-3"
            selector = {"driver": DRIVER, "pool": node, "device": "gpu-3"}
            assert rule["spec"]["deviceSelector"] == selector
            assert rule["spec"]["taint"]["effect"] == "NoExecute"
            # The real eviction controller deletes the pod on gpu-3 and no other.
            wait_for(lambda: pod(api, namespace, on["gpu-3"]) is None, 60, "its pod evicted")
            # The status is written after the object: wait for it, not for the object.
            phase = wait_for(lambda: status_of(api, node).get("phase"), 30, "the episode")
            assert phase == "Quarantined"  # no rung started: the eviction is the DRA one
            assert all(running(api, namespace, on[f"gpu-{i}"]) for i in range(8) if i != 3)
            assert not tainted(api, node)
            release(api, namespace, [n for n in ones if n != on["gpu-3"]])
            api.delete(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{on['gpu-3']}")

            claim_pod(api, namespace, node, "eight", 8)  # 7 untainted GPUs are not 8
            wait_for(lambda: unschedulable(api, namespace, "eight"), 30, "8 GPUs unschedulable")
            assert devices_of(api, namespace, "eight") == []
            release(api, namespace, ["eight"])
            claim_pod(api, namespace, node, "seven", 7)
            wait_for(lambda: running(api, namespace, "seven"), 30, "7 GPUs allocated")
            assert sorted(devices_of(api, namespace, "seven")) == [
                f"gpu-{i}" for i in range(8) if i != 3
            ]
            assert not tainted(api, node)
            release(api, namespace, ["seven"])

            set_health(api, node)  # repaired: the episode closes, the rule goes
            wait_for(lambda: not rules(api, node), 30, "the rule deleted")
            assert status_of(api, node)["resolution"] == "Transient"
            assert not tainted(api, node)
            assert (
                sample(controller.metrics.registry, "gpuguard_controller_gpu_quarantine_devices")
                == 0
            )
            claim_pod(api, namespace, node, "eight-again", 8)
            wait_for(lambda: running(api, namespace, "eight-again"), 30, "8 GPUs allocated")
            release(api, namespace, ["eight-again"])
        finally:
            thread.halt()


def test_a_node_wide_fault_or_an_unknown_gpu_taints_the_node(dra_api):
    api = dra_api
    with scratch_namespace(api) as namespace:
        node = gpu_node(api)
        controller, thread = start(api, namespace)
        try:
            # A GPU no slice of the driver publishes: the node, as without DRA.
            set_health(api, node, gpu="False", action="RESET_GPU", gpus=("0000:99:00.0",))
            wait_for(lambda: tainted(api, node), 30, "the node's taint")
            assert not rules(api, node)
            set_health(api, node)
            wait_for(lambda: not tainted(api, node), 30, "the node's taint lifted")
            # A finding naming no GPU (the network layer): the node.
            set_health(api, node, network="False", network_action="RESET_GPU")
            wait_for(lambda: tainted(api, node), 30, "the node's taint")
            assert not rules(api, node)
            escalated = "gpuguard_controller_gpu_quarantine_escalations_total"
            registry = controller.metrics.registry
            assert sample(registry, escalated, reason="unresolved") == 1
            assert sample(registry, escalated, reason="node") == 1
            set_health(api, node)
            wait_for(lambda: not tainted(api, node), 30, "the node's taint lifted")
        finally:
            thread.halt()


def test_a_gpu_fault_that_climbs_past_a_reset_taints_the_node(dra_api):
    api = dra_api
    with scratch_namespace(api) as namespace:
        node = gpu_node(api)
        _, thread = start(api, namespace)
        try:
            # Degraded and deferred: the running work stays (NoSchedule).
            set_health(api, node, gpu="False", action="RESET_GPU", gpus=(pci(5),), deferred=True)
            (rule,) = wait_for(lambda: rules(api, node), 30, "the device's rule")
            assert rule["spec"]["taint"]["effect"] == "NoSchedule"
            assert rule["spec"]["deviceSelector"]["device"] == "gpu-5"
            wait_for(lambda: status_of(api, node).get("phase"), 30, "the episode recorded")
            assert not tainted(api, node)
            # The same GPU now needs a reboot: more than a device taint can hold.
            set_health(api, node, gpu="False", action="REBOOT", gpus=(pci(5),))
            wait_for(lambda: tainted(api, node), 30, "the node's taint")
            set_health(api, node)
            wait_for(lambda: not tainted(api, node) and not rules(api, node), 30, "all lifted")
        finally:
            thread.halt()


def test_cleanup_removes_gpuguards_device_taint_rules(dra_plane, dra_api):
    api, taints = dra_api, dra.discover(dra_api)
    device = dra.Device(DRIVER, "some-pool", "gpu-0")
    dra.put_rule(api, taints, dra.rule(taints, "some-node", device, "NoSchedule", "XID_48"))
    foreign = {
        "metadata": {"name": "not-gpuguards"},
        "spec": {"taint": {"key": "k", "effect": "NoSchedule"}},
    }
    api.create(taints.rules.path(), foreign)
    command = [sys.executable, "-m", "gpuguard.cli", "cleanup", "--apply"]
    command += ["--kubeconfig", str(dra_plane.admin_kubeconfig)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "removed DeviceTaintRule gpuguard-some-node-gpu-0" in done.stdout
    assert [r["metadata"]["name"] for r in api.list(taints.rules.path()).items] == ["not-gpuguards"]
    api.delete(taints.rules.path("not-gpuguards"))


def test_without_device_taint_rules_served_the_node_is_tainted(api, namespace):
    # The shared plane serves no resource.k8s.io/v1alpha3: per-GPU quarantine falls back.
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    make_node(api, name, labels={POOL: name})
    controller, thread = start(api, namespace)
    try:
        set_health(api, name, gpu="False", action="RESET_GPU", gpus=(pci(3),))
        wait_for(lambda: tainted(api, name), 30, "the node's taint")
        registry = controller.metrics.registry
        assert sample(registry, "gpuguard_controller_gpu_quarantine_available") == 0
        escalated = "gpuguard_controller_gpu_quarantine_escalations_total"
        assert sample(registry, escalated, reason="unavailable") == 1
    finally:
        thread.halt()


def test_a_leftover_rule_of_a_node_without_an_episode_is_swept(dra_api):
    # As when the node was deleted while quarantined, or a leader went between the close
    # and the untaint: the new leader deletes it (ours only) when its leadership starts.
    api, taints = dra_api, dra.discover(dra_api)
    device = dra.Device(DRIVER, "gone", "gpu-1")
    dra.put_rule(api, taints, dra.rule(taints, "gone", device, "NoExecute", "XID_48"))
    with scratch_namespace(api) as namespace:
        _, thread = start(api, namespace)
        try:
            wait_for(lambda: not rules(api, "gone"), 30, "the leftover rule swept")
        finally:
            thread.halt()


@pytest.mark.parametrize("dry_run", [False, True])
def test_the_chart_values_reach_the_controllers_flags_and_role(helm, dry_run):
    chart = str(controlplane.REPO / "deploy" / "helm" / "gpuguard")
    values = ["--set", f"controller.dryRun={str(dry_run).lower()}"]

    def rendered(*more: str) -> list[dict[str, Any]]:
        out = helm("template", "fleet", chart, *values, *more)
        return [doc for doc in yaml.safe_load_all(out) if doc]

    def controller(objects: list[dict[str, Any]]) -> tuple[list[str], set[str]]:
        (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
        (role,) = [
            o
            for o in objects
            if o["kind"] == "ClusterRole" and "controller" in o["metadata"]["name"]
        ]
        granted = {
            f"{r['resources'][0]}:{verb}"
            for r in role["rules"]
            if "resource.k8s.io" in r["apiGroups"]
            for verb in r["verbs"]
        }
        return deployment["spec"]["template"]["spec"]["containers"][0]["command"], granted

    command, granted = controller(rendered())
    assert "--gpu-quarantine" not in command and not granted  # off by default
    on = ("--set", "gpuQuarantine.enabled=true", "--set", "gpuQuarantine.driver=gpu.example.com")
    command, granted = controller(rendered(*on))
    at = command.index("--gpu-quarantine-driver")
    assert "--gpu-quarantine" in command and command[at + 1] == "gpu.example.com"
    writes = {f"devicetaintrules:{v}" for v in ("create", "update", "patch", "delete")}
    reads = {
        f"{kind}:{v}"
        for kind in ("resourceslices", "devicetaintrules")
        for v in ("get", "list", "watch")
    }
    assert granted == reads | (set() if dry_run else writes)


def test_a_rule_deleted_by_hand_is_written_again_after_the_next_sweep(dra_api):
    api = dra_api
    with scratch_namespace(api) as namespace:
        node = gpu_node(api)
        quarantine = GpuQuarantine(DRIVER)
        _, thread = start(api, namespace, attach=quarantine.attach)
        try:
            set_health(api, node, gpu="False", action="RESET_GPU", codes=("X",), gpus=(pci(2),))
            (rule,) = wait_for(lambda: rules(api, node), 30, "the device's rule")
            wait_for(lambda: status_of(api, node).get("phase"), 30, "the episode recorded")
            taints = dra.discover(api)
            api.delete(taints.rules.path(rule["metadata"]["name"]))
            quarantine.sweep()  # the cleanup thread's round, hourly
            wait_for(lambda: rules(api, node), 30, "the rule written again")
            assert not tainted(api, node)
        finally:
            thread.halt()
