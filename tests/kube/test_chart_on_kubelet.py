"""The chart installed as a user installs it, on a real kubelet: its pods run the image that
``make image`` builds, with their own ServiceAccount tokens, so RBAC and the admission
policies apply for real. The cluster, its node and the values: tests/support/
chart_cluster.py.

The tests run in order on one release: install, fault, upgrade, uninstall.
"""

from __future__ import annotations

import datetime
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuguard.contract.preflight import NOT_EQUIPPED, read_result
from gpuguard.controller.pods import slim_pod
from gpuguard.controller.preflight_pods import failures_of
from gpuguard.kube.errors import KubeError
from gpuguard.kube.rest import load_api
from gpuguard.preflight.mutate import Settings, init_container
from tests.support.audit import AuditLog
from tests.support.chart_cluster import (
    NAMESPACE,
    NODE,
    PATIENT_POLICY,
    RELEASE,
    Cluster,
    chart_cluster,
)
from tests.support.controllers import append, remediations, tainted
from tests.support.node import RealNode

AGENT_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
CONDITIONS = ("GpuguardGPUHealthy", "GpuguardNetworkHealthy", "GpuguardKernelHealthy")
CLEANUP_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-cleanup"
PROBED_S = 10
# The upgrade: act at once, with every rung switched off (the episode is then exhausted:
# left to a human, proof the new policy decided).
NO_RUNGS_POLICY = {
    "tolerance_s": 0,
    "tolerances": {"XID_79": 0, "GPU_FALLEN_OFF_BUS": 0},
    "max_attempts": {"KILL_JOB": 0, "RESET_GPU": 0, "REBOOT": 0, "REPLACE": 0},
}


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, helm: Callable[..., str]
) -> Iterator[Cluster]:
    with chart_cluster(Path(tmp_path_factory.mktemp("chart-on-kubelet")), helm) as made:
        yield made


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

        def refused(node: str, condition: dict[str, str]) -> bool:
            body = {"status": {"conditions": [condition]}}
            try:
                agent.patch(f"/api/v1/nodes/{node}/status", body, "strategic")
            except KubeError as exc:
                return bool(re.search(r"(?i)denied|forbidden", str(exc)))
            return False

        # The API server enforces an admission policy once its informer has it, a moment
        # after the install on a loaded machine: refused within the deadline, or failed.
        gpu = {"type": "GpuguardGPUHealthy", "status": "False", "reason": "Test"}
        installed.wait(lambda: refused(other, gpu), "another Node's status refused", 30)
        ready = {"type": "Ready", "status": "False", "reason": "Test"}
        installed.wait(lambda: refused(NODE, ready), "the kubelet's Ready refused", 30)
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


def test_the_preflight_check_in_the_image_fails_closed_and_blames_no_node_without_pytorch(
    installed: Cluster,
) -> None:
    """The init container the webhook adds (its own builder), run by the real kubelet from
    the chart's image, which has no PyTorch: the check fails closed, the job's container
    never starts, and the result the kubelet keeps says the image cannot check (its
    fault, the same on every node), which the controller holds against no node."""
    image = yaml.safe_load(installed.values.read_text())["image"]
    settings = Settings(image=f"{image['repository']}:{image['tag']}", budget_s=5)
    check = {**init_container({}, settings, gpus=0, claims=[]), "imagePullPolicy": "Never"}
    pod = {
        "metadata": {"name": "preflight-check", "namespace": NAMESPACE},
        "spec": {
            "serviceAccountName": RELEASE,
            "automountServiceAccountToken": False,
            "hostNetwork": True,
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],  # the node is tainted by now
            "initContainers": [check],
            "containers": [{**check, "name": "job", "args": ["--version"]}],
        },
    }
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    installed.api.create(path, pod)
    try:
        failed = installed.wait(
            lambda: (
                (p := installed.api.get(f"{path}/preflight-check"))["status"].get("phase")
                == "Failed"
                and p
            ),
            "the pod failed by its preflight",
        )
        (ending,) = [s["state"]["terminated"] for s in failed["status"]["initContainerStatuses"]]
        assert ending["exitCode"] == 2, ending
        result = read_result(ending.get("message"))
        assert result is not None and result.codes == (NOT_EQUIPPED,), ending
        assert "PyTorch" in result.message and "preflight.image" in result.message
        (job,) = failed["status"]["containerStatuses"]
        assert "running" not in job["state"] and not job.get("started"), job
        assert failures_of(slim_pod(failed), time.time()) == []
    finally:
        installed.api.delete(f"{path}/preflight-check")


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
