"""The chart's preflight webhook (templates/preflight-webhook.yaml): off by default; when
on, the controller's own flags (read back by gpuguard's parser), fail open, a Service with
a ClusterIP, and rights on exactly the Secret and the configuration it keeps. The
configuration's CEL and selectors meet the real API server in test_preflight_webhook.py.
"""

from __future__ import annotations

import base64
import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gpuguard.cli import build_parser
from gpuguard.contract.preflight import ENABLED, NAMESPACE_LABEL, SKIP, SKIP_LABEL
from gpuguard.kube.rest import KubeApi, KubeNotFound, KubeRefused, load_api
from gpuguard.preflight import certs
from gpuguard.preflight.cert_rotation import SECRETS, WEBHOOK_CONFIGS, Place, Rotator
from gpuguard.preflight.webhook_server import ServingCert, WebhookMetrics
from tests.support.controlplane import REPO, ControlPlane

CHART = REPO / "deploy" / "helm" / "gpuguard"
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "Secret")
IMAGE = "registry.example/gpuguard-torch:1"  # the check needs PyTorch: an image of one's own

Objects = list[dict[str, Any]]


def render(helm: Callable[..., str], *values: str) -> Objects:
    if "preflight.enabled=true" in values and not any(
        v.startswith("preflight.image=") for v in values
    ):
        values = (*values, f"preflight.image={IMAGE}")
    settings = [arg for value in values for arg in ("--set", value)]
    out = helm("template", "gpuguard", str(CHART), "--namespace", "gpuguard", *settings)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def named(objects: Objects, kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, got {len(found)}"
    return found[0]


def controller_args(objects: Objects) -> Any:
    deployment = named(objects, "Deployment", "gpuguard-controller")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return build_parser().parse_args(container["command"][1:]), container


def test_off_by_default_renders_no_webhook(helm):
    objects = render(helm)
    assert not [o for o in objects if o["kind"] in WEBHOOK_KINDS]
    assert not [o for o in objects if o["metadata"]["name"].endswith("-webhook")]
    args, container = controller_args(objects)
    assert args.webhook_port == 0
    assert [p["name"] for p in container["ports"]] == ["metrics"]


def test_lint_passes_with_the_webhook_on(helm):
    out = helm(
        "lint", str(CHART), "--set", "preflight.enabled=true", "--set", f"preflight.image={IMAGE}"
    )
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_on_the_controller_serves_it_with_the_names_the_chart_made(helm):
    objects = render(helm, "preflight.enabled=true", "preflight.budgetSeconds=45")
    args, container = controller_args(objects)
    assert args.webhook_port == 9443
    assert args.webhook_secret == "gpuguard-webhook-tls"
    assert args.webhook_config == "gpuguard-preflight"
    assert args.webhook_service == "gpuguard-controller-webhook"
    assert args.preflight_image == IMAGE
    assert args.preflight_budget == 45
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in container["ports"]
    named(objects, "Secret", args.webhook_secret)
    service = named(objects, "Service", args.webhook_service)
    assert "clusterIP" not in service["spec"] and service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [
        {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    other = render(helm, "preflight.enabled=true", "preflight.image=mirror/gpuguard:1")
    assert controller_args(other)[0].preflight_image == "mirror/gpuguard:1"


def test_the_configuration_fails_open_for_opted_in_gpu_pods(helm):
    objects = render(helm, "preflight.enabled=true", "preflight.timeoutSeconds=7")
    config = named(objects, "MutatingWebhookConfiguration", "gpuguard-preflight")
    (hook,) = config["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert hook["timeoutSeconds"] == 7
    assert "caBundle" not in hook["clientConfig"]  # the leader's: an upgrade keeps it
    assert hook["clientConfig"]["service"] == {
        "namespace": "gpuguard",
        "name": "gpuguard-controller-webhook",
        "path": "/mutate-pods",
        "port": 443,
    }
    assert hook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["namespaceSelector"] == {"matchLabels": {NAMESPACE_LABEL: ENABLED}}
    assert hook["objectSelector"] == {
        "matchExpressions": [{"key": SKIP_LABEL, "operator": "NotIn", "values": [SKIP]}]
    }
    (condition,) = hook["matchConditions"]
    for wanted in ("'nvidia.com/gpu' in c.resources.limits", "object.spec.resourceClaims"):
        assert wanted in condition["expression"]


def test_the_controller_may_keep_only_its_secret_and_configuration(helm):
    objects = render(helm, "preflight.enabled=true")
    role = named(objects, "Role", "gpuguard-controller-webhook")
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["gpuguard-webhook-tls"],
            "verbs": ["get", "update"],
        }
    ]
    cluster_role = named(objects, "ClusterRole", "gpuguard-controller-webhook")
    assert cluster_role["rules"] == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["mutatingwebhookconfigurations"],
            "resourceNames": ["gpuguard-preflight"],
            "verbs": ["get", "patch"],
        }
    ]
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        binding = named(objects, kind, "gpuguard-controller-webhook")
        assert binding["subjects"][0]["name"] == "gpuguard-controller"


@pytest.mark.parametrize(
    ("settings", "complaint"),
    [
        (("preflight.enabled=true", "controller.enabled=false"), "needs controller.enabled"),
        (("preflight.enabled=true",), "needs preflight.image: an image of gpuguard with PyTorch"),
        (
            ("preflight.enabled=true", f"preflight.image={IMAGE}", "preflight.port=9466"),
            "must differ",
        ),
        (("preflight.timeoutSeconds=31",), "timeoutSeconds"),
        (("preflight.budgetSeconds=0",), "budgetSeconds"),
        (("preflight.colour=blue",), "colour"),
    ],
)
def test_bad_values_are_refused(helm, settings, complaint):
    flags = [arg for value in settings for arg in ("--set", value)]
    err = helm("template", "gpuguard", str(CHART), *flags, ok=False)
    assert complaint in err


# --- the chart's rights, used by gpuguard's own rotation code on the real API server ----


@pytest.fixture
def chart_objects(api: KubeApi, helm: Callable[..., str]) -> Iterator[tuple[str, Objects]]:
    """The chart's preflight objects and the controller's ServiceAccount, created in a
    namespace of their own (the configuration sent only pods of a label nobody has)."""
    release = f"gpuguard-pf{uuid.uuid4().hex[:6]}"
    api.create(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": release}},
    )
    settings = (
        "--set",
        "preflight.enabled=true",
        "--set",
        f"preflight.image={IMAGE}",
        "--namespace",
        release,
    )
    out = helm("template", release, str(CHART), *settings)
    ours = ("-webhook", "-webhook-tls", "-preflight")  # preflight-webhook.yaml's names
    objects = [
        doc
        for doc in yaml.safe_load_all(out)
        if doc
        and (
            doc["metadata"]["name"].endswith(ours)
            or (doc["kind"], doc["metadata"]["name"]) == ("ServiceAccount", f"{release}-controller")
        )
    ]
    created: list[str] = []
    try:
        for obj in objects:
            if obj["kind"] == "MutatingWebhookConfiguration":
                obj["webhooks"][0]["namespaceSelector"] = {
                    "matchLabels": {"gpuguard-test/none": release}
                }
            path = _collection(obj)
            api.create(path, obj)
            created.append(f"{path}/{obj['metadata']['name']}")
        yield release, objects
    finally:
        for path in reversed(created):
            with contextlib.suppress(KubeNotFound):
                api.delete(path)
        api.delete(f"/api/v1/namespaces/{release}")


def _collection(obj: dict[str, Any]) -> str:
    version = obj["apiVersion"]
    base = f"/api/{version}" if "/" not in version else f"/apis/{version}"
    plural = obj["kind"].lower() + ("es" if obj["kind"].endswith("s") else "s")
    namespace = obj["metadata"].get("namespace")
    return f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"


def test_the_controller_keeps_the_certificate_with_the_charts_rights_alone(
    chart_objects, control_plane: ControlPlane, tmp_path: Path
):
    release, objects = chart_objects
    assert sorted(o["kind"] for o in objects) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "Role",
        "RoleBinding",
        "Secret",
        "Service",
        "ServiceAccount",
    ]
    account = next(o for o in objects if o["kind"] == "ServiceAccount")["metadata"]["name"]
    token = control_plane.service_account_token(release, account)
    kubeconfig = tmp_path / "controller.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(control_plane.kubeconfig_for_token(token)))
    leading = threading.Event()
    leading.set()
    place = Place(
        release,
        f"{release}-webhook-tls",
        f"{release}-preflight",
        certs.service_names(f"{release}-controller-webhook", release),
    )
    cert = ServingCert(WebhookMetrics(CollectorRegistry()))
    with load_api(kubeconfig) as controller:
        rotator = Rotator(controller, place, cert, leading)
        rotator.step()  # makes the material, writes the Secret and the caBundle
        rotator.step()  # nothing left to do: reads only
        secret = controller.get(SECRETS.path(place.secret, namespace=release))
        config = controller.get(WEBHOOK_CONFIGS.path(place.webhook_config))
        with pytest.raises(KubeRefused):
            controller.get(SECRETS.path("someone-elses", namespace=release))
        with pytest.raises(KubeRefused):
            controller.get(WEBHOOK_CONFIGS.path("someone-elses"))
    material = certs.material_from({k: base64.b64decode(v) for k, v in secret["data"].items()})
    assert material is not None and cert.served == material.leaf_cert
    bundle = config["webhooks"][0]["clientConfig"]["caBundle"]
    assert base64.b64decode(bundle) == material.ca_bundle()
