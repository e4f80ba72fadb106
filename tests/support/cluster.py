"""Helpers for tests that drive a fleet on the real API server: CRDs, Nodes, health."""

from __future__ import annotations

import contextlib
import datetime
import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from gpuguard.kube.remediations import NODE_REMEDIATIONS
from gpuguard.kube.rest import KubeApi, KubeConflict, Resource

REPO = Path(__file__).resolve().parents[2]
CRDS = Resource("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions")
NODECLAIM_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "nodeclaims.karpenter.sh"},
    "spec": {
        "group": "karpenter.sh",
        "scope": "Cluster",
        "names": {"plural": "nodeclaims", "singular": "nodeclaim", "kind": "NodeClaim"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def install_crds(api: KubeApi) -> None:
    """gpuguard's NodeRemediation CRD and a stand-in for Karpenter's NodeClaim CRD."""
    install_gpuguard_crd(api)
    install_crd(api, NODECLAIM_CRD)


def install_gpuguard_crd(api: KubeApi) -> None:
    """The chart's NodeRemediation CRD."""
    install_crd(
        api, yaml.safe_load((REPO / "deploy/helm/gpuguard/crds/noderemediations.yaml").read_text())
    )


def install_crd(api: KubeApi, crd: dict[str, Any]) -> None:
    """Create a CRD (kept if an earlier module made it) and wait until it is served."""
    with contextlib.suppress(KubeConflict):
        api.create(CRDS.path(), crd)
    wait_for(lambda: _established(api, crd["metadata"]["name"]), 30, "CRD")


def _established(api: KubeApi, name: str) -> bool:
    conditions = api.get(CRDS.path(name)).get("status", {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def wait_for(predicate: Callable[[], Any], timeout_s: float = 20.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as exc:  # the API server may be restarting
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or predicate}: last {last!r}")


def serving(proc: subprocess.Popen[bytes] | None, url: str, log: Path) -> bool:
    """Whether the process's readiness endpoint ``url`` answers 200; raises, naming its
    ``log``, once the process has exited."""
    if proc is not None and proc.poll() is not None:
        raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}; see {log}")
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def stamp(offset_s: float = 0.0) -> str:
    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=offset_s)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def set_health(
    api: KubeApi,
    node: str,
    *,
    gpu: str = "True",
    action: str = "NONE",
    codes: tuple[str, ...] = (),
    gpus: tuple[str, ...] = (),
    since_offset_s: float = 0.0,
    network: str = "True",
    network_action: str = "NONE",
    network_codes: tuple[str, ...] = (),
    network_ports: tuple[str, ...] = (),
    deferred: bool = False,
    verify: dict[str, Any] | None = None,
) -> None:
    """Write what an agent would: the three conditions and the report annotation.
    ``deferred``: the GPU layer's repair waits for running work; ``verify``: the report's
    answer to a verify request (``requestedAt``, ``at``, ``passed``, ``codes``)."""
    when = stamp(since_offset_s)
    conditions = [
        {
            "type": kind,
            "status": status,
            "reason": "Healthy" if status == "True" else "Test",
            "message": "set by the test",
            "lastTransitionTime": when,
            "lastHeartbeatTime": when,
        }
        for kind, status in (
            ("GpuguardGPUHealthy", gpu),
            ("GpuguardNetworkHealthy", network),
            ("GpuguardKernelHealthy", "True"),
        )
    ]
    api.patch(f"/api/v1/nodes/{node}/status", {"status": {"conditions": conditions}}, "strategic")
    layers = {
        "gpu": {
            "status": "Healthy" if gpu == "True" else "Unhealthy",
            "action": action,
            "codes": list(codes),
            "gpus": list(gpus),
            **({"deferred": True} if deferred else {}),
        },
        "network": {
            "status": "Healthy" if network == "True" else "Unhealthy",
            "action": network_action,
            "codes": list(network_codes),
            "gpus": [],
            "ports": list(network_ports),
        },
        "kernel": {"status": "Healthy", "action": "NONE", "codes": [], "gpus": []},
    }
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    document: dict[str, Any] = {"reportedAt": now, "layers": layers}
    if verify is not None:
        document["verify"] = verify
    report = json.dumps(document)
    api.patch(
        f"/api/v1/nodes/{node}", {"metadata": {"annotations": {"gpuguard.io/report": report}}}
    )


# Nodes made by make_node, so a fixture can delete them after each test: a sick node left
# behind would hold a disruption-budget slot in the next test's pool.
CREATED_NODES: list[str] = []


def delete_created_nodes(api: KubeApi) -> None:
    while CREATED_NODES:
        with contextlib.suppress(Exception):
            api.delete(f"/api/v1/nodes/{CREATED_NODES.pop()}")


def make_node(
    api: KubeApi,
    name: str,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    unschedulable: bool = False,
) -> None:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
    }
    if unschedulable:
        body["spec"] = {"unschedulable": True}
    api.create("/api/v1/nodes", body)
    CREATED_NODES.append(name)


def make_pod(
    api: KubeApi,
    namespace: str,
    name: str,
    node: str,
    *,
    gpus: int = 0,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": False,
            "containers": [{"name": "main", "image": "busybox", "resources": resources}],
        },
    }
    return api.create(f"/api/v1/namespaces/{namespace}/pods", body)


def pod_budget(api: KubeApi, pod_namespace: str, app: str, max_unavailable: int = 0) -> str:
    """A PodDisruptionBudget over the ``app`` pods; returns its path. There is no
    disruption controller here: until its status is written, every eviction is refused."""
    path = f"/apis/policy/v1/namespaces/{pod_namespace}/poddisruptionbudgets"
    api.create(
        path,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": app},
            "spec": {
                "maxUnavailable": max_unavailable,
                "selector": {"matchLabels": {"app": app}},
            },
        },
    )
    return f"{path}/{app}"


def pod_held_by_a_budget(api: KubeApi, namespace: str, node: str, name: str) -> str:
    """A Running pod ``name`` on ``node`` and a PodDisruptionBudget of the same name that
    refuses every eviction of it (a Pending pod may always be evicted, hence Running).
    Returns the budget's path, for a test that lifts it."""
    make_pod(api, namespace, name, node, labels={"app": name})
    api.patch(
        f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": {"phase": "Running"}}
    )
    return pod_budget(api, namespace, name)


@contextlib.contextmanager
def scratch_namespace(api: KubeApi) -> Iterator[str]:
    """A new namespace; on the way out the test's nodes and episodes, then the namespace."""
    name = f"gg-{uuid.uuid4().hex[:8]}"
    api.create(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    try:
        yield name
    finally:
        delete_created_nodes(api)
        for obj in api.list(NODE_REMEDIATIONS.path()).items:
            api.delete(NODE_REMEDIATIONS.path(obj["metadata"]["name"]))
        api.delete(f"/api/v1/namespaces/{name}")


def finish_terminating_pods(api: KubeApi, namespace: str, stop: threading.Event) -> None:
    """Stand in for the kubelet: no kubelet runs here, so a deleted pod bound to a node
    would keep its deletionTimestamp forever; confirm its end as a kubelet would."""
    while not stop.is_set():
        with contextlib.suppress(Exception):
            for pod in api.list(f"/api/v1/namespaces/{namespace}/pods").items:
                meta = pod["metadata"]
                if meta.get("deletionTimestamp"):
                    with contextlib.suppress(Exception):
                        api.delete(
                            f"/api/v1/namespaces/{namespace}/pods/{meta['name']}",
                            {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
                        )
        stop.wait(0.2)
