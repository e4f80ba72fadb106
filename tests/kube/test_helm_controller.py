"""The chart's remediation controller against real binaries: helm lint/template with each
provider and in dry-run, the policy ConfigMap read by gpuguard's own loader, every object
applied to a real kube-apiserver, and then the controller's and the agent's real
ServiceAccount tokens driving gpuguard's own Kubernetes code (taint, evict, kill, episodes,
Lease, breaker state, NodeClaims) against the chart's RBAC and admission policies.

No kubelet or controller-manager runs: pods bound to a Node by name stay where they are
(their status is set by hand), deleted pods keep their deletionTimestamp, and a
PodDisruptionBudget never gets a status. The release has its own name and namespace, so it
never meets the objects of test_helm_chart.py's release on the shared API server.
"""

from __future__ import annotations

import contextlib
import json
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuguard.agent.repair import BundleRepair, RepairExecutor
from gpuguard.contract.conditions import POSITION_CONDITION
from gpuguard.contract.keys import (
    BREAKER_CONFIGMAP,
    BREAKER_RESET_ANNOTATION,
    INFRASTRUCTURE_FAILURE_CONDITION,
    POSITION_FIXED_ANNOTATION,
)
from gpuguard.controller.breaker_store import BreakerStore
from gpuguard.controller.events import EventRecorder
from gpuguard.controller.loop import LEASE_NAME
from gpuguard.controller.options import PROVIDER_NAMES
from gpuguard.controller.providers import NODECLAIMS, DeleteNodeProvider, KarpenterProvider
from gpuguard.errors import ConfigError
from gpuguard.kube import drain, fleet
from gpuguard.kube.jobs import JOBS, slim_job
from gpuguard.kube.lease import LeaderElector
from gpuguard.kube.remediations import (
    NODE_REMEDIATIONS,
    list_episodes,
    object_name,
    pending_request_for,
    read_result,
    report_result,
    save_episode,
    set_request,
)
from gpuguard.kube.rest import NODES, KubeApi, KubeConflict, KubeNotFound, KubeRefused, load_api
from gpuguard.model import Action
from gpuguard.remediation.model import (
    ActionResult,
    BreakerState,
    Decision,
    DecisionKind,
    Episode,
    Phase,
    Step,
)
from gpuguard.remediation.policy import Policy, build_policy, load_policy
from gpuguard.remediation.policy_sections import Breaker, Budget
from tests.support.clock import FakeClock
from tests.support.cluster import install_crds, make_pod, wait_for
from tests.support.controlplane import REPO, ControlPlane

CHART = REPO / "deploy" / "helm" / "gpuguard"
CRD_FILE = CHART / "crds" / "noderemediations.yaml"
RELEASE, NAMESPACE = "fleet", "gpuguard-fleet"
FULLNAME = "fleet-gpuguard"
CONTROLLER = f"{FULLNAME}-controller"  # its Deployment, ServiceAccount, ConfigMap, roles
AGENT_SA = FULLNAME
CONTROLLER_USER = f"system:serviceaccount:{NAMESPACE}:{CONTROLLER}"
AGENT_USER = f"system:serviceaccount:{NAMESPACE}:{AGENT_SA}"
REMEDIATIONS_POLICY = f"{FULLNAME}-own-remediations"
NAMES_POLICY = f"{CONTROLLER}-names"
NODE_STATUS_POLICY = f"{CONTROLLER}-node-status"
POD_ATTRIBUTION_POLICY = f"{CONTROLLER}-pod-attribution"
NODE_A, NODE_B = "fleet-node-a", "fleet-node-b"
AGENT_POD = f"{FULLNAME}-agent-{NODE_A}"
WORK = "fleet-work"  # where the "training jobs" run: any namespace but the release's
FIELD_MANAGER = "gpuguard-chart-test"
MERGE = "application/merge-patch+json"
POLICY_ACTIVE_TIMEOUT_S = 30.0
RBAC_PROPAGATION_TIMEOUT_S = 20.0
ACTING = "controller.dryRun=false"  # the chart's default is a dry run
VARIANTS = [
    pytest.param((ACTING,), id="karpenter"),
    pytest.param(("controller.provider=delete-node", ACTING), id="delete-node"),
    pytest.param((), id="karpenter-dry-run"),
    pytest.param(("controller.provider=delete-node",), id="delete-dry"),
]

Answer = tuple[int, Any]
Objects = list[dict[str, Any]]


# --- helm ----------------------------------------------------------------------------


def settings(values: tuple[str, ...]) -> list[str]:
    return [arg for value in values for arg in ("--set", value)]


def render(helm: Callable[..., str], *values: str, crds: bool = False) -> Objects:
    extra = ["--include-crds"] if crds else []
    out = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *extra, *settings(values))
    return [doc for doc in yaml.safe_load_all(out) if doc]


def find(objects: Objects, kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, got {len(found)}"
    return found[0]


def policy_text(objects: Objects) -> str:
    return str(find(objects, "ConfigMap", CONTROLLER)["data"]["policy.yaml"])


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


@pytest.mark.parametrize("values", VARIANTS)
def test_helm_lint_passes_with_each_provider_and_dry_run(helm, values):
    out = helm("lint", str(CHART), *settings(values))
    assert "1 chart(s) linted, 0 chart(s) failed" in out


@pytest.mark.parametrize("values", VARIANTS)
def test_rendered_deployment_runs_the_controller(helm, values):
    objects = render(helm, *values)
    deployment = find(objects, "Deployment", CONTROLLER)
    assert deployment["metadata"]["namespace"] == NAMESPACE
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]
    spec = pod["spec"]
    (container,) = spec["containers"]
    provider = "delete-node" if "controller.provider=delete-node" in values else "karpenter"
    expected = [
        "gpuguard",
        "controller",
        "--policy",
        "/etc/gpuguard/policy.yaml",
        "--namespace",
        NAMESPACE,
        "--provider",
        provider,
        "--metrics-port",
        "9466",
        "--gpu-node-selector",  # the agent's nodeSelector: the nodes counted as GPU nodes
        "nvidia.com/gpu.present=true",
    ]
    if ACTING not in values:
        expected.append("--dry-run")
    assert container["command"] == expected
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert container["ports"] == [{"name": "metrics", "containerPort": 9466, "protocol": "TCP"}]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "metrics"}
    assert container["resources"]["limits"] == {"memory": "512Mi"}  # no CPU limit
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["serviceAccountName"] == CONTROLLER
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/etc/gpuguard"]]["configMap"]["name"] == CONTROLLER

    # Quarantined nodes stay usable to it: it is the one that lifts the taints.
    assert {"key": "gpuguard.io/unhealthy", "operator": "Exists", "effect": "NoSchedule"} in (
        spec["tolerations"]
    )
    labels = pod["metadata"]["labels"]
    assert selects(deployment["spec"]["selector"]["matchLabels"], labels)
    spread = {c["topologyKey"]: c for c in spec["topologySpreadConstraints"]}
    hostname = spread["kubernetes.io/hostname"]
    assert hostname["whenUnsatisfiable"] == "DoNotSchedule" and hostname["maxSkew"] == 1
    for constraint in spread.values():
        assert selects(constraint["labelSelector"]["matchLabels"], labels)
        assert constraint["matchLabelKeys"] == ["pod-template-hash"]

    budget = find(objects, "PodDisruptionBudget", CONTROLLER)
    assert budget["spec"]["minAvailable"] == 1
    assert selects(budget["spec"]["selector"]["matchLabels"], labels)
    service = find(objects, "Service", f"{CONTROLLER}-metrics")
    assert selects(service["spec"]["selector"], labels)
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9466, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert service["metadata"]["annotations"]["prometheus.io/port"] == "9466"

    # The agent's selectors must not pick up the controller's pods, nor the other way round.
    daemonset = find(objects, "DaemonSet", FULLNAME)
    agent_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    for agent_selector in (
        daemonset["spec"]["selector"]["matchLabels"],
        find(objects, "Service", f"{FULLNAME}-metrics")["spec"]["selector"],
    ):
        assert not selects(agent_selector, labels)
    for controller_selector in (service["spec"]["selector"], budget["spec"]["selector"]):
        assert not selects(
            controller_selector.get("matchLabels", controller_selector), agent_labels
        )


def test_policy_change_rolls_the_controller(helm):
    def checksum(objects: Objects) -> str:
        pod = find(objects, "Deployment", CONTROLLER)["spec"]["template"]
        return str(pod["metadata"]["annotations"]["checksum/policy"])

    default = render(helm)
    changed = render(helm, "controller.policy.budget.max_unavailable=5")
    assert checksum(default) != checksum(changed)


def test_controller_can_be_left_out(helm):
    objects = render(helm, "controller.enabled=false")
    assert not [o for o in objects if CONTROLLER in o["metadata"]["name"]]
    assert find(objects, "DaemonSet", FULLNAME)


# --- the policy ------------------------------------------------------------------------


def test_policy_configmap_loads_with_load_policy(helm, tmp_path):
    text = policy_text(render(helm))
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    # values.yaml lists every key with the built-in default: the rendered file is exactly
    # the policy the controller would run without one, and no key is left undocumented.
    assert load_policy(path) == Policy()
    data = yaml.safe_load(text)
    assert set(data) == set(Policy.model_fields), "update values.yaml controller.policy"
    assert set(data["budget"]) == set(Budget.model_fields)
    assert set(data["breaker"]) == set(Breaker.model_fields)


def test_policy_values_reach_the_controller(helm, tmp_path):
    objects = render(
        helm,
        "controller.policy.budget.max_unavailable=5",
        "controller.policy.max_attempts.reboot=0",
        "controller.policy.on_drain_timeout=force",
        "controller.policy.tolerances.XID_48=30",
    )
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text(objects))
    policy = load_policy(path)
    assert policy.budget.max_unavailable == 5
    assert policy.attempts_allowed(Action.REBOOT) == 0
    assert policy.on_drain_timeout == "force"
    assert policy.tolerances == {"XID_79": 0, "GPU_FALLEN_OFF_BUS": 0, "XID_48": 30}


def test_schema_lists_every_policy_key():
    schema = json.loads((CHART / "values.schema.json").read_text())
    policy = schema["definitions"]["policy"]["properties"]
    assert set(policy) == set(Policy.model_fields)
    assert set(policy["budget"]["properties"]) == set(Budget.model_fields)
    assert set(policy["breaker"]["properties"]) == set(Breaker.model_fields)
    assert set(schema["properties"]["controller"]["properties"]["provider"]["enum"]) == set(
        PROVIDER_NAMES
    )


@pytest.mark.parametrize(
    ("setting", "policy", "complaint"),
    [
        ("controller.policy.tolerance=1", {"tolerance": 1}, "tolerance"),
        ("controller.policy.on_drain_timeout=evict", {"on_drain_timeout": "evict"}, "drain"),
        ("controller.policy.max_attempts.REIMAGE=1", {"max_attempts": {"REIMAGE": 1}}, "REIMAGE"),
        ("controller.policy.budget.max_unavailable=0", {"budget": {"max_unavailable": 0}}, "max"),
        ("controller.policy.breaker.window_s=0", {"breaker": {"window_s": 0}}, "window_s"),
        ("controller.policy.budget.spare=1", {"budget": {"spare": 1}}, "spare"),
        ("controller.policy.unknown_grace_s=-1", {"unknown_grace_s": -1}, "unknown_grace_s"),
    ],
)
def test_schema_refuses_a_policy_the_controller_would_refuse(helm, setting, policy, complaint):
    with pytest.raises(ConfigError):
        build_policy(policy, "values")
    err = helm("template", RELEASE, str(CHART), "--set", setting, ok=False)
    assert complaint in err


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [("controller.provider=aws", "provider"), ("controller.metricsPort=0", "metricsPort")],
)
def test_schema_refuses_bad_controller_values(helm, setting, complaint):
    err = helm("template", RELEASE, str(CHART), "--set", setting, ok=False)
    assert complaint in err


# --- RBAC as rendered ------------------------------------------------------------------


def verbs_by_resource(role: dict[str, Any]) -> dict[str, set[str]]:
    """``group/resource`` (plus ``@name`` for rules pinned by resourceNames) -> verbs."""
    granted: dict[str, set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for name in rule.get("resourceNames") or [""]:
                    key = f"{group}/{resource}" + (f"@{name}" if name else "")
                    granted.setdefault(key, set()).update(rule["verbs"])
    return granted


NODEREMEDIATION_RIGHTS = {
    "gpuguard.io/noderemediations": {
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
    },
    "gpuguard.io/noderemediations/status": {"get", "update", "patch"},
}


@pytest.mark.parametrize("values", VARIANTS)
def test_controller_cluster_role_follows_provider_and_dry_run(helm, values):
    objects = render(helm, *values)
    granted = verbs_by_resource(find(objects, "ClusterRole", CONTROLLER))
    acting = ACTING in values
    delete_node = "controller.provider=delete-node" in values
    expected = {
        "/nodes": {"get", "list", "watch"}
        | ({"patch"} if acting else set())
        | ({"delete"} if acting and delete_node else set()),
        "/pods": {"get", "list", "watch"} | ({"delete"} if acting else set()),
        "batch/jobs": {"list", "watch"},
        # Events about a judged pod go in the pod's namespace (events.k8s.io requires it).
        "events.k8s.io/events": {"create"},
        **NODEREMEDIATION_RIGHTS,
    }
    if acting:
        expected["/nodes/status"] = {"patch"}  # GpuguardPositionHealthy
        expected["/pods/eviction"] = {"create"}
        expected["/pods/status"] = {"patch"}
        if not delete_node:
            expected["karpenter.sh/nodeclaims"] = {"list", "delete"}
    assert granted == expected

    # In its namespace: the Lease and the breaker ConfigMap by name; create cannot be.
    role = find(objects, "Role", CONTROLLER)
    assert role["metadata"]["namespace"] == NAMESPACE
    assert verbs_by_resource(role) == {
        f"coordination.k8s.io/leases@{LEASE_NAME}": {"get", "update"},
        "coordination.k8s.io/leases": {"create"},
        f"/configmaps@{BREAKER_CONFIGMAP}": {"get", "patch"},
        "/configmaps": {"create"},
    }
    events = find(objects, "RoleBinding", f"{CONTROLLER}-events")
    assert events["metadata"]["namespace"] == "default"  # where controller/events.py writes
    assert events["roleRef"]["name"] == f"{FULLNAME}-events"
    assert verbs_by_resource(find(objects, "Role", f"{FULLNAME}-events")) == {
        "events.k8s.io/events": {"create"}
    }


def test_agent_cluster_role_reads_remediations_and_writes_their_status(helm):
    granted = verbs_by_resource(find(render(helm), "ClusterRole", FULLNAME))
    assert granted == {
        "/nodes": {"get", "watch", "patch"},
        "/nodes/status": {"patch"},
        "gpuguard.io/noderemediations": {"get", "list", "watch"},
        "gpuguard.io/noderemediations/status": {"patch"},
    }


def test_agent_policy_names_every_controller_status_field(helm):
    """The agent may change only status.result and status.started: the policy must name
    every other field of status in the CRD (which prunes unknown ones), or a new field
    would be writable."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    (version,) = crd["spec"]["versions"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    policy = find(render(helm), "ValidatingAdmissionPolicy", REMEDIATIONS_POLICY)
    fields = set()
    for validation in policy["spec"]["validations"]:
        fields |= set(re.findall(r"object\.\?status\.\?(\w+) ==", validation["expression"]))
    assert fields == set(status) - {"result", "started"}


def test_include_crds_renders_the_crd_file(helm):
    crds = [o for o in render(helm, crds=True) if o["kind"] == "CustomResourceDefinition"]
    assert crds == [yaml.safe_load(CRD_FILE.read_text())]


# --- applying the chart ---------------------------------------------------------------


class Caller:
    """Plain HTTPS calls with a bearer token (or the admin certificate when ``token`` is
    empty); returns (status, decoded body) and never raises on an HTTP error."""

    def __init__(self, plane: ControlPlane, token: str = "") -> None:
        self.url = plane.url
        self.token = token
        self.context = (
            ssl.create_default_context(cafile=str(plane.certs.path("ca.crt")))
            if token
            else plane.ssl_context()
        )

    def __call__(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Answer:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=10) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")


def resource_path(admin: Caller, obj: dict[str, Any]) -> str:
    """The object's URL path, found through API discovery."""
    api_version = obj["apiVersion"]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    code, discovery = admin("GET", base)
    assert code == 200, discovery
    (resource,) = [
        r for r in discovery["resources"] if r["kind"] == obj["kind"] and "/" not in r["name"]
    ]
    meta = obj["metadata"]
    if resource["namespaced"]:
        namespace = meta.get("namespace", NAMESPACE)
        return f"{base}/namespaces/{namespace}/{resource['name']}/{meta['name']}"
    return f"{base}/{resource['name']}/{meta['name']}"


def apply(admin: Caller, obj: dict[str, Any], *, dry_run: bool = False) -> Answer:
    """Server-side apply, as `kubectl apply --server-side [--dry-run=server]` does."""
    query = {"fieldManager": FIELD_MANAGER, "force": "true"}
    if dry_run:
        query["dryRun"] = "All"
    path = f"{resource_path(admin, obj)}?{urllib.parse.urlencode(query)}"
    return admin("PATCH", path, obj, "application/apply-patch+yaml")


def ensure_namespace(api: KubeApi, name: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    with contextlib.suppress(KubeConflict):  # AlreadyExists: namespaces are never deleted here
        api.create("/api/v1/namespaces", body)


@pytest.fixture(scope="module")
def admin_api(control_plane: ControlPlane) -> Iterator[KubeApi]:
    with load_api(control_plane.admin_kubeconfig) as api:
        # The chart's CRD from crds/ (helm template leaves crds/ out) and a stand-in for
        # Karpenter's NodeClaim CRD; either may already be there from another module.
        install_crds(api)
        for namespace in (NAMESPACE, WORK):
            ensure_namespace(api, namespace)
        yield api


@pytest.fixture(scope="module")
def admin(control_plane: ControlPlane) -> Caller:
    return Caller(control_plane)


@pytest.fixture(scope="module")
def installed(admin_api: KubeApi, admin: Caller, helm) -> Iterator[dict[str, dict[str, Any]]]:
    applied: dict[str, dict[str, Any]] = {}
    try:
        for obj in render(helm, ACTING):
            key = f"{obj['kind']}/{obj['metadata']['name']}"
            code, body = apply(admin, obj)
            assert code in (200, 201), f"{key} refused: {body}"
            applied[key] = body
        yield applied
    finally:
        for obj in reversed(applied.values()):
            admin("DELETE", resource_path(admin, obj))


def test_every_rendered_object_is_accepted_by_the_api_server(installed):
    controller = sorted(key for key in installed if CONTROLLER in key)
    assert controller == sorted(
        [
            f"ClusterRole/{CONTROLLER}",
            f"ClusterRoleBinding/{CONTROLLER}",
            f"ConfigMap/{CONTROLLER}",
            f"Deployment/{CONTROLLER}",
            f"PodDisruptionBudget/{CONTROLLER}",
            f"Role/{CONTROLLER}",
            f"RoleBinding/{CONTROLLER}",
            f"RoleBinding/{CONTROLLER}-events",
            f"Service/{CONTROLLER}-metrics",
            f"ServiceAccount/{CONTROLLER}",
            f"ValidatingAdmissionPolicy/{NAMES_POLICY}",
            f"ValidatingAdmissionPolicyBinding/{NAMES_POLICY}",
            f"ValidatingAdmissionPolicy/{NODE_STATUS_POLICY}",
            f"ValidatingAdmissionPolicyBinding/{NODE_STATUS_POLICY}",
            f"ValidatingAdmissionPolicy/{POD_ATTRIBUTION_POLICY}",
            f"ValidatingAdmissionPolicyBinding/{POD_ATTRIBUTION_POLICY}",
        ]
    )
    assert f"ValidatingAdmissionPolicy/{REMEDIATIONS_POLICY}" in installed
    deployment = installed[f"Deployment/{CONTROLLER}"]
    # Defaulted by the API server, so the topology spread and probes survived validation.
    spec = deployment["spec"]["template"]["spec"]
    assert len(spec["topologySpreadConstraints"]) == 2
    assert spec["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/readyz"


@pytest.mark.parametrize(
    "values",
    [
        ("controller.provider=delete-node",),
        ("controller.dryRun=true",),
        ("controller.provider=delete-node", "controller.dryRun=true"),
        ("controller.enabled=false",),
    ],
    ids=["delete-node", "dry-run", "delete-node-dry-run", "agent-only"],
)
def test_every_variant_is_accepted_by_the_api_server(installed, admin, helm, values):
    """Server-side dry run: validated and admitted like a real apply, stored nowhere."""
    for obj in render(helm, *values):
        code, body = apply(admin, obj, dry_run=True)
        assert code in (200, 201), f"{obj['kind']}/{obj['metadata']['name']} refused: {body}"


# --- the controller's credential ------------------------------------------------------


def denied_by_rbac(answer: Answer, user: str = CONTROLLER_USER) -> bool:
    code, body = answer
    message = str((body or {}).get("message"))
    return code == 403 and user in message and "cannot" in message


def denied_by_policy(answer: Answer, policy: str) -> bool:
    code, body = answer
    return code == 403 and f"ValidatingAdmissionPolicy '{policy}'" in str(body.get("message"))


def api_for(plane: ControlPlane, token: str, directory: Path) -> KubeApi:
    """gpuguard's own REST client, as the pod would build it, with ``token``."""
    path = directory / "token.kubeconfig"
    path.write_text(yaml.safe_dump(plane.kubeconfig_for_token(token)))
    return load_api(path)


@pytest.fixture(scope="module")
def nodes(admin_api: KubeApi, installed) -> Iterator[list[str]]:
    for name in (NODE_A, NODE_B):
        admin_api.create(
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
                # Someone else's taint: ours must be added beside it and removed alone.
                "spec": {"taints": [{"key": "example.com/dedicated", "effect": "NoSchedule"}]},
            },
        )
    try:
        yield [NODE_A, NODE_B]
    finally:
        for name in (NODE_A, NODE_B):
            with contextlib.suppress(KubeNotFound):
                admin_api.delete(f"/api/v1/nodes/{name}")


@pytest.fixture(scope="module")
def controller_token(control_plane: ControlPlane, installed) -> str:
    return control_plane.service_account_token(NAMESPACE, CONTROLLER)


@pytest.fixture(scope="module")
def controller(control_plane: ControlPlane, controller_token: str, tmp_path_factory) -> KubeApi:
    return api_for(control_plane, controller_token, tmp_path_factory.mktemp("controller"))


@pytest.fixture(scope="module")
def controller_call(control_plane: ControlPlane, controller_token: str) -> Caller:
    return Caller(control_plane, controller_token)


def test_controller_watches_taints_and_cordons_nodes(controller, admin_api, nodes):
    listing = fleet.list_nodes(controller)
    assert {NODE_A, NODE_B} <= {n["metadata"]["name"] for n in listing.items}
    node = next(n for n in listing.items if n["metadata"]["name"] == NODE_A)

    tainted = fleet.taint(controller, node)
    assert fleet.is_tainted(tainted)
    cordoned = fleet.cordon(controller, tainted)
    assert fleet.is_unschedulable(cordoned) and fleet.is_cordoned_by_us(cordoned)
    # The Node cache follows changes with a watch from the list's version.
    seen = [
        event.object["metadata"]["name"]
        for event in controller.watch(
            NODES.path(), resource_version=listing.resource_version, timeout_s=1
        )
        if event.type == "MODIFIED"
    ]
    assert NODE_A in seen

    fleet.uncordon(controller, cordoned)
    back = fleet.untaint(controller, fleet.get_node(controller, NODE_A))
    assert not fleet.is_tainted(back) and not fleet.is_unschedulable(back)
    # The other taints (the fixture's, and the API server's not-ready) are left as they were.
    assert fleet.taints_of(back) == fleet.taints_of(node)


def test_controller_lists_and_watches_jobs_everywhere_and_writes_none(controller, controller_call):
    """The job-success metric's watch (controller/slis.py); a refusal raises KubeRefused."""
    listing = controller.list(JOBS.path(), project=slim_job)  # all namespaces
    for _ in controller.watch(JOBS.path(), resource_version=listing.resource_version, timeout_s=1):
        pass  # the server ends the watch after a second
    assert can(controller_call, "watch", "jobs", "batch")
    for verb in ("create", "update", "patch", "delete"):
        assert not can(controller_call, verb, "jobs", "batch"), verb


@pytest.fixture
def running_pod(admin_api: KubeApi, nodes) -> Iterator[Callable[..., dict[str, Any]]]:
    made: list[str] = []

    def make(name: str, gpus: int = 0) -> dict[str, Any]:
        make_pod(admin_api, WORK, name, NODE_A, gpus=gpus)
        made.append(name)
        # No kubelet runs: report the pod Running as its kubelet would.
        return admin_api.patch(
            f"/api/v1/namespaces/{WORK}/pods/{name}/status", {"status": {"phase": "Running"}}
        )

    yield make
    for name in made:  # no kubelet to finish a graceful deletion: end them at once
        with contextlib.suppress(KubeNotFound):
            admin_api.delete(f"/api/v1/namespaces/{WORK}/pods/{name}", {"gracePeriodSeconds": 0})


def test_controller_evicts_and_kills_pods_on_any_namespace(controller, admin_api, running_pod):
    running_pod("evictee")
    running_pod("training", gpus=8)
    on_node = drain.pods_on_node(controller, NODE_A)  # all namespaces, by field selector
    by_name = {p["metadata"]["name"]: p for p in on_node}
    assert {"evictee", "training"} <= set(by_name)

    counts = drain.evict_pods(controller, [by_name["evictee"]])
    assert (counts.evicted, counts.blocked, counts.failed) == (1, 0, 0), counts.problems
    evicted = admin_api.get(f"/api/v1/namespaces/{WORK}/pods/evictee")
    assert evicted["metadata"].get("deletionTimestamp")

    counts = drain.kill_pods(
        controller, [by_name["training"]], "XID_79 on 0000:91:00.0", now=time.time()
    )
    assert (counts.evicted, counts.failed) == (1, 0), counts.problems
    killed = admin_api.get(f"/api/v1/namespaces/{WORK}/pods/training")
    assert killed["metadata"].get("deletionTimestamp")
    conditions = {c["type"]: c for c in killed["status"].get("conditions") or []}
    assert conditions["DisruptionTarget"]["reason"] == drain.KILL_REASON


def infrastructure_failure(reason: str = "NodeLost") -> dict[str, Any]:
    return {
        "status": {
            "conditions": [
                {
                    "type": INFRASTRUCTURE_FAILURE_CONDITION,
                    "status": "True",
                    "reason": reason,
                    "message": "set by the test",
                    "lastTransitionTime": "2026-12-01T00:00:00Z",
                }
            ]
        }
    }


def test_only_the_controller_may_mark_a_pods_failure_as_the_infrastructures(
    controller_call, admin, running_pod
):
    """The condition excuses a failure from its Job's retry budget, so it is the
    controller's alone: not even a cluster admin (admission policies bind every user) may
    set it, while pod status writes that leave it as it was still go through."""
    path = f"/api/v1/namespaces/{WORK}/pods/forged/status"
    strategic = "application/strategic-merge-patch+json"
    running_pod("forged", gpus=8)
    forged = wait_for(
        lambda: (
            answer
            if denied_by_policy(
                answer := admin("PATCH", path, infrastructure_failure(), strategic),
                POD_ATTRIBUTION_POLICY,
            )
            else None
        ),
        POLICY_ACTIVE_TIMEOUT_S,
        "the pod attribution policy in force",
    )
    assert "only the gpuguard controller" in forged[1]["message"]

    code, body = controller_call("PATCH", path, infrastructure_failure(), strategic)
    assert code == 200, body
    ready = {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    code, body = admin("PATCH", path, ready, strategic)  # ours left as it was
    assert code == 200, body
    changed = admin("PATCH", path, infrastructure_failure("GpuFault"), strategic)
    assert denied_by_policy(changed, POD_ATTRIBUTION_POLICY)


def episode_on(node: str, opened_at: float) -> Episode:
    return Episode(
        node=node,
        opened_at=opened_at,
        phase=Phase.ACTING,
        rung=Action.RESET_GPU,
        attempts={Action.RESET_GPU: 1},
        phase_since=opened_at,
        last_action_at=opened_at,
        gpus=("0000:91:00.0",),
        steps=[Step(at=opened_at, phase=Phase.ACTING, message="reset 0000:91:00.0")],
    )


def test_controller_records_episodes_and_events(controller, admin_api, nodes):
    opened = float(int(time.time()))
    episode = episode_on(NODE_A, opened)
    save_episode(controller, episode)  # creates the object, then patches its status
    save_episode(controller, episode)  # idempotent: patches again
    assert set_request(controller, episode, Action.RESET_GPU, 1, episode.gpus, opened + 1)
    assert read_result(controller, episode) is None
    open_episodes, _ = list_episodes(controller)
    assert open_episodes[NODE_A].opened_at == opened
    stored = admin_api.get(NODE_REMEDIATIONS.path(object_name(NODE_A, opened)))
    assert stored["status"]["request"]["action"] == "RESET_GPU"

    EventRecorder(controller, "fleet-controller-0").record(
        episode, Decision(DecisionKind.RECORD, NODE_A, "chart test"), opened
    )  # best effort by design: it logs a refusal, so look for the Event itself
    events = admin_api.list("/apis/events.k8s.io/v1/namespaces/default/events").items
    assert any(
        e["regarding"]["name"] == NODE_A and e["reportingInstance"] == "fleet-controller-0"
        for e in events
    )
    admin_api.delete(NODE_REMEDIATIONS.path(object_name(NODE_A, opened)))


def test_controller_writes_its_position_condition_and_takes_a_persons_mark(
    controller, admin_api, nodes
):
    """Its own condition type (and only it) in status; the position-fixed mark off."""
    admin_api.patch(
        NODES.path(NODE_A), {"metadata": {"annotations": {POSITION_FIXED_ANNOTATION: "t-1"}}}
    )
    held = {"type": POSITION_CONDITION, "status": "False", "reason": "PositionAtFault"}
    fleet.patch_conditions(controller, NODE_A, [held | {"message": "chart test"}])
    controller.patch(
        NODES.path(NODE_A), {"metadata": {"annotations": {POSITION_FIXED_ANNOTATION: None}}}
    )
    node = admin_api.get(NODES.path(NODE_A))
    assert POSITION_FIXED_ANNOTATION not in (node["metadata"].get("annotations") or {})
    (ours,) = [c for c in node["status"]["conditions"] if c["type"] == POSITION_CONDITION]
    assert ours["status"] == "False"
    fleet.patch_conditions(controller, NODE_A, [], remove=[POSITION_CONDITION])


def test_controller_holds_its_lease_and_breaker_state(controller, installed):
    now = time.time()
    clock = FakeClock(now)
    elector = LeaderElector(controller, NAMESPACE, LEASE_NAME, "fleet-controller-0", clock=clock)
    assert elector.try_acquire_or_renew()  # creates the Lease
    clock.step(5)
    assert elector.try_acquire_or_renew()  # renews it (get + update)
    elector.release()
    rival = LeaderElector(controller, NAMESPACE, LEASE_NAME, "fleet-controller-1", clock=clock)
    clock.step(1)
    assert rival.try_acquire_or_renew()  # released: taken at once

    store = BreakerStore(controller, NAMESPACE)
    store.load()
    assert not store.reset_requested(time.time())
    store.save(BreakerState(open=True, opened_at=now, reason="chart test"))  # creates
    store.save(BreakerState())  # patches
    store.load()
    assert store.state == BreakerState()


def test_controller_breaker_reset_annotation_round_trip(controller, admin_api, installed):
    store = BreakerStore(controller, NAMESPACE)
    store.load()
    store.save(BreakerState(open=True, opened_at=time.time(), reason="chart test"))
    path = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{BREAKER_CONFIGMAP}"
    admin_api.patch(path, {"metadata": {"annotations": {BREAKER_RESET_ANNOTATION: "now"}}})
    assert store.reset_requested(time.time())
    store.save(BreakerState())  # removes the annotation with the reset
    assert BREAKER_RESET_ANNOTATION not in (
        admin_api.get(path)["metadata"].get("annotations") or {}
    )


def test_karpenter_provider_deletes_the_nodeclaim(controller, admin_api, nodes):
    claims = NODECLAIMS.path()
    admin_api.create(
        claims,
        {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": "fleet-a"}},
    )
    admin_api.patch(NODECLAIMS.path("fleet-a", sub="status"), {"status": {"nodeName": NODE_A}})
    assert KarpenterProvider(controller).replace(NODE_A)
    with pytest.raises(KubeNotFound):
        admin_api.get(NODECLAIMS.path("fleet-a"))


@pytest.mark.parametrize(
    ("what", "method", "path", "body"),
    [
        ("secrets, cluster-wide", "GET", "/api/v1/secrets", None),
        ("secrets, its namespace", "GET", f"/api/v1/namespaces/{NAMESPACE}/secrets", None),
        ("a secret", "GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/anything", None),
        (
            "a Lease elsewhere",
            "GET",
            f"/apis/coordination.k8s.io/v1/namespaces/default/leases/{LEASE_NAME}",
            None,
        ),
        (
            "creating a Lease elsewhere",
            "POST",
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases",
            {"metadata": {"name": LEASE_NAME}, "spec": {}},
        ),
        (
            "updating a Lease elsewhere",
            "PUT",
            f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{LEASE_NAME}",
            {"metadata": {"name": LEASE_NAME}, "spec": {}},
        ),
        (
            "another Lease in its namespace",
            "PUT",
            f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/other",
            {"metadata": {"name": "other"}, "spec": {}},
        ),
        (
            "listing Leases",
            "GET",
            f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases",
            None,
        ),
        (
            "rewriting its own policy",
            "PATCH",
            f"/api/v1/namespaces/{NAMESPACE}/configmaps/{CONTROLLER}",
            {"data": {"policy.yaml": "budget: {max_unavailable: 1000}"}},
        ),
        ("listing ConfigMaps", "GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps", None),
        (
            "the breaker state elsewhere",
            "GET",
            f"/api/v1/namespaces/default/configmaps/{BREAKER_CONFIGMAP}",
            None,
        ),
        ("deleting a Node (karpenter)", "DELETE", f"/api/v1/nodes/{NODE_B}", None),
        ("creating a Node", "POST", "/api/v1/nodes", {"metadata": {"name": "fleet-x"}}),
        ("creating a pod", "POST", f"/api/v1/namespaces/{WORK}/pods", {"metadata": {}}),
        ("deleting every pod", "DELETE", f"/api/v1/namespaces/{WORK}/pods", None),
        ("reading a NodeClaim", "GET", f"{NODECLAIMS.path('fleet-a')}", None),
        (
            "changing its own Deployment",
            "PATCH",
            f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{CONTROLLER}",
            {"spec": {"replicas": 0}},
        ),
        (
            "binding itself to cluster-admin",
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "metadata": {"name": "fleet-escalate"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "cluster-admin",
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": CONTROLLER, "namespace": NAMESPACE}
                ],
            },
        ),
    ],
)
def test_controller_is_refused_everything_it_does_not_need(
    controller_call, nodes, what, method, path, body
):
    answer = controller_call(method, path, body, MERGE if method == "PATCH" else "application/json")
    assert denied_by_rbac(answer), f"{what}: {answer}"


def test_controller_may_create_only_its_own_lease_and_configmap(controller_call, admin_api):
    """RBAC cannot pin a create to a name; the admission policy does."""
    configmaps = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "fleet-stolen"}}
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
    lease["metadata"] = {"name": "fleet-stolen"}
    try:
        # Enforced once the API server's policy informer has synced.
        wait_for(
            lambda: denied_by_policy(controller_call("POST", configmaps, configmap), NAMES_POLICY),
            timeout_s=POLICY_ACTIVE_TIMEOUT_S,
            what="the names policy to refuse another ConfigMap",
        )
        answer = controller_call("POST", leases, lease)
        assert denied_by_policy(answer, NAMES_POLICY), answer
        assert "may create only the Lease gpuguard-controller" in answer[1]["message"]
    finally:
        for path in (f"{configmaps}/fleet-stolen", f"{leases}/fleet-stolen"):
            with contextlib.suppress(KubeNotFound):
                admin_api.delete(path)


def test_controller_may_write_no_node_condition_but_its_own(controller, controller_call, nodes):
    """RBAC grants nodes/status for GpuguardPositionHealthy; the admission policy keeps the
    controller to that one type (never the agent's, nor the kubelet's, nor metadata)."""
    status = f"/api/v1/nodes/{NODE_B}/status"
    strategic = "application/strategic-merge-patch+json"
    forged = {"status": {"conditions": [{"type": "GpuguardGPUHealthy", "status": "True"}]}}
    wait_for(
        lambda: denied_by_policy(
            controller_call("PATCH", status, forged, strategic), NODE_STATUS_POLICY
        ),
        timeout_s=POLICY_ACTIVE_TIMEOUT_S,
        what="the node-status policy to refuse an agent's condition",
    )
    relabel = {"metadata": {"labels": {"rack": "elsewhere"}}}
    answer = controller_call("PATCH", status, relabel, strategic)
    assert denied_by_policy(answer, NODE_STATUS_POLICY), answer
    ours = {"type": POSITION_CONDITION, "status": "True", "reason": "PositionReturned"}
    fleet.patch_conditions(controller, NODE_B, [ours])
    fleet.patch_conditions(controller, NODE_B, [], remove=[POSITION_CONDITION])


# --- the rights that depend on provider and dryRun ------------------------------------


def can(call: Caller, verb: str, resource: str, group: str = "", name: str = "") -> bool:
    """What the API server's authorizer now says (a SelfSubjectAccessReview)."""
    code, body = call(
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    "name": name,
                }
            },
        },
    )
    assert code == 201, body
    return bool(body["status"]["allowed"])


@pytest.fixture
def cluster_role_of(admin: Caller, helm, controller_call) -> Iterator[Callable[..., None]]:
    """Re-apply the controller's ClusterRole as rendered with other values; restored after."""

    def switch(*values: str) -> None:
        role = find(render(helm, ACTING, *values), "ClusterRole", CONTROLLER)
        code, body = apply(admin, role)
        assert code in (200, 201), body

    yield switch
    switch()
    wait_for(
        lambda: (
            can(controller_call, "patch", "nodes") and not can(controller_call, "delete", "nodes")
        ),
        RBAC_PROPAGATION_TIMEOUT_S,
        "the default ClusterRole back",
    )


def test_delete_node_provider_may_delete_nodes(
    cluster_role_of, controller, controller_call, admin_api, installed
):
    admin_api.create(
        "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "fleet-doomed"}}
    )
    try:
        cluster_role_of("controller.provider=delete-node")
        wait_for(lambda: can(controller_call, "delete", "nodes"), RBAC_PROPAGATION_TIMEOUT_S)
        assert not can(controller_call, "delete", "nodeclaims", "karpenter.sh")
        assert DeleteNodeProvider(controller).replace("fleet-doomed")
        with pytest.raises(KubeNotFound):
            admin_api.get("/api/v1/nodes/fleet-doomed")
    finally:
        with contextlib.suppress(KubeNotFound):
            admin_api.delete("/api/v1/nodes/fleet-doomed")


def test_dry_run_role_records_but_cannot_disrupt(
    cluster_role_of, controller, controller_call, admin_api, nodes, running_pod
):
    pod = running_pod("bystander")
    cluster_role_of("controller.dryRun=true")
    wait_for(lambda: not can(controller_call, "patch", "nodes"), RBAC_PROPAGATION_TIMEOUT_S)
    with pytest.raises(KubeRefused, match="403"):  # nor its own condition
        fleet.patch_conditions(controller, NODE_A, [{"type": POSITION_CONDITION, "status": "True"}])
    with pytest.raises(KubeRefused, match="403"):
        fleet.taint(controller, fleet.get_node(controller, NODE_A))
    counts = drain.evict_pods(controller, [pod])
    assert counts.failed == 1 and counts.evicted == 0
    counts = drain.kill_pods(controller, [pod], "dry run", now=time.time())
    assert counts.failed == 1
    assert not admin_api.get(f"/api/v1/namespaces/{WORK}/pods/bystander")["metadata"].get(
        "deletionTimestamp"
    )
    assert not can(controller_call, "delete", "nodeclaims", "karpenter.sh")
    # What a dry run does write: the episodes (and the Lease, breaker, Events as before).
    opened = float(int(time.time())) + 10
    episode = episode_on(NODE_B, opened)
    save_episode(controller, episode)
    assert drain.evictable_count(controller, NODE_A) >= 1  # a drain's progress is still read
    admin_api.delete(NODE_REMEDIATIONS.path(object_name(NODE_B, opened)))


# --- the agent's credential and the NodeRemediations -----------------------------------


@pytest.fixture(scope="module")
def agent_token(control_plane: ControlPlane, admin_api: KubeApi, nodes) -> Iterator[str]:
    """What the kubelet would mount into the agent's Pod on node A."""
    admin_api.create(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": AGENT_POD},
            "spec": {
                "nodeName": NODE_A,
                "serviceAccountName": AGENT_SA,
                "containers": [{"name": "agent", "image": "gpuguard/gpuguard:0.1.0"}],
            },
        },
    )
    yield control_plane.service_account_token(NAMESPACE, AGENT_SA, bound_pod=AGENT_POD)
    admin_api.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{AGENT_POD}", {"gracePeriodSeconds": 0})


@pytest.fixture(scope="module")
def episodes(controller: KubeApi, admin_api: KubeApi, nodes) -> Iterator[dict[str, str]]:
    """An open episode with a RESET_GPU request on each node, written by the controller."""
    opened = float(int(time.time())) + 100
    names = {}
    for node in (NODE_A, NODE_B):
        episode = episode_on(node, opened)
        save_episode(controller, episode)
        set_request(controller, episode, Action.RESET_GPU, 1, episode.gpus, opened + 1)
        names[node] = object_name(node, opened)
    yield names
    for name in names.values():
        admin_api.delete(NODE_REMEDIATIONS.path(name))


def result_patch(note: str) -> dict[str, Any]:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result = {"action": "RESET_GPU", "attempt": 1, "succeeded": True, "at": stamp}
    return {"status": {"result": {**result, "message": note}}}


def status_path(name: str) -> str:
    return NODE_REMEDIATIONS.path(name, sub="status")


@pytest.fixture(scope="module")
def agent_call(control_plane: ControlPlane, agent_token: str, episodes) -> Caller:
    """The agent's credential, once the admission policy is observed enforcing."""
    call = Caller(control_plane, agent_token)
    wait_for(
        lambda: denied_by_policy(
            call("PATCH", status_path(episodes[NODE_B]), result_patch("probe"), MERGE),
            REMEDIATIONS_POLICY,
        ),
        timeout_s=POLICY_ACTIVE_TIMEOUT_S,
        what="the remediations policy to refuse a write to another node's episode",
    )
    return call


@pytest.fixture(scope="module")
def agent(control_plane: ControlPlane, agent_token: str, agent_call, tmp_path_factory) -> KubeApi:
    return api_for(control_plane, agent_token, tmp_path_factory.mktemp("agent"))


def test_agent_performs_and_answers_its_own_nodes_request(agent, admin_api, episodes, tmp_path):
    """The agent's real repair loop, with the bundle backend and the agent's token."""
    pending = pending_request_for(agent, NODE_A)  # list by field selector spec.nodeName
    assert pending is not None and pending[0] == episodes[NODE_A]
    repairs = tmp_path / "repairs.log"
    done: list[Action] = []
    executor = RepairExecutor(
        agent, NODE_A, BundleRepair(repairs), lambda action, gpus, at: done.append(action)
    )
    result = executor.poll_once()
    assert result is not None and result.succeeded, result
    assert repairs.read_text() == "reset 0000:91:00.0\n"
    assert done == [Action.RESET_GPU]
    stored = admin_api.get(NODE_REMEDIATIONS.path(episodes[NODE_A]))
    assert stored["status"]["result"]["succeeded"] is True
    assert stored["status"]["phase"] == "Acting"  # the controller's part is untouched
    assert pending_request_for(agent, NODE_A) is None  # answered


def test_agent_cannot_answer_another_nodes_request(agent, agent_call, admin_api, episodes):
    before = admin_api.get(NODE_REMEDIATIONS.path(episodes[NODE_B]))
    answer = agent_call("PATCH", status_path(episodes[NODE_B]), result_patch("not mine"), MERGE)
    assert denied_by_policy(answer, REMEDIATIONS_POLICY), answer
    assert f"may not write NodeRemediation {episodes[NODE_B]} of node {NODE_B}" in str(
        answer[1]["message"]
    )
    result = ActionResult(1, Action.RESET_GPU, True, time.time(), "not mine")
    with pytest.raises(KubeRefused, match="403"):
        report_result(agent, episodes[NODE_B], result)
    after = admin_api.get(NODE_REMEDIATIONS.path(episodes[NODE_B]))
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


@pytest.mark.parametrize(
    ("what", "status"),
    [
        ("the phase", {"phase": "Closed"}),
        (
            "the request",
            {"request": {"action": "REBOOT", "attempt": 1, "requestedAt": "2026-11-29T19:00:00Z"}},
        ),
        ("removing the request", {"request": None}),
        ("the steps", {"steps": []}),
        ("the attempts", {"attempts": {"RESET_GPU": 0}}),
        ("the resolution", {"resolution": "Repaired"}),
        ("the result and the phase", {**result_patch("x")["status"], "phase": "Verifying"}),
    ],
)
def test_agent_may_change_only_the_result(agent_call, admin_api, episodes, what, status):
    before = admin_api.get(NODE_REMEDIATIONS.path(episodes[NODE_A]))
    answer = agent_call("PATCH", status_path(episodes[NODE_A]), {"status": status}, MERGE)
    assert denied_by_policy(answer, REMEDIATIONS_POLICY), f"{what}: {answer}"
    assert "may change only status.result" in str(answer[1]["message"]), what
    after = admin_api.get(NODE_REMEDIATIONS.path(episodes[NODE_A]))
    assert after["status"] == before["status"], what


@pytest.mark.parametrize(
    ("what", "method", "path", "body"),
    [
        (
            "the object itself",
            "PATCH",
            NODE_REMEDIATIONS.path(f"{NODE_A}-1"),
            {"metadata": {"labels": {"x": "y"}}},
        ),
        ("creating an episode", "POST", NODE_REMEDIATIONS.path(), {"metadata": {"name": "x"}}),
        ("deleting an episode", "DELETE", NODE_REMEDIATIONS.path(f"{NODE_A}-1"), None),
        (
            "the leader Lease",
            "GET",
            f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE_NAME}",
            None,
        ),
        ("evicting a pod", "POST", f"/api/v1/namespaces/{WORK}/pods/x/eviction", {}),
    ],
)
def test_agent_is_refused_the_controllers_part(agent_call, what, method, path, body):
    answer = agent_call(method, path, body, MERGE if method == "PATCH" else "application/json")
    assert denied_by_rbac(answer, AGENT_USER), f"{what}: {answer}"


def test_agent_may_read_every_episode(agent_call, episodes):
    """RBAC cannot honour a field selector: reads are not confined to the agent's node."""
    code, body = agent_call("GET", NODE_REMEDIATIONS.path(episodes[NODE_B]))
    assert code == 200, body


def test_a_token_without_a_node_cannot_answer(control_plane, agent_call, episodes):
    unbound = Caller(control_plane, control_plane.service_account_token(NAMESPACE, AGENT_SA))
    answer = unbound("PATCH", status_path(episodes[NODE_A]), result_patch("unbound"), MERGE)
    assert denied_by_policy(answer, REMEDIATIONS_POLICY), answer
    assert "names no node" in str(answer[1]["message"])
