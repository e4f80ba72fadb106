"""The real Karpenter (its KWOK cloud provider, with the AWS provider's node repair policies:
``hack/karpenter/main.go``) on a control plane of its own, with KWOK as the kubelet of the
nodes it launches and kube-controller-manager running what Karpenter relies on: the node
lifecycle controller (it lifts the not-ready taint a new Node starts with), the
disruption controller (budgets' ``disruptionsAllowed``), the Job, Deployment and
ReplicaSet controllers, and the pod garbage collector. Built by ``hack/testenv``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import yaml

from gpuguard.kube.rest import KubeApi, KubeNotFound
from tests.support.cluster import install_crd, install_gpuguard_crd, serving, wait_for
from tests.support.controlplane import START_TIMEOUT_S, ControlPlane, free_port, terminate
from tests.support.jobsystem import JobSystem

CONTROLLERS = (
    "node-lifecycle",
    "disruption",
    "job",
    "deployment",
    "replicaset",
    "pod-garbage-collector",
)
GPU_INSTANCE = "gpu-8x-h100"
TRAIN_NAMESPACE = "train"  # the training Jobs' (tests/kube/conftest.py karpenter_plane)
KARPENTER_TOLERATION_S = 30  # Karpenter's repair toleration in tests (the AWS provider's: 10 min)
NODEPOOL = "gpu"
KARPENTER_USER = "karpenter"


def instance_types() -> list[dict[str, object]]:
    """One instance type of 8 GPUs, on demand in one zone (the provider's file format)."""
    requirements = [
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["test-zone-a"]},
    ]
    return [
        {
            "name": GPU_INSTANCE,
            "architecture": "amd64",
            "operatingSystems": ["linux"],
            "resources": {
                "cpu": "192",
                "memory": "2048Gi",
                "ephemeral-storage": "1Ti",
                "pods": "110",
                "nvidia.com/gpu": "8",
            },
            "offerings": [{"Price": 98.32, "Available": True, "Requirements": requirements}],
        }
    ]


def gpu_nodepool() -> dict[str, object]:
    """Karpenter launches GPU nodes for pending GPU pods and never consolidates them away
    on its own (only gpuguard's REPLACE, or its own node repair, takes one)."""
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": NODEPOOL},
        "spec": {
            "template": {
                "metadata": {"labels": {"nvidia.com/gpu.present": "true"}},
                "spec": {
                    "requirements": [
                        {
                            "key": "node.kubernetes.io/instance-type",
                            "operator": "In",
                            "values": [GPU_INSTANCE],
                        },
                    ],
                    "nodeClassRef": {
                        "group": "karpenter.kwok.sh",
                        "kind": "KWOKNodeClass",
                        "name": "default",
                    },
                    "expireAfter": "Never",
                },
            },
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never"},
        },
    }


class KarpenterCluster:
    """``start`` brings up the Job system (the controllers above, kube-scheduler, KWOK) and
    Karpenter, installs gpuguard's CRD, Karpenter's from its module and a GPU NodePool."""

    def __init__(
        self,
        plane: ControlPlane,
        workdir: Path,
        *,
        repair_toleration: str,
        controllers: tuple[str, ...] = CONTROLLERS,
    ) -> None:
        """``controllers``: kube-controller-manager's, at least ``CONTROLLERS``."""
        self.plane = plane
        self.workdir = workdir
        self.repair_toleration = repair_toleration
        self.system = JobSystem(plane, workdir, controllers)
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, api: KubeApi, namespaces: tuple[str, ...] = ()) -> None:
        """``namespaces``: created first (the Jobs', the controller's Lease's)."""
        for name in namespaces:
            namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            api.create("/api/v1/namespaces", namespace)
        install_gpuguard_crd(api)
        for path in sorted((self.plane.bin / "crds" / "karpenter").glob("*.yaml")):
            install_crd(api, yaml.safe_load(path.read_text()))
        self.system.start()
        types = self.workdir / "instance_types.json"
        types.write_text(json.dumps(instance_types()))
        health = free_port()
        env = {
            **os.environ,
            # A client of its own: an audit log tells Karpenter's writes apart.
            "KUBECONFIG": str(self.plane.client_kubeconfig(KARPENTER_USER)),
            "DISABLE_LEADER_ELECTION": "true",
            "METRICS_PORT": str(free_port()),
            "HEALTH_PROBE_PORT": str(health),
            "FEATURE_GATES": "NodeRepair=true",
            "INSTANCE_TYPES_FILE_PATH": str(types),
            "REPAIR_TOLERATION": self.repair_toleration,
            "BATCH_IDLE_DURATION": "100ms",
            "BATCH_MAX_DURATION": "1s",
        }
        with (self.workdir / "karpenter.log").open("ab") as log:
            self._proc = subprocess.Popen(
                [str(self.plane.bin / "karpenter-kwok")],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        log = self.workdir / "karpenter.log"
        ready = f"http://127.0.0.1:{health}/readyz"
        wait_for(lambda: serving(self._proc, ready, log), START_TIMEOUT_S, "Karpenter ready")
        api.create(
            "/apis/karpenter.kwok.sh/v1alpha1/kwoknodeclasses",
            {
                "apiVersion": "karpenter.kwok.sh/v1alpha1",
                "kind": "KWOKNodeClass",
                "metadata": {"name": "default"},
            },
        )
        api.create("/apis/karpenter.sh/v1/nodepools", gpu_nodepool())

    def stop(self) -> None:
        terminate(self._proc)
        self.system.stop()


def node_gone(api: KubeApi, name: str) -> bool:
    try:
        api.get(f"/api/v1/nodes/{name}")
    except KubeNotFound:
        return True
    return False


def nodeclaims(api: KubeApi) -> list[dict[str, object]]:
    return api.list("/apis/karpenter.sh/v1/nodeclaims").items


def wait_s(started: float) -> float:
    return time.monotonic() - started
