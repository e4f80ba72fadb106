"""The chart installed as a user installs it, on a real kubelet: its pods run the image that
``make image`` builds, with their own ServiceAccount tokens, so RBAC and the admission
policies apply for real.

One API server of its own (ServiceAccount admission on, an audit log), the controllers and
scheduler the chart's objects need, and one node (containerd + kubelet, tests/support/
node.py) labelled as a GPU node. The agent reads a copy of examples/healthy-h100 mounted
from the host (``bundle.hostPath``): a fault appended to its kmsg.log is a kernel log line.
Everything is on loopback: the pods use the host's network and reach the API server at
127.0.0.1 (``apiServer``), never the ``kubernetes`` Service's address.

The tests run in order on one release: install, fault, upgrade, uninstall.
"""

from __future__ import annotations

import datetime
import json
import shutil
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuguard.kube.errors import KubeError
from gpuguard.kube.rest import KubeApi, load_api
from tests.support import controlplane
from tests.support.audit import AuditLog
from tests.support.cluster import install_gpuguard_crd, wait_for
from tests.support.controllers import append, remediations, tainted
from tests.support.controlplane import REPO, ControlPlane, free_port
from tests.support.jobsystem import JobSystem
from tests.support.node import IMAGE_REPOSITORY, RealNode, gpuguard_image

NAMESPACE = "gpuguard"
RELEASE = "gpuguard"
NODE = "gpu-node-1"
AGENT_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
CONDITIONS = ("GpuguardGPUHealthy", "GpuguardNetworkHealthy", "GpuguardKernelHealthy")
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
CLEANUP_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-cleanup"
# Probed every 2 s from the start, so a probe that fails restarts the container within the
# module's run (three failures), and the restart count says so.
PROBES = {
    "livenessProbe": {"initialDelaySeconds": 2, "periodSeconds": 2},
    "readinessProbe": {"periodSeconds": 2},
}
PROBED_S = 10
START_S = 120  # pod start: the image is local, but 2 cores start Python slowly
# Only the taint for now: the XID 79 waits an hour before any rung.
PATIENT_POLICY = {"tolerance_s": 3600, "tolerances": {"XID_79": 3600, "GPU_FALLEN_OFF_BUS": 3600}}
# The upgrade: act at once, with every rung switched off (the episode is then exhausted:
# left to a human, proof the new policy decided).
NO_RUNGS_POLICY = {
    "tolerance_s": 0,
    "tolerances": {"XID_79": 0, "GPU_FALLEN_OFF_BUS": 0},
    "max_attempts": {"KILL_JOB": 0, "RESET_GPU": 0, "REBOOT": 0, "REPLACE": 0},
}


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


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, helm: Callable[..., str]
) -> Iterator[Cluster]:
    workdir = Path(tmp_path_factory.mktemp("chart-on-kubelet"))
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
            "metricsPort": free_port(),
            "policy": {},
        },
    }


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Cluster:
    cluster.install_or_upgrade("install", PATIENT_POLICY)
    return cluster


def test_the_agent_pod_publishes_the_nodes_conditions_with_its_own_token(
    installed: Cluster,
) -> None:
    pod = installed.wait(lambda: installed.ready_pod("agent"), "the agent pod Ready")
    assert pod["spec"]["nodeName"] == NODE
    assert pod["status"]["podIP"] == "127.0.0.1"
    conditions = installed.wait(
        lambda: (c := installed.conditions()) and all(c.get(t) == "True" for t in CONDITIONS) and c,
        "the agent's conditions",
    )
    assert conditions["Ready"] == "True"  # the kubelet's own, untouched
    writes = AuditLog(installed.plane.audit_log or Path()).writes(
        user=AGENT_ACCOUNT, resource="nodes", subresource="status", name=NODE
    )
    assert writes and all(w.succeeded for w in writes), writes


def test_the_agents_token_writes_only_its_own_node(installed: Cluster) -> None:
    """The token the kubelet mounted into the agent's pod, used from outside it: the
    admission policies refuse another Node and the kubelet's conditions."""
    pod = installed.wait(lambda: installed.ready_pod("agent"), "the agent pod Ready")
    token = _mounted_token(installed.node, pod)
    other = "gpu-node-2"
    installed.api.create("/api/v1/nodes", {"metadata": {"name": other}})
    with load_api(_token_kubeconfig(installed, token)) as agent:
        condition = {"type": "GpuguardGPUHealthy", "status": "False", "reason": "Test"}
        body = {"status": {"conditions": [condition]}}
        with pytest.raises(KubeError, match=r"(?i)denied|forbidden"):
            agent.patch(f"/api/v1/nodes/{other}/status", body, "strategic")
        ready = {"type": "Ready", "status": "False", "reason": "Test"}
        with pytest.raises(KubeError, match=r"(?i)denied|forbidden"):
            agent.patch(
                f"/api/v1/nodes/{NODE}/status", {"status": {"conditions": [ready]}}, "strategic"
            )
    installed.api.delete(f"/api/v1/nodes/{other}")


def test_the_controller_pod_starts_and_takes_the_lease(installed: Cluster) -> None:
    pod = installed.wait(lambda: installed.ready_pod("controller"), "the controller pod Ready")
    name = pod["metadata"]["name"]
    installed.wait(lambda: installed.leader() == name, f"{name} holding the Lease")


def test_a_fault_in_the_followed_kernel_log_taints_the_node(installed: Cluster) -> None:
    append(installed.bundle, 79, "GPU has fallen off the bus.")
    installed.wait(
        lambda: installed.conditions().get("GpuguardGPUHealthy") == "False", "GPU layer False"
    )
    installed.wait(lambda: tainted(installed.api, NODE), "the gpuguard.io/unhealthy taint")
    (episode,) = installed.wait(lambda: remediations(installed.api, NODE), "the episode")
    assert not (episode.get("status") or {}).get("exhausted")  # the patient policy waits


def test_container_logs_are_json_lines_naming_the_node_and_episode(installed: Cluster) -> None:
    agent = installed.ready_pod("agent")
    assert agent is not None
    lines = installed.log_lines(agent)
    assert lines and all(line["node"] == NODE for line in lines)
    assert {"time", "level", "logger", "message"} <= set(lines[0])
    (episode,) = remediations(installed.api, NODE)
    name = episode["metadata"]["name"]

    def taint_logged() -> bool:
        controller = installed.ready_pod("controller")
        assert controller is not None
        return any(
            line.get("episode") == name
            and line.get("node") == NODE
            and line["message"].startswith("Taint ")
            for line in installed.log_lines(controller)
        )

    installed.wait(taint_logged, "the controller's Taint line", timeout_s=30)


def test_helm_upgrade_with_a_changed_policy_is_picked_up(installed: Cluster) -> None:
    before = installed.leader()
    installed.install_or_upgrade("upgrade", NO_RUNGS_POLICY)
    installed.wait(
        lambda: (leader := installed.leader()) and leader != before, "a new controller leading"
    )
    installed.wait(
        lambda: (remediations(installed.api, NODE)[0].get("status") or {}).get("exhausted"),
        "the episode exhausted under the new policy",
    )


def test_the_probes_pass_without_restarts(installed: Cluster) -> None:
    for component in ("agent", "controller"):
        pod = installed.wait(
            lambda c=component: _probed_pod(installed, c), f"{component} probed {PROBED_S} s"
        )
        (status,) = pod["status"]["containerStatuses"]
        assert status["restartCount"] == 0, status


def _probed_pod(cluster: Cluster, component: str) -> dict[str, Any] | None:
    """The component's Ready pod once its container has run PROBED_S (5 liveness probes)."""
    pod = cluster.ready_pod(component)
    if pod is None:
        return None
    (status,) = pod["status"]["containerStatuses"]
    started = datetime.datetime.fromisoformat(status["state"]["running"]["startedAt"])
    age = datetime.datetime.now(datetime.UTC) - started
    return pod if age.total_seconds() >= PROBED_S else None


def test_helm_uninstall_runs_the_cleanup_and_leaves_the_node_clean(installed: Cluster) -> None:
    assert tainted(installed.api, NODE)
    audit = AuditLog(installed.plane.audit_log or Path())
    installed.helm(
        "uninstall",
        RELEASE,
        f"--namespace={NAMESPACE}",
        "--timeout=5m",
        f"--kubeconfig={installed.plane.admin_kubeconfig}",
    )
    node = installed.node_object()
    conditions = {c["type"] for c in node["status"].get("conditions", [])}
    assert not conditions & set(CONDITIONS)
    assert not any(t["key"].startswith("gpuguard.io/") for t in node["spec"].get("taints") or [])
    assert not node["spec"].get("unschedulable")
    annotations = node["metadata"].get("annotations") or {}
    assert not [key for key in annotations if key.startswith("gpuguard.io/")]
    assert installed.pods("agent") == installed.pods("controller") == []
    # The hook's own account took the taint off: the Job ran in the hook's pod.
    cleaned = audit.writes(user=CLEANUP_ACCOUNT, resource="nodes", name=NODE)
    assert cleaned and all(w.succeeded for w in cleaned), cleaned


def _mounted_token(node: RealNode, pod: dict[str, Any]) -> str:
    uid = pod["metadata"]["uid"]
    volumes = node.workdir / "kubelet" / "root" / "pods" / uid / "volumes"
    (token,) = volumes.glob("kubernetes.io~projected/kube-api-access-*/token")
    return token.read_text()


def _token_kubeconfig(cluster: Cluster, token: str) -> Path:
    path = cluster.node.workdir / "agent-token.kubeconfig"
    path.write_text(yaml.safe_dump(cluster.plane.kubeconfig_for_token(token)))
    return path
