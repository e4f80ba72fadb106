"""The HTTP endpoint the agent and the controller both serve: /metrics, /healthz, /readyz.

Each daemon's metrics class extends ``Probes`` with its own registry; ``serve`` answers the
scrapes and the kubelet's probes from it. Imports nothing of gpuguard's but the clock, so
either side can use it without importing the other.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gpuguard.clock import SYSTEM_CLOCK

# A main loop silent for longer than this is reported unhealthy on /healthz.
LIVENESS_S = 120.0


class Probes:
    """Readiness (set once, after the first useful work) and liveness (the main loop's beat)."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self._alive_at = SYSTEM_CLOCK.monotonic()

    def alive(self) -> None:
        self._alive_at = SYSTEM_CLOCK.monotonic()

    def is_alive(self) -> bool:
        return SYSTEM_CLOCK.monotonic() - self._alive_at < LIVENESS_S


class Served(Protocol):
    """What the endpoint needs: a registry, a readiness flag and a liveness answer."""

    registry: CollectorRegistry
    ready: threading.Event

    def is_alive(self) -> bool: ...


def serve(metrics: Served, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve /metrics, /healthz and /readyz on a daemon thread; returns the server."""

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._answer(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                ok = metrics.is_alive()
                self._answer(200 if ok else 503, b"ok\n" if ok else b"main loop stalled\n")
            elif self.path == "/readyz":
                ok = metrics.ready.is_set()
                self._answer(200 if ok else 503, b"ok\n" if ok else b"not published yet\n")
            else:
                self._answer(404, b"not found\n")

    server = QuietServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


class QuietHandler(BaseHTTPRequestHandler):
    """Answers in one call and logs no line per request: scrapes every few seconds, or
    one admission review per pod created, would flood the daemon's log."""

    def _answer(self, code: int, body: bytes, kind: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class QuietServer(ThreadingHTTPServer):
    """Waits for a connection without waking up twice a second to look for a shutdown
    (the standard loop's poll, most of an idle agent's wake-ups); ``shutdown`` wakes it
    with connections of its own until it has stopped."""

    daemon_threads = True

    def serve_forever(self, poll_interval: float | None = None) -> None:
        super().serve_forever(poll_interval)  # type: ignore[arg-type]  # None: no timeout

    def shutdown(self) -> None:
        stopped = threading.Event()
        host, port = str(self.server_address[0]), int(self.server_address[1])
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host  # knock on loopback

        def knock() -> None:
            while not stopped.wait(0.05):
                with contextlib.suppress(OSError):
                    socket.create_connection((host, port), timeout=1).close()

        threading.Thread(target=knock, daemon=True).start()
        try:
            super().shutdown()
        finally:
            stopped.set()
