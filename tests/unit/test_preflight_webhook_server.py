"""The webhook's HTTPS endpoint on loopback: every review answered 200 and counted,
garbage included; a new certificate served to the next handshake."""

from __future__ import annotations

import http.client
import json
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuguard.preflight import certs
from gpuguard.preflight.mutate import Settings
from gpuguard.preflight.webhook_server import (
    ServingCert,
    WebhookMetrics,
    WebhookServer,
    serve_webhook,
)
from tests.support.metrics import sample

LIFE = certs.Lifetimes(leaf_s=3600, backdate_s=7200)  # valid now, however moved


class Served:
    def __init__(self, tmp: Path) -> None:
        self.registry = CollectorRegistry()
        metrics = WebhookMetrics(self.registry)
        self.cert = ServingCert(metrics)
        self.material = certs.fresh(time.time(), ("webhook.test",), ("127.0.0.1",), LIFE)
        self.cert.load(self.material.leaf_cert, self.material.leaf_key)
        self.server: WebhookServer = serve_webhook(
            Settings(image="gpuguard:test"), self.cert, metrics, 0, "127.0.0.1"
        )
        self.ca = tmp / "ca.crt"
        self.ca.write_bytes(self.material.ca_bundle())

    def connection(self) -> http.client.HTTPSConnection:
        context = ssl.create_default_context(cafile=str(self.ca))
        port = self.server.server_address[1]
        return http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)

    def post(self, body: bytes, path: str = "/mutate-pods?timeout=5s") -> tuple[int, bytes]:
        conn = self.connection()
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        return answer.status, answer.read()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    it = Served(tmp_path)
    yield it
    it.server.shutdown()
    it.server.server_close()


def test_garbage_is_answered_allowed_and_counted_as_an_error(served: Served):
    expiry = sample(served.registry, "gpuguard_webhook_certificate_expiry_timestamp_seconds")
    assert expiry == certs.not_after(served.material.leaf_cert)
    for body in (b"{not json", b"", b'{"request": []}'):
        status, answer = served.post(body)
        assert status == 200
        assert json.loads(answer)["response"] == {"uid": "", "allowed": True}
    assert sample(served.registry, "gpuguard_webhook_requests_total", result="error") == 3
    assert served.post(b"{}", path="/elsewhere")[0] == 404
    conn = served.connection()
    conn.request("GET", "/healthz")
    health = conn.getresponse()
    assert (health.status, health.read()) == (200, b"ok\n")


def test_a_new_certificate_serves_the_next_handshake(served: Served):
    first = served.connection()
    first.connect()
    assert first.sock is not None
    old = first.sock.getpeercert(binary_form=True)
    renewed = certs.next_material(
        served.material, time.time() + 3000, ("webhook.test",), ("127.0.0.1",), lifetimes=LIFE
    )
    assert renewed is not None
    served.cert.load(renewed.leaf_cert, renewed.leaf_key)
    second = served.connection()
    second.connect()
    assert second.sock is not None
    assert second.sock.getpeercert(binary_form=True) != old
    assert served.cert.served == renewed.leaf_cert
    first.close()
    second.close()


def test_no_certificate_yet_means_no_handshake(tmp_path: Path):
    cert = ServingCert(WebhookMetrics(CollectorRegistry()))
    server = serve_webhook(Settings(image="x"), cert, WebhookMetrics(CollectorRegistry()), 0)
    try:
        context = ssl.create_default_context()
        conn = http.client.HTTPSConnection(
            "127.0.0.1", server.server_address[1], context=context, timeout=5
        )
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            conn.request("GET", "/healthz")
            conn.getresponse()
    finally:
        server.shutdown()
        server.server_close()
