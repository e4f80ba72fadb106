"""The preflight webhook on the real kube-apiserver: served on loopback with gpuguard's
own certificate (made, published into the caBundle and rotated by the code the
controller runs), called by the API server for the pods it creates.

The configuration's namespaceSelector also asks for a label unique to this module, so
no other test's pods ever reach it; it is deleted afterwards. Time for the certificates
is a clock the tests move: the certificates are backdated a year, so they stay valid to
the API server (which reads the real time) however far the tests move it.
"""

from __future__ import annotations

import base64
import contextlib
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from prometheus_client import CollectorRegistry

from gpuguard.contract.preflight import ENABLED, INIT_CONTAINER, NAMESPACE_LABEL
from gpuguard.kube.rest import Json, KubeApi
from gpuguard.preflight.cert_rotation import SECRETS, WEBHOOK_CONFIGS
from gpuguard.preflight.certs import DAY_S, SECRET_KEYS, Lifetimes
from gpuguard.preflight.gate import Gate, Running, start_gate
from gpuguard.preflight.mutate import Settings
from tests.support.clock import FakeClock
from tests.support.cluster import wait_for
from tests.support.controlplane import REPO, ControlPlane, free_port
from tests.support.metrics import sample

IMAGE = "registry.example/gpuguard:test"
LIFETIMES = Lifetimes(ca_s=30 * DAY_S, leaf_s=3 * DAY_S, backdate_s=365 * DAY_S, settle_s=60)
TEST_LABEL = "gpuguard-test/preflight-webhook"
CHART = REPO / "deploy" / "helm" / "gpuguard"


@dataclass
class Webhook:
    api: KubeApi
    plane: ControlPlane
    running: Running
    registry: CollectorRegistry
    clock: FakeClock
    config: str
    label: str
    port: int
    opted_in: str  # a namespace labelled for this module's configuration
    plain: str  # a namespace that is not

    def results(self, result: str) -> float:
        return sample(self.registry, "gpuguard_webhook_requests_total", result=result)


def _namespace(api: KubeApi, labels: dict[str, str]) -> str:
    name = f"gg-pf-{uuid.uuid4().hex[:8]}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    api.create("/api/v1/namespaces", body)
    return name


def _configuration(helm: Callable[..., str], name: str, port: int, label: str) -> Json:
    """The chart's configuration (rules, selectors, matchConditions, fail open, no
    caBundle) under a name of this module's, addressed by URL on loopback, and sent only
    pods of namespaces that also carry this module's label."""
    settings = ("--set", "preflight.enabled=true", "--set", "preflight.image=gpuguard-torch:1")
    rendered = helm("template", "gpuguard", str(CHART), *settings)
    kind = "MutatingWebhookConfiguration"
    (config,) = [doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] == kind]
    config["metadata"] = {"name": name}
    (hook,) = config["webhooks"]
    assert "caBundle" not in hook["clientConfig"]
    hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/mutate-pods"}
    hook["namespaceSelector"]["matchLabels"][TEST_LABEL] = label
    hook["name"] = f"preflight-{label}.gpuguard.io"  # the API server's metrics name it
    return config


@pytest.fixture(scope="module")
def webhook(
    api: KubeApi, control_plane: ControlPlane, helm: Callable[..., str]
) -> Iterator[Webhook]:
    label = uuid.uuid4().hex[:12]
    opted_in = _namespace(api, {NAMESPACE_LABEL: ENABLED, TEST_LABEL: label})
    plain = _namespace(api, {})
    port, config = free_port(), f"gpuguard-preflight-test-{label}"
    api.create(WEBHOOK_CONFIGS.path(), _configuration(helm, config, port, label))
    gate = Gate(
        port=port,
        namespace=opted_in,
        secret="gpuguard-webhook-tls",
        webhook_config=config,
        service="gpuguard-controller-webhook",
        settings=Settings(image=IMAGE, budget_s=30),
        ips=("127.0.0.1",),
        host="127.0.0.1",
    )
    registry, clock, stop, leading = (
        CollectorRegistry(),
        FakeClock(time.time()),
        threading.Event(),
        threading.Event(),
    )
    leading.set()
    running = start_gate(
        gate, api, leading, registry, stop, lifetimes=LIFETIMES, clock=clock, every_s=0.1
    )
    try:
        yield Webhook(
            api, control_plane, running, registry, clock, config, label, port, opted_in, plain
        )
    finally:
        stop.set()
        running.thread.join(5)
        with contextlib.suppress(OSError):
            running.shutdown()
        api.delete(WEBHOOK_CONFIGS.path(config))
        now = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
        for namespace in (opted_in, plain):
            api.delete(f"/api/v1/namespaces/{namespace}/pods", now)
            api.delete(f"/api/v1/namespaces/{namespace}")


def gpu_pod(gpus: int = 2, **spec: Any) -> Json:
    container = {
        "name": "train",
        "image": "train:1",
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p-{uuid.uuid4().hex[:8]}"},
        "spec": {"containers": [container], **spec},
    }


def create(webhook: Webhook, namespace: str, pod: Json) -> Json:
    return webhook.api.create(f"/api/v1/namespaces/{namespace}/pods", pod)


def init_names(pod: Json) -> list[str]:
    return [c["name"] for c in pod["spec"].get("initContainers") or []]


def mutated_when_created(webhook: Webhook) -> Json:
    """A GPU pod created in the opted-in namespace, once a create is mutated (the API
    server picks the configuration's caBundle up a moment after it is written)."""

    def attempt() -> Json | None:
        pod = create(webhook, webhook.opted_in, gpu_pod())
        return pod if INIT_CONTAINER in init_names(pod) else None

    return wait_for(attempt, 30, "a GPU pod mutated")


def served_certificate(port: int) -> x509.Certificate:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    with context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def ca_bundle(webhook: Webhook) -> list[x509.Certificate]:
    config = webhook.api.get(WEBHOOK_CONFIGS.path(webhook.config))
    pem = base64.b64decode(config["webhooks"][0]["clientConfig"].get("caBundle") or "")
    return x509.load_pem_x509_certificates(pem) if pem else []


def test_a_gpu_pod_in_an_opted_in_namespace_gets_the_check_first(webhook):
    pod = mutated_when_created(webhook)
    users_init = {"name": "fetch", "image": "busybox"}
    pod = create(webhook, webhook.opted_in, gpu_pod(4, initContainers=[users_init]))
    assert init_names(pod) == [INIT_CONTAINER, "fetch"]
    check = pod["spec"]["initContainers"][0]
    assert check["image"] == IMAGE
    assert check["args"] == ["preflight", "--budget", "30"]
    assert check["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert check["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert {e["name"] for e in check["env"]} == {"NODE_NAME", "POD_NAME", "POD_NAMESPACE"}
    assert webhook.results("mutated") >= 2


def test_a_dra_pod_shares_its_claims_with_the_check(webhook):
    mutated_when_created(webhook)
    train = {"name": "train", "image": "train:1", "resources": {"claims": [{"name": "gpus"}]}}
    claims = [{"name": "gpus", "resourceClaimName": "gpus-7"}]
    pod = {**gpu_pod(), "spec": {"containers": [train], "resourceClaims": claims}}
    created = create(webhook, webhook.opted_in, pod)  # the API server validates the claims
    assert init_names(created) == [INIT_CONTAINER]
    assert created["spec"]["initContainers"][0]["resources"] == {"claims": [{"name": "gpus"}]}


def test_a_namespace_not_opted_in_is_untouched(webhook):
    mutated_when_created(webhook)
    before = webhook.results("mutated") + webhook.results("skipped")
    pod = create(webhook, webhook.plain, gpu_pod())
    assert init_names(pod) == []
    assert webhook.results("mutated") + webhook.results("skipped") == before  # never called


def test_a_pod_without_gpus_is_untouched_and_never_sent(webhook):
    mutated_when_created(webhook)
    before = webhook.results("skipped")
    web = {"name": "web", "image": "nginx"}
    pod = create(webhook, webhook.opted_in, {**gpu_pod(), "spec": {"containers": [web]}})
    assert init_names(pod) == []
    assert webhook.results("skipped") == before  # the matchCondition kept it from us


def test_a_pod_that_has_the_check_is_not_mutated_twice(webhook):
    mutated_when_created(webhook)
    before = webhook.results("skipped")
    own = {"name": INIT_CONTAINER, "image": "custom/preflight:1", "args": ["mine"]}
    pod = create(webhook, webhook.opted_in, gpu_pod(initContainers=[own]))
    assert init_names(pod) == [INIT_CONTAINER]
    assert pod["spec"]["initContainers"][0]["image"] == "custom/preflight:1"
    assert webhook.results("skipped") == before + 1


def test_after_rotations_pods_are_still_mutated_with_a_new_certificate(webhook):
    mutated_when_created(webhook)
    first = served_certificate(webhook.port)
    first_ca = ca_bundle(webhook)
    assert len(first_ca) == 1
    first.verify_directly_issued_by(first_ca[0])

    # The leaf at 2/3 of its life: a new one from the same CA, served at once.
    webhook.clock.step(2.5 * DAY_S)
    leaf = wait_for(
        lambda: (c := served_certificate(webhook.port)).serial_number != first.serial_number and c,
        10,
        "a renewed leaf served",
    )
    leaf.verify_directly_issued_by(first_ca[0])
    assert INIT_CONTAINER in init_names(create(webhook, webhook.opted_in, gpu_pod()))

    # The CA at 2/3 of its life: both CAs trusted, then a leaf from the new one.
    webhook.clock.step(18 * DAY_S)
    wait_for(lambda: len(ca_bundle(webhook)) == 2, 10, "old and new CA in the caBundle")
    new_ca = ca_bundle(webhook)[0]
    assert new_ca.serial_number != first_ca[0].serial_number

    def served_by_new_ca() -> x509.Certificate | None:
        cert = served_certificate(webhook.port)
        return cert if cert.issuer == new_ca.subject else None

    swapped = wait_for(served_by_new_ca, 10, "a leaf from the new CA served")
    swapped.verify_directly_issued_by(new_ca)
    assert INIT_CONTAINER in init_names(create(webhook, webhook.opted_in, gpu_pod()))

    # Settled: the old CA leaves the bundle; pods are still mutated.
    webhook.clock.step(LIFETIMES.settle_s + 1)
    wait_for(lambda: len(ca_bundle(webhook)) == 1, 10, "the old CA dropped")
    assert ca_bundle(webhook)[0].serial_number == new_ca.serial_number
    mutated_when_created(webhook)
    expiry = sample(webhook.registry, "gpuguard_webhook_certificate_expiry_timestamp_seconds")
    assert expiry == swapped.not_valid_after_utc.timestamp()


def _fail_open_count(webhook: Webhook) -> float:
    """The API server's own count of calls to this module's webhook it let through failed
    (read line by line: a counter named ``..._count`` reads as a summary's to a parser)."""
    url = f"{webhook.plane.url}/metrics"
    with urllib.request.urlopen(url, context=webhook.plane.ssl_context(), timeout=10) as answer:
        lines = answer.read().decode().splitlines()
    prefix = "apiserver_admission_webhook_fail_open_count{"
    mine = [
        line
        for line in lines
        if line.startswith(prefix) and f'name="preflight-{webhook.label}.gpuguard.io"' in line
    ]
    return sum(float(line.rsplit(" ", 1)[1]) for line in mine)


def test_with_the_webhook_down_pods_are_still_created_and_the_api_server_counts_it(webhook):
    # Last in the module: it stops the module's server.
    mutated_when_created(webhook)
    before = _fail_open_count(webhook)
    webhook.running.shutdown()
    pod = create(webhook, webhook.opted_in, gpu_pod())
    assert init_names(pod) == []
    wait_for(lambda: _fail_open_count(webhook) > before, 10, "the fail-open count up")


@pytest.fixture
def controller_process(
    api: KubeApi, control_plane: ControlPlane, helm: Callable[..., str], tmp_path: Path
) -> Iterator[tuple[str, str]]:
    """A real ``gpuguard controller --webhook-port`` (dry run: it acts on no node) in a
    namespace of its own, and the chart's configuration sent to it; yields that namespace
    and a namespace opted in for it."""
    label = uuid.uuid4().hex[:12]
    home = _namespace(api, {})
    opted_in = _namespace(api, {NAMESPACE_LABEL: ENABLED, TEST_LABEL: label})
    port, config = free_port(), f"gpuguard-preflight-process-{label}"
    api.create(WEBHOOK_CONFIGS.path(), _configuration(helm, config, port, label))
    command = [sys.executable, "-m", "gpuguard.cli", "controller", "--dry-run"]
    command += ["--kubeconfig", str(control_plane.admin_kubeconfig), "--namespace", home]
    command += ["--identity", "replica-0", "--metrics-port", "0", "--webhook-port", str(port)]
    command += ["--webhook-config", config, "--webhook-ip", "127.0.0.1"]
    command += ["--preflight-image", IMAGE, "--preflight-budget", "20"]
    with (tmp_path / "controller.log").open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield home, opted_in
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        api.delete(WEBHOOK_CONFIGS.path(config))
        now = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
        for namespace in (home, opted_in):
            api.delete(f"/api/v1/namespaces/{namespace}/pods", now)
            api.delete(f"/api/v1/namespaces/{namespace}")


def test_the_controller_command_serves_the_webhook_with_its_own_certificate(
    api: KubeApi, controller_process: tuple[str, str]
):
    home, opted_in = controller_process

    def mutated() -> Json | None:
        pod = api.create(f"/api/v1/namespaces/{opted_in}/pods", gpu_pod(1))
        return pod if INIT_CONTAINER in init_names(pod) else None

    pod = wait_for(mutated, 60, "a GPU pod mutated by the controller's webhook")
    check = pod["spec"]["initContainers"][0]
    assert (check["image"], check["args"]) == (IMAGE, ["preflight", "--budget", "20"])
    secret = api.get(SECRETS.path("gpuguard-webhook-tls", namespace=home))
    assert sorted(secret["data"]) == sorted(SECRET_KEYS)
