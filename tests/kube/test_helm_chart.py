"""The Helm chart against real binaries: helm lint/template, and every object applied to a
real kube-apiserver, then the agent's own credential tried against RBAC and the
ValidatingAdmissionPolicy that pins it to its node.

No kubelet runs: the agent's Pod is created on a Node by name and stays Pending, which is
enough to request a ServiceAccount token bound to it (and so to its node).
"""

from __future__ import annotations

import hashlib
import json
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuguard.config import Config, load_config
from gpuguard.contract.conditions import OWNED_TYPES
from gpuguard.contract.keys import MEMORY_ANNOTATION, VERIFY_REQUEST_ANNOTATION
from gpuguard.kube.client import NodeApi
from gpuguard.kube.errors import KubeRejected
from gpuguard.kube.remediations import NODE_REMEDIATIONS, object_name, save_episode, set_request
from gpuguard.kube.rest import load_api
from gpuguard.model import Action
from gpuguard.remediation.model import Episode, Phase
from tests.support.cluster import install_crds, wait_for
from tests.support.controlplane import REPO, ControlPlane

CHART = REPO / "deploy" / "helm" / "gpuguard"
RELEASE = NAMESPACE = "gpuguard"
SA_USER = f"system:serviceaccount:{NAMESPACE}:gpuguard"
NODE_A, NODE_B = "node-a", "node-b"
AGENT_POD = "gpuguard-agent-node-a"
FIELD_MANAGER = "gpuguard-chart-test"
POLICY_ACTIVE_TIMEOUT_S = 30.0
STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"

Answer = tuple[int, Any]


# --- helm ----------------------------------------------------------------------------


def render(helm: Callable[..., str], *values: str) -> list[dict[str, Any]]:
    settings = [arg for value in values for arg in ("--set", value)]
    out = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *settings)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of ``kind`` (named ``name``: the controller has a ConfigMap and a
    Service of its own, see test_helm_controller.py)."""
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def config_yaml(objects: list[dict[str, Any]]) -> str:
    return str(one(objects, "ConfigMap", "gpuguard")["data"]["config.yaml"])


def test_helm_lint_passes(helm):
    out = helm("lint", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_rendered_daemonset_runs_the_agent_as_specified(helm):
    objects = render(helm)
    pod = one(objects, "DaemonSet")["spec"]["template"]
    spec = pod["spec"]
    (agent,) = spec["containers"]
    assert agent["command"] == ["gpuguard", "agent", "--config", "/etc/gpuguard/config.yaml"]
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    # No GPU is allocated to the agent: it sees them all through the NVIDIA runtime.
    assert "nvidia.com/gpu" not in str(agent["resources"])
    assert agent["resources"]["limits"]["memory"] == "128Mi"
    assert agent["securityContext"]["privileged"] is True  # /dev/kmsg: see the chart README
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert agent[probe]["httpGet"] == {"path": path, "port": "metrics"}
    assert agent["ports"] == [{"name": "metrics", "containerPort": 9465, "protocol": "TCP"}]

    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["kmsg"]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert mounts["kmsg"] == {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True}
    assert volumes["host-sys"]["hostPath"]["path"] == "/sys"
    assert mounts["host-sys"] == {"name": "host-sys", "mountPath": "/host/sys", "readOnly": True}
    config = yaml.safe_load(config_yaml(objects))
    assert config["infiniband_sysfs"] == "/host/sys/class/infiniband"

    # Quarantined (gpuguard.io/unhealthy) and otherwise tainted nodes keep their agent.
    tolerations = spec["tolerations"]
    for effect in ("NoSchedule", "NoExecute"):
        assert {"operator": "Exists", "effect": effect} in tolerations
    assert {"key": "gpuguard.io/unhealthy", "operator": "Exists"} in tolerations

    # The checksum is of the rendered ConfigMap, so any config change rolls the pods.
    checksum = pod["metadata"]["annotations"]["checksum/config"]
    assert checksum == hashlib.sha256(configmap_source(helm).encode()).hexdigest()


def configmap_source(helm: Callable[..., str]) -> str:
    out = helm(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-s", "templates/configmap.yaml"
    )
    # helm prints "---\n# Source: ...\n" before the template's own output.
    return out.split("\n", 2)[2]


def test_values_change_the_rendered_config_and_roll_the_pods(helm, tmp_path):
    default = render(helm)
    eks = render(helm, "config.condition_profile=eks", "config.expected_gpus=8")
    assert yaml.safe_load(config_yaml(default))["condition_profile"] == "gpuguard"
    path = tmp_path / "config.yaml"
    path.write_text(config_yaml(eks))
    config = load_config(path)
    assert config.condition_profile == "eks"
    assert config.expected_gpus == 8

    def checksum(objects: list[dict[str, Any]]) -> str:
        annotations = one(objects, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
        return str(annotations["checksum/config"])

    assert checksum(default) != checksum(eks)


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("config.condition_profile=gke", "condition_profile"),
        ("config.expected_gpus=-1", "expected_gpus"),
        ("config.metrics_port=0", "metrics_port"),
        ("config.expectd_gpus=8", "expectd_gpus"),
        ("config.plugins[0].name=Bad_Name,config.plugins[0].command[0]=/x", "name"),
        ("config.plugins[0].name=a,config.plugins[0].comand[0]=/x", "comand"),
    ],
)
def test_values_schema_refuses_a_config_the_agent_would_refuse(helm, setting, complaint):
    err = helm("template", RELEASE, str(CHART), "--set", setting, ok=False)
    assert complaint in err


def test_plugins_reach_the_agents_config_and_their_directory_is_mounted(helm, tmp_path):
    objects = render(
        helm,
        "config.plugins[0].name=data-mount",
        "config.plugins[0].command[0]=/opt/gpuguard/plugins/mount-responsive.sh",
        "config.plugins[0].command[1]=/data",
        "config.plugins[0].codes.PLUGIN_DATA_MOUNT.severity=critical",
        "plugins.hostPath=/etc/gpuguard/plugins",
    )
    path = tmp_path / "config.yaml"
    path.write_text(config_yaml(objects))
    (plugin,) = load_config(path).plugins
    assert plugin.command == ["/opt/gpuguard/plugins/mount-responsive.sh", "/data"]
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "plugins"]
    assert volume["hostPath"]["path"] == "/etc/gpuguard/plugins"
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "plugins"]
    assert mount == {"name": "plugins", "mountPath": "/opt/gpuguard/plugins", "readOnly": True}
    default = one(render(helm), "DaemonSet")["spec"]["template"]["spec"]
    assert not [v for v in default["volumes"] if v["name"] == "plugins"]


def test_configmap_loads_with_gpuguard_config(helm, tmp_path):
    text = config_yaml(render(helm))
    path = tmp_path / "config.yaml"
    path.write_text(text)
    config = load_config(path)  # raises on any key or value the agent would refuse
    # values.yaml documents every key the agent knows, so none is silently left default.
    assert set(yaml.safe_load(text)) == set(Config.model_fields), "update values.yaml config:"
    assert config.kernel_log == "kmsg"
    assert str(config.infiniband_sysfs) == "/host/sys/class/infiniband"
    assert config.condition_profile == "gpuguard"
    assert config.expected_gpus is None and config.expected_nics is None
    assert config.metrics_port == 9465
    assert config.fail_closed


def test_service_and_optional_servicemonitor(helm):
    objects = render(helm)
    service = one(objects, "Service", "gpuguard-metrics")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9465, "targetPort": "metrics", "protocol": "TCP"}
    ]
    annotations = service["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9465"
    pod_labels = one(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert not [o for o in objects if o["kind"] == "ServiceMonitor"]

    # One per component: tests/kube/test_prometheus_rules.py checks both.
    monitor = one(render(helm, "serviceMonitor.enabled=true"), "ServiceMonitor", "gpuguard")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )


# --- applying the chart ---------------------------------------------------------------


def resource_path(plane: ControlPlane, obj: dict[str, Any]) -> str:
    """The object's URL path, found through API discovery (no table of kinds to go stale)."""
    api_version = obj["apiVersion"]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    discovery = plane.request("GET", base)
    (resource,) = [
        r for r in discovery["resources"] if r["kind"] == obj["kind"] and "/" not in r["name"]
    ]
    meta = obj["metadata"]
    if resource["namespaced"]:
        namespace = meta.get("namespace", NAMESPACE)
        return f"{base}/namespaces/{namespace}/{resource['name']}/{meta['name']}"
    return f"{base}/{resource['name']}/{meta['name']}"


def apply(plane: ControlPlane, obj: dict[str, Any]) -> Answer:
    """Server-side apply, as `kubectl apply --server-side` does; (status, body)."""
    query = urllib.parse.urlencode({"fieldManager": FIELD_MANAGER, "force": "true"})
    path = f"{resource_path(plane, obj)}?{query}"
    try:
        return 200, plane.request("PATCH", path, obj, "application/apply-patch+yaml")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane, helm) -> Iterator[dict[str, dict[str, Any]]]:
    plane = control_plane
    plane.request(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
    )
    applied: dict[str, dict[str, Any]] = {}
    try:
        for obj in render(helm):
            key = f"{obj['kind']}/{obj['metadata']['name']}"
            code, body = apply(plane, obj)
            assert code == 200, f"{key} refused: {body}"
            assert body["kind"] == obj["kind"] and body["metadata"]["uid"], key
            applied[key] = body
        yield applied
    finally:
        for obj in reversed(applied.values()):
            plane.request("DELETE", resource_path(plane, obj))


def test_every_rendered_object_is_accepted_by_the_api_server(installed):
    agent = [
        key
        for key in installed
        if not key.split("/")[1].startswith(("gpuguard-controller", "gpuguard-cleanup"))
    ]
    assert sorted(key.split("/")[0] for key in agent) == sorted(
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
            *["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * 3,
        ]
    )
    # The controller's objects (a Deployment, its policy, RBAC, ...) are checked in
    # test_helm_controller.py; here only that they apply alongside the agent's.
    assert "Deployment/gpuguard-controller" in installed
    assert installed["Role/gpuguard-events"]["metadata"]["namespace"] == "default"
    daemonset = installed["DaemonSet/gpuguard"]
    assert daemonset["metadata"]["namespace"] == NAMESPACE
    pod_spec = daemonset["spec"]["template"]["spec"]
    assert pod_spec["priorityClassName"] == "system-node-critical"
    assert pod_spec["serviceAccountName"] == "gpuguard"
    cleanup = sorted(k.split("/")[0] for k in installed if k.endswith("/gpuguard-cleanup"))
    kinds = ["ClusterRole", "ClusterRoleBinding", "Job", "Role", "RoleBinding", "ServiceAccount"]
    assert cleanup == kinds
    hook = installed["Job/gpuguard-cleanup"]["metadata"]["annotations"]
    assert hook["helm.sh/hook"] == "post-delete"


def test_the_uninstall_hook_may_do_its_cleanup_and_nothing_more(control_plane, installed, tmp_path):
    """The hook Job's own command, with its ServiceAccount's token: RBAC lets it list the
    pods it waits for, read and patch Nodes and their conditions, and no more."""
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    control_plane.request(
        "POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    )
    condition = {"type": "GpuguardGPUHealthy", "status": "False", "reason": "Xid79"}
    control_plane.request(
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        {"status": {"conditions": [condition]}},
        "application/strategic-merge-patch+json",
    )
    token = control_plane.service_account_token(NAMESPACE, "gpuguard-cleanup")
    kubeconfig = tmp_path / "cleanup.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(control_plane.kubeconfig_for_token(token)))
    (container,) = installed["Job/gpuguard-cleanup"]["spec"]["template"]["spec"]["containers"]
    command = [sys.executable, "-m", "gpuguard.cli", *container["command"][1:]]
    command += ["--node", name, "--kubeconfig", str(kubeconfig)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert f"removed {name}: condition GpuguardGPUHealthy" in done.stdout
    left = control_plane.request("GET", f"/api/v1/nodes/{name}")["status"].get("conditions")
    assert not left
    denied = Caller(control_plane, token)("DELETE", f"/api/v1/nodes/{name}")
    assert denied[0] == 403
    control_plane.request("DELETE", f"/api/v1/nodes/{name}")


# --- the agent's credential -----------------------------------------------------------


class Caller:
    """Plain HTTPS calls with a bearer token; returns (status, decoded body), never raises."""

    def __init__(self, plane: ControlPlane, token: str) -> None:
        self.url = plane.url
        self.token = token
        self.context = ssl.create_default_context(cafile=str(plane.certs.path("ca.crt")))

    def __call__(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Answer:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=10) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")


def condition_patch(kind: str = "GpuguardGPUHealthy") -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    condition = {
        "type": kind,
        "status": "True",
        "reason": "Healthy",
        "message": "checked by the chart test",
        "lastTransitionTime": now,
        "lastHeartbeatTime": now,
    }
    return {"status": {"conditions": [condition]}}


def event_about(node: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"generateName": "gpuguard-chart-test-", "namespace": "default"},
        "eventTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
        "reportingController": "gpuguard.io/agent",
        "reportingInstance": f"gpuguard.io/agent/{NODE_A}",
        "action": "HealthChanged",
        "reason": "Healthy",
        "note": "chart test",
        "type": "Normal",
        "regarding": {
            "apiVersion": "v1",
            "kind": "Node",
            "name": node["metadata"]["name"],
            "uid": node["metadata"]["uid"],
        },
    }


def denied_by_policy(answer: Answer, policy: str = "gpuguard-own-node") -> bool:
    code, body = answer
    return code == 403 and f"ValidatingAdmissionPolicy '{policy}'" in str(body.get("message"))


def denied_by_rbac(answer: Answer) -> bool:
    code, body = answer
    return code == 403 and SA_USER in str(body.get("message")) and "cannot" in str(body["message"])


KUBELET_STATUS = {
    "status": {
        "capacity": {"cpu": "192", "memory": "2Ti", "pods": "110", "nvidia.com/gpu": "8"},
        "allocatable": {"cpu": "190", "memory": "2000Gi", "pods": "110", "nvidia.com/gpu": "8"},
        "addresses": [{"type": "InternalIP", "address": "10.0.0.10"}],
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
                "lastHeartbeatTime": "2025-01-01T00:00:00Z",
            }
        ],
    }
}


@pytest.fixture(scope="module")
def nodes(control_plane: ControlPlane, installed) -> Iterator[dict[str, dict[str, Any]]]:
    created = {}
    for name in (NODE_A, NODE_B):
        control_plane.request(
            "POST",
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {"nvidia.com/gpu.present": "true"},
                    "annotations": {"example.com/owner": "someone-else"},
                },
            },
        )
        # What a kubelet would have reported.
        created[name] = control_plane.request(
            "PATCH", f"/api/v1/nodes/{name}/status", KUBELET_STATUS, STRATEGIC
        )
    try:
        yield created
    finally:
        for name in created:
            control_plane.request("DELETE", f"/api/v1/nodes/{name}")


@pytest.fixture(scope="module")
def agent_token(control_plane: ControlPlane, nodes) -> Iterator[str]:
    """What the kubelet would mount into the DaemonSet's Pod on node-a."""
    control_plane.request(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": AGENT_POD, "namespace": NAMESPACE},
            "spec": {
                "nodeName": NODE_A,
                "serviceAccountName": "gpuguard",
                "containers": [{"name": "agent", "image": "gpuguard/gpuguard:0.1.0"}],
            },
        },
    )
    yield control_plane.service_account_token(NAMESPACE, "gpuguard", bound_pod=AGENT_POD)
    control_plane.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{AGENT_POD}")


@pytest.fixture(scope="module")
def agent(control_plane: ControlPlane, agent_token: str) -> Caller:
    """The agent's credential, returned once the admission policy is observed enforcing."""
    call = Caller(control_plane, agent_token)
    # The policy is enforced once the API server's policy informer has synced; until then
    # RBAC alone decides and this write to the other node would succeed.
    wait_for(
        lambda: denied_by_policy(
            call("PATCH", f"/api/v1/nodes/{NODE_B}/status", condition_patch(), STRATEGIC)
        ),
        timeout_s=POLICY_ACTIVE_TIMEOUT_S,
        what="the admission policy to refuse a write to another node",
    )
    wait_for(
        lambda: denied_by_policy(
            call(
                "POST",
                "/apis/events.k8s.io/v1/namespaces/default/events",
                event_about({"metadata": {"name": NODE_B, "uid": "0"}}),
            ),
            "gpuguard-own-node-events",
        ),
        timeout_s=POLICY_ACTIVE_TIMEOUT_S,
        what="the events policy to refuse an Event about another node",
    )
    return call


def node_a(plane: ControlPlane) -> dict[str, Any]:
    answer: dict[str, Any] = plane.request("GET", f"/api/v1/nodes/{NODE_A}")
    return answer


def test_agent_token_names_its_node(control_plane, agent_token):
    review = control_plane.request(
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": agent_token},
        },
    )
    user = review["status"]["user"]
    assert user["username"] == SA_USER
    assert user["extra"]["authentication.kubernetes.io/node-name"] == [NODE_A]


def test_agent_writes_its_own_node(control_plane, agent, nodes):
    code, body = agent("GET", f"/api/v1/nodes/{NODE_A}")
    assert code == 200, body

    code, body = agent(
        "PATCH",
        f"/api/v1/nodes/{NODE_A}/status",
        condition_patch("GpuguardKernelHealthy"),
        STRATEGIC,
    )
    assert code == 200, body
    types = {c["type"] for c in body["status"]["conditions"]}
    assert "GpuguardKernelHealthy" in types

    patch = {"metadata": {"annotations": {MEMORY_ANNOTATION: "boot=abc;XID_79"}}}
    code, body = agent("PATCH", f"/api/v1/nodes/{NODE_A}", patch, MERGE)
    assert code == 200, body
    assert body["metadata"]["annotations"][MEMORY_ANNOTATION] == "boot=abc;XID_79"
    # ... and removes it again (the agent writes null once no lasting finding is left).
    patch = {"metadata": {"annotations": {MEMORY_ANNOTATION: None}}}
    code, body = agent("PATCH", f"/api/v1/nodes/{NODE_A}", patch, MERGE)
    assert code == 200, body
    assert MEMORY_ANNOTATION not in body["metadata"]["annotations"]

    code, body = agent(
        "POST", "/apis/events.k8s.io/v1/namespaces/default/events", event_about(nodes[NODE_A])
    )
    assert code == 201, body


def test_agent_cannot_write_another_node(control_plane, agent, nodes):
    before = control_plane.request("GET", f"/api/v1/nodes/{NODE_B}")
    status_patch = agent("PATCH", f"/api/v1/nodes/{NODE_B}/status", condition_patch(), STRATEGIC)
    assert denied_by_policy(status_patch), status_patch
    assert "may not write Node node-b" in status_patch[1]["message"]
    patch = {"metadata": {"annotations": {MEMORY_ANNOTATION: "x"}}}
    assert denied_by_policy(agent("PATCH", f"/api/v1/nodes/{NODE_B}", patch, MERGE))
    event = agent(
        "POST", "/apis/events.k8s.io/v1/namespaces/default/events", event_about(nodes[NODE_B])
    )
    assert denied_by_policy(event, "gpuguard-own-node-events"), event
    after = control_plane.request("GET", f"/api/v1/nodes/{NODE_B}")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


# Which of the policy's validations refused the change, by the field it touched.
RULE_MESSAGES = {
    "labels": "may not change a Node's labels",
    "annotations": "may change only the gpuguard.io/kernel-findings and",
    "finalizers": "may not change a Node's finalizers",
    "spec": "may not change a Node's spec",
    "conditions": "may write only its own Node conditions",
    "status": "may not change a Node's capacity, allocatable",
}


@pytest.mark.parametrize(
    ("what", "patch", "subresource"),
    [
        ("a label", {"metadata": {"labels": {"nvidia.com/gpu.present": "false"}}}, ""),
        ("a new label", {"metadata": {"labels": {"gpuguard.io/healthy": "true"}}}, ""),
        ("a label, through status", {"metadata": {"labels": {"gpuguard.io/x": "y"}}}, "/status"),
        ("another annotation", {"metadata": {"annotations": {"example.com/owner": "me"}}}, ""),
        (
            "removing another annotation",
            {"metadata": {"annotations": {"example.com/owner": None}}},
            "",
        ),
        ("a new annotation", {"metadata": {"annotations": {"gpuguard.io/other": "x"}}}, ""),
        (
            "an annotation, through status",
            {"metadata": {"annotations": {"gpuguard.io/other": "x"}}},
            "/status",
        ),
        ("a finalizer", {"metadata": {"finalizers": ["example.com/keep"]}}, ""),
        ("cordoning", {"spec": {"unschedulable": True}}, ""),
        (
            "a taint",
            {"spec": {"taints": [{"key": "gpuguard.io/unhealthy", "effect": "NoSchedule"}]}},
            "",
        ),
        ("the provider id", {"spec": {"providerID": "aws:///us-east-1a/i-0"}}, ""),
    ],
)
def test_agent_may_change_nothing_else_on_its_own_node(
    control_plane, agent, what, patch, subresource
):
    before = node_a(control_plane)
    answer = agent("PATCH", f"/api/v1/nodes/{NODE_A}{subresource}", patch, MERGE)
    after = node_a(control_plane)
    # nodes/status resets the spec but keeps metadata changes: the policy covers both.
    assert denied_by_policy(answer), f"{what}: {answer}"
    field = next(iter(patch.get("metadata", {"spec": None})))
    assert RULE_MESSAGES[field] in answer[1]["message"], what
    for part in ("labels", "annotations", "finalizers"):
        assert after["metadata"].get(part) == before["metadata"].get(part), what
    assert after["spec"] == before["spec"], what


def test_agent_annotates_a_node_that_had_no_annotations(control_plane, agent):
    json_patch = "application/json-patch+json"
    saved = node_a(control_plane)["metadata"]["annotations"]
    control_plane.request(
        "PATCH",
        f"/api/v1/nodes/{NODE_A}",
        [{"op": "remove", "path": "/metadata/annotations"}],
        json_patch,
    )
    try:
        patch = {"metadata": {"annotations": {MEMORY_ANNOTATION: "boot=abc;XID_79"}}}
        code, body = agent("PATCH", f"/api/v1/nodes/{NODE_A}", patch, MERGE)
        assert code == 200, body
        assert body["metadata"]["annotations"] == {MEMORY_ANNOTATION: "boot=abc;XID_79"}
    finally:
        control_plane.request(
            "PATCH", f"/api/v1/nodes/{NODE_A}", {"metadata": {"annotations": saved}}, MERGE
        )


def kubelet_condition(status: str) -> dict[str, Any]:
    condition = dict(KUBELET_STATUS["status"]["conditions"][0])
    condition["status"] = status
    return condition


@pytest.mark.parametrize(
    ("what", "patch"),
    [
        ("the kubelet's Ready condition", {"status": {"conditions": [kubelet_condition("False")]}}),
        (
            "deleting the kubelet's Ready condition",
            {"status": {"conditions": [{"$patch": "delete", "type": "Ready"}]}},
        ),
        (
            "a condition gpuguard does not own",
            {"status": {"conditions": [{"type": "MemoryPressure", "status": "True"}]}},
        ),
        ("capacity", {"status": {"capacity": {"nvidia.com/gpu": "0"}}}),
        ("allocatable", {"status": {"allocatable": {"nvidia.com/gpu": "7"}}}),
        ("addresses", {"status": {"addresses": [{"type": "InternalIP", "address": "10.9.9.9"}]}}),
        ("the phase", {"status": {"phase": "Terminated"}}),
    ],
)
def test_agent_may_write_only_its_own_conditions(control_plane, agent, what, patch):
    before = node_a(control_plane)
    answer = agent("PATCH", f"/api/v1/nodes/{NODE_A}/status", patch, STRATEGIC)
    assert denied_by_policy(answer), f"{what}: {answer}"
    field = "conditions" if "conditions" in patch["status"] else "status"
    assert RULE_MESSAGES[field] in answer[1]["message"], what
    assert node_a(control_plane)["status"] == before["status"], what


def test_chart_and_agent_agree_on_owned_condition_types(helm):
    policy = next(
        o
        for o in render(helm)
        if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == "gpuguard-own-node"
    )
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    # A CEL list of single-quoted strings is also a YAML flow sequence.
    assert set(yaml.safe_load(variables["ownedConditionTypes"])) == OWNED_TYPES


def test_a_token_without_a_node_is_refused(control_plane, agent, nodes):
    unbound = Caller(control_plane, control_plane.service_account_token(NAMESPACE, "gpuguard"))
    answer = unbound("PATCH", f"/api/v1/nodes/{NODE_A}/status", condition_patch(), STRATEGIC)
    assert denied_by_policy(answer), answer
    assert "names no node" in answer[1]["message"]
    event = unbound(
        "POST", "/apis/events.k8s.io/v1/namespaces/default/events", event_about(nodes[NODE_A])
    )
    assert denied_by_policy(event, "gpuguard-own-node-events"), event


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("DELETE", f"/api/v1/nodes/{NODE_B}", None),
        ("DELETE", f"/api/v1/nodes/{NODE_A}", None),
        ("GET", "/api/v1/nodes", None),
        ("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "x"}}),
        ("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{AGENT_POD}", None),
        ("GET", "/api/v1/pods", None),
        ("POST", f"/api/v1/namespaces/{NAMESPACE}/pods/{AGENT_POD}/eviction", {}),
        ("GET", "/api/v1/secrets", None),
        ("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets", None),
        ("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/anything", None),
        ("GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps/gpuguard", None),
        ("POST", "/apis/events.k8s.io/v1/namespaces/gpuguard/events", {}),
        ("POST", "/api/v1/namespaces/default/events", {}),
        ("GET", "/apis/events.k8s.io/v1/namespaces/default/events", None),
        (
            "DELETE",
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/gpuguard-own-node",
            None,
        ),
    ],
)
def test_agent_is_refused_everything_it_does_not_need(agent, method, path, body):
    answer = agent(method, path, body)
    assert denied_by_rbac(answer), answer


# --- the agent's own client code --------------------------------------------------------


@pytest.fixture
def agent_api(control_plane: ControlPlane, agent_token: str, agent, tmp_path: Path) -> NodeApi:
    kubeconfig = tmp_path / "agent.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(control_plane.kubeconfig_for_token(agent_token)))
    return NodeApi(load_api(kubeconfig))


def test_agent_client_calls_succeed_for_its_own_node(control_plane, agent_api):
    view = agent_api.get_node(NODE_A)
    assert view.name == NODE_A and view.uid
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    condition = {
        "type": "GpuguardNetworkHealthy",
        "status": "False",
        "reason": "LinkRateDegraded",
        "message": "mlx5_0/1 at 200 Gb/s",
        "lastTransitionTime": now,
        "lastHeartbeatTime": now,
    }
    agent_api.patch_conditions(NODE_A, [condition], remove=["GpuguardGPUHealthy"])
    agent_api.patch_annotations(NODE_A, {MEMORY_ANNOTATION: "from-the-client"})
    assert agent_api.get_node(NODE_A).annotations[MEMORY_ANNOTATION] == "from-the-client"
    agent_api.create_event(
        view,
        reason="LinkRateDegraded",
        note="GpuguardNetworkHealthy: True -> False",
        warning=True,
        controller="gpuguard.io/agent",
        instance=f"gpuguard.io/agent/{NODE_A}",
        action="HealthChanged",
    )
    agent_api.patch_annotations(NODE_A, {MEMORY_ANNOTATION: None})

    node = node_a(control_plane)
    conditions = {c["type"]: c for c in node["status"]["conditions"]}
    assert conditions["GpuguardNetworkHealthy"]["reason"] == "LinkRateDegraded"
    assert "GpuguardGPUHealthy" not in conditions
    assert MEMORY_ANNOTATION not in node["metadata"].get("annotations", {})
    events = control_plane.request("GET", "/apis/events.k8s.io/v1/namespaces/default/events")
    assert any(
        e["regarding"]["name"] == NODE_A and e["reason"] == "LinkRateDegraded"
        for e in events["items"]
    )


def test_agent_client_watches_its_own_node_for_verify_requests(control_plane, agent_api):
    stop = threading.Event()
    seen: list[dict[str, str]] = []

    def follow() -> None:
        seen.extend(agent_api.watch_annotations(NODE_A, stop))

    def annotate(value: str | None) -> None:
        patch = {"metadata": {"annotations": {VERIFY_REQUEST_ANNOTATION: value}}}
        control_plane.request("PATCH", f"/api/v1/nodes/{NODE_A}", patch, MERGE)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        wait_for(lambda: seen, 10, "the Node as it is now")
        assert VERIFY_REQUEST_ANNOTATION not in seen[0]
        annotate("2026-11-29T12:00:00Z")
        wait_for(lambda: VERIFY_REQUEST_ANNOTATION in seen[-1], 10, "the controller's request")
    finally:
        stop.set()
        agent_api.end_watches(stop)
        thread.join(3)
        annotate(None)
    assert not thread.is_alive(), "end_watches did not end the watch"


def test_agent_client_is_refused_another_node(control_plane, agent_api):
    with pytest.raises(KubeRejected, match="403"):
        agent_api.patch_conditions(NODE_B, [condition_patch()["status"]["conditions"][0]], [])
    with pytest.raises(KubeRejected, match="403"):
        agent_api.patch_annotations(NODE_B, {MEMORY_ANNOTATION: "x"})
    other = agent_api.get_node(NODE_B)  # reads are RBAC's alone: any Node may be read
    with pytest.raises(KubeRejected, match="403"):
        agent_api.create_event(
            other,
            reason="Healthy",
            note="not mine",
            warning=False,
            controller="gpuguard.io/agent",
            instance=f"gpuguard.io/agent/{NODE_A}",
            action="HealthChanged",
        )


# --- the agent's own NodeRemediations: status.result and status.started only ------------

REMEDIATIONS_POLICY = "gpuguard-own-remediations"


@pytest.fixture(scope="module")
def episodes(control_plane: ControlPlane, agent: Caller) -> Iterator[dict[str, str]]:
    """An open RESET_GPU episode on each node, as the controller writes it; returned once
    the remediations policy is observed refusing the agent node B's."""
    with load_api(control_plane.admin_kubeconfig) as admin:
        install_crds(admin)
        opened = float(int(time.time()))
        names = {}
        for node in (NODE_A, NODE_B):
            ep = Episode(node=node, opened_at=opened, phase=Phase.ACTING, rung=Action.RESET_GPU)
            ep.attempts = {Action.RESET_GPU: 1}
            save_episode(admin, ep, new=True)
            set_request(admin, ep, Action.RESET_GPU, 1, ("0000:91:00.0",), opened + 1)
            names[node] = object_name(node, opened)
        wait_for(
            lambda: denied_by_policy(
                agent("PATCH", episode_status(names[NODE_B]), started_patch(), MERGE),
                REMEDIATIONS_POLICY,
            ),
            timeout_s=POLICY_ACTIVE_TIMEOUT_S,
            what="the remediations policy to refuse a write to another node's episode",
        )
        yield names
        for name in names.values():
            admin.delete(NODE_REMEDIATIONS.path(name))


def episode_status(name: str) -> str:
    return NODE_REMEDIATIONS.path(name, sub="status")


def started_patch(**more: Any) -> dict[str, Any]:
    mark = {"action": "RESET_GPU", "attempt": 1, "at": "2026-12-01T08:00:00Z", "bootID": "b-1"}
    return {"status": {"started": mark, **more}}


def test_agent_marks_the_start_of_its_own_nodes_repair(agent, episodes):
    code, body = agent("PATCH", episode_status(episodes[NODE_A]), started_patch(), MERGE)
    assert code == 200, body
    assert body["status"]["started"]["bootID"] == "b-1"
    assert body["status"]["phase"] == "Acting"


def test_agent_cannot_mark_another_nodes_repair(agent, episodes):
    answer = agent("PATCH", episode_status(episodes[NODE_B]), started_patch(), MERGE)
    assert denied_by_policy(answer, REMEDIATIONS_POLICY), answer


@pytest.mark.parametrize(
    "more",
    [{"phase": "Verifying"}, {"attempts": {"RESET_GPU": 0}}, {"request": None}],
)
def test_agent_mark_carries_nothing_of_the_controllers(agent, episodes, more):
    answer = agent("PATCH", episode_status(episodes[NODE_A]), started_patch(**more), MERGE)
    assert denied_by_policy(answer, REMEDIATIONS_POLICY), answer
    assert "may change only status.result and status.started" in str(answer[1]["message"])


def test_the_chart_names_no_image_of_its_own(helm):
    # A privileged root DaemonSet must not default to a name a stranger could own.
    err = helm("template", RELEASE, str(CHART), "--set", "image.repository=", ok=False)
    assert "image.repository is not set" in err and "make image" in err
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == ""
    assert values["controller"]["dryRun"] is True  # and it acts on nothing until told
