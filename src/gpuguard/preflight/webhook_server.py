"""The preflight webhook's HTTPS endpoint: POST /mutate-pods and GET /healthz on a port
of its own, beside the controller's plain /metrics.

The listening socket is plain; each accepted connection is wrapped with the TLS context
current at that moment, so a new certificate (``ServingCert.load``) serves every new
handshake at once while connections already open finish on the old one. The handshake
runs on the connection's own thread, so a slow client never holds up the accept loop.
Every request is answered 200 with an AdmissionReview that allows the pod: an error in
here must never turn into a 500 that the API server would report as the webhook failing.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import tempfile
import threading

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuguard.metrics_server import QuietHandler, QuietServer
from gpuguard.preflight import certs
from gpuguard.preflight.mutate import ERROR, MUTATED, SKIPPED, Answer, Settings, review

log = logging.getLogger("gpuguard.preflight")

MUTATE_PATH = "/mutate-pods"
MAX_BODY = 3 * 1024 * 1024  # the API server's own limit on a request body


class WebhookMetrics:
    """The webhook's series, on the registry given (the controller's)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "gpuguard_webhook_requests",
            "Admission reviews answered by the preflight webhook, by result",
            ["result"],
            registry=registry,
        )
        for result in (MUTATED, SKIPPED, ERROR):
            self.requests.labels(result)
        self.certificate_expiry = Gauge(
            "gpuguard_webhook_certificate_expiry_timestamp_seconds",
            "When the serving certificate this replica presents expires",
            registry=registry,
        )


class ServingCert:
    """The TLS context new connections get; ``load`` swaps in another certificate."""

    def __init__(self, metrics: WebhookMetrics) -> None:
        self._context: ssl.SSLContext | None = None
        self._served = b""
        self._metrics = metrics
        self._lock = threading.Lock()

    @property
    def served(self) -> bytes:
        """The PEM certificate served now (empty before the first ``load``)."""
        return self._served

    def load(self, cert_pem: bytes, key_pem: bytes) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # load_cert_chain reads files only: a private directory, gone once read.
        with tempfile.TemporaryDirectory(prefix="gpuguard-webhook-") as folder:
            cert_path, key_path = os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key")
            for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as file:
                    file.write(data)
            context.load_cert_chain(cert_path, key_path)
        with self._lock:
            self._context, self._served = context, cert_pem
        self._metrics.certificate_expiry.set(certs.not_after(cert_pem))

    def wrap(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            context = self._context
        if context is None:
            sock.close()
            raise OSError("no serving certificate yet")
        return context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)


class WebhookServer(QuietServer):
    """A threading HTTP server whose connections are TLS with the current certificate."""

    def __init__(self, address: tuple[str, int], cert: ServingCert, handler: type) -> None:
        self.cert = cert
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, object]:
        sock, address = self.socket.accept()
        return self.cert.wrap(sock), address

    def handle_error(self, request: object, client_address: object) -> None:
        # A failed handshake (a scanner, a client that does not trust us yet) or a peer
        # gone mid-answer: one debug line, not a traceback on stderr.
        log.debug("webhook connection from %s ended badly", client_address, exc_info=True)


def serve_webhook(
    settings: Settings, cert: ServingCert, metrics: WebhookMetrics, port: int, host: str = "0.0.0.0"
) -> WebhookServer:
    """Serve the webhook on a daemon thread; returns the server (``shutdown`` ends it)."""

    class Handler(QuietHandler):
        timeout = 30  # the handshake and the request: a silent client frees its thread

        def do_POST(self) -> None:
            if self.path.split("?", 1)[0] != MUTATE_PATH:
                self._answer(404, b"not found\n")
                return
            answer = self._review()
            metrics.requests.labels(answer.result).inc()
            if answer.result == ERROR:
                log.warning("preflight webhook: allowed unchanged: %s", answer.reason)
            self._answer(200, answer.body, "application/json")

        def _review(self) -> Answer:
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if not 0 < length <= MAX_BODY:
                    return review(b"", settings)
                return review(self.rfile.read(length), settings)
            except Exception as exc:  # never a 500: allowed, counted, logged
                return Answer(review(b"", settings).body, ERROR, f"{type(exc).__name__}: {exc}")

        def do_GET(self) -> None:
            if self.path != "/healthz":
                self._answer(404, b"not found\n")
            elif cert.served:
                self._answer(200, b"ok\n")
            else:
                self._answer(503, b"no serving certificate yet\n")

    server = WebhookServer((host, port), cert, Handler)
    threading.Thread(target=server.serve_forever, name="webhook", daemon=True).start()
    return server
