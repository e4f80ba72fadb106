"""The chart as a user installs it, on a real kubelet (tests/kube/test_chart_on_kubelet.py,
bench/chart_install.py): one API server of its own (ServiceAccount admission on, an audit
log), the controllers and scheduler the chart's objects need, and one node (containerd +
kubelet, tests/support/node.py) labelled as a GPU node, running the image ``make image``
builds. The agent reads a copy of examples/healthy-h100 mounted from the host
(``bundle.hostPath``): a fault appended to its kmsg.log is a kernel log line. Everything
is on loopback: the pods use the host's network and reach the API server at 127.0.0.1
(``apiServer``), never the ``kubernetes`` Service's address.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuguard.kube.rest import KubeApi, load_api
from tests.support import controlplane
from tests.support.cluster import install_gpuguard_crd, wait_for
from tests.support.controlplane import REPO, ControlPlane, free_port
from tests.support.jobsystem import JobSystem
from tests.support.node import IMAGE_REPOSITORY, RealNode, gpuguard_image

NAMESPACE = "gpuguard"
RELEASE = "gpuguard"
NODE = "gpu-node-1"
# What the chart's objects need running: its DaemonSet, Deployment and hook Job, the
# garbage collector (uninstall deletes their pods through it) and the cordon taint.
CONTROLLERS = (
    "daemonset",
    "deployment",
    "replicaset",
    "job",
    "garbage-collector",
    "node-lifecycle",
)
# Probed every 2 s from the start, so a probe that fails restarts the container within the
# module's run (three failures), and the restart count says so.
PROBES = {
    "livenessProbe": {"initialDelaySeconds": 2, "periodSeconds": 2},
    "readinessProbe": {"periodSeconds": 2},
}
START_S = 120  # pod start: the image is local, but 2 cores start Python slowly
# Only the taint for now: the XID 79 waits an hour before any rung.
PATIENT_POLICY = {"tolerance_s": 3600, "tolerances": {"XID_79": 3600, "GPU_FALLEN_OFF_BUS": 3600}}


@dataclass
class Cluster:
    plane: ControlPlane
    system: JobSystem
    node: RealNode
    api: KubeApi
    bundle: Path
    values: Path
    helm: Callable[..., str]

    def wait(self, predicate: Callable[[], Any], what: str, timeout_s: float = START_S) -> Any:
        """``wait_for``, failing at once (naming the log) if a component has exited."""

        def checked() -> Any:
            self.node.check_running()
            self.system.check_running()
            return predicate()

        return wait_for(checked, timeout_s, what)

    def pods(self, component: str) -> list[dict[str, Any]]:
        selector = f"app.kubernetes.io/component={component}"
        found = self.api.list(f"/api/v1/namespaces/{NAMESPACE}/pods", label_selector=selector)
        return [p for p in found.items if not p["metadata"].get("deletionTimestamp")]

    def ready_pod(self, component: str) -> dict[str, Any] | None:
        for pod in self.pods(component):
            conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
            if conditions.get("Ready") == "True":
                return pod
        return None

    def node_object(self) -> dict[str, Any]:
        return self.api.get(f"/api/v1/nodes/{NODE}")

    def conditions(self) -> dict[str, str]:
        found = self.node_object()["status"].get("conditions", [])
        return {c["type"]: c["status"] for c in found}

    def leader(self) -> str:
        lease = self.api.get(
            f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/gpuguard-controller"
        )
        return str(lease["spec"].get("holderIdentity") or "")

    def log_lines(self, pod: dict[str, Any]) -> list[dict[str, Any]]:
        """The container's log through the API server (which reads it from the kubelet)."""
        name = pod["metadata"]["name"]
        url = f"{self.plane.url}/api/v1/namespaces/{NAMESPACE}/pods/{name}/log"
        with urllib.request.urlopen(url, context=self.plane.ssl_context(), timeout=10) as answer:
            text = answer.read().decode()
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def install_or_upgrade(self, verb: str, policy: dict[str, Any]) -> None:
        values = yaml.safe_load(self.values.read_text())
        values["controller"]["policy"] = policy
        self.values.write_text(yaml.safe_dump(values))
        self.helm(
            verb,
            RELEASE,
            "deploy/helm/gpuguard",
            f"--namespace={NAMESPACE}",
            f"--values={self.values}",
            f"--kubeconfig={self.plane.admin_kubeconfig}",
        )


@contextlib.contextmanager
def chart_cluster(workdir: Path, helm: Callable[..., str]) -> Iterator[Cluster]:
    """The plane, its controllers and the node, the image imported, the namespace and the
    bundle ready: everything a ``helm install`` of the chart needs."""
    bin_dir = controlplane.testenv_bin()  # not imported by name: pytest would collect it
    image = gpuguard_image()
    for part in ("plane", "system", "node"):
        (workdir / part).mkdir()
    with ControlPlane(workdir / "plane", bin_dir, audit=True, service_accounts=True) as plane:
        system = JobSystem(plane, workdir / "system", controllers=CONTROLLERS)
        try:
            system.start()
            node = RealNode(
                plane, workdir / "node", bin_dir, NODE, labels={"nvidia.com/gpu.present": "true"}
            )
            with node, load_api(plane.admin_kubeconfig) as api:
                node.import_image(image.export(workdir / "image.tar"))
                (workdir / "image.tar").unlink()
                install_gpuguard_crd(api)
                api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
                plane.publish_root_ca(NAMESPACE)  # what kcm's root-CA publisher would do
                bundle = workdir / "bundle"
                shutil.copytree(REPO / "examples" / "healthy-h100", bundle)
                values = workdir / "values.yaml"
                values.write_text(yaml.safe_dump(_values(plane, image.tag, bundle)))
                yield Cluster(plane, system, node, api, bundle, values, helm)
        finally:
            system.stop()


def _values(plane: ControlPlane, tag: str, bundle: Path) -> dict[str, Any]:
    """The install's values: the locally built image, loopback only, the bundle."""
    loopback = {"hostNetwork": True}
    return {
        "image": {"repository": IMAGE_REPOSITORY, "tag": tag, "pullPolicy": "Never"},
        "apiServer": {"host": "127.0.0.1", "port": str(plane.port)},
        "runtimeClassName": "",  # no NVIDIA runtime on this node
        "bundle": {"hostPath": str(bundle)},
        "config": {
            "expected_gpus": 1,
            "expected_nics": 3,
            "expected_link_gbps": 400,
            "metrics_port": free_port(),  # host ports: a fixed one might be taken
            "heartbeat_interval_s": 30,
        },
        **loopback,
        **PROBES,
        "cleanup": {**loopback, "tolerations": [{"operator": "Exists"}]},
        "controller": {
            **loopback,
            **PROBES,
            # One node, host network: a second replica would need the same host port.
            "replicas": 1,
            "podDisruptionBudget": {"enabled": False},
            "updateStrategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "provider": "delete-node",
            "dryRun": False,  # the chart's default is a dry run; these tests watch it act
            "metricsPort": free_port(),
            "policy": {},
        },
    }
