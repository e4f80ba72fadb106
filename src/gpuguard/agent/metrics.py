"""The agent's one metrics registry, and the HTTP endpoint serving it with health probes."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gpuguard.model import CheckResult, NodeReport, Status

# A main loop silent for longer than this is reported unhealthy on /healthz.
LIVENESS_S = 120.0


class AgentMetrics:
    """Per-layer health, findings, check runs, Xids seen, and publishing."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.layer_status = Gauge(
            "gpuguard_layer_status",
            "1 for the layer's current status, 0 for the others",
            ["layer", "status"],
            registry=self.registry,
        )
        self.findings = Gauge(
            "gpuguard_findings",
            "Current findings by layer, code and severity",
            ["layer", "code", "severity"],
            registry=self.registry,
        )
        self.check_duration = Histogram(
            "gpuguard_check_duration_seconds",
            "Wall time of each check run",
            ["check"],
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300),
            registry=self.registry,
        )
        self.check_runs = Counter(
            "gpuguard_check_runs_total",
            "Check runs by outcome (timed_out, failed …)",
            ["check", "outcome"],
            registry=self.registry,
        )
        self.xids = Counter(
            "gpuguard_xid_events_total",
            "Xid lines seen in the kernel log, by code",
            ["xid"],
            registry=self.registry,
        )
        self.last_publish = Gauge(
            "gpuguard_last_publish_timestamp_seconds",
            "When conditions were last written",
            registry=self.registry,
        )
        self.publish_errors = Counter(
            "gpuguard_publish_errors_total",
            "Failed writes to the API server",
            ["kind"],
            registry=self.registry,
        )
        self.deep_runs = Counter(
            "gpuguard_deep_check_runs_total",
            "Deep GPU check runs by trigger (schedule, verify) and verdict",
            ["trigger", "verdict"],
            registry=self.registry,
        )
        self.deep_last_run = Gauge(
            "gpuguard_deep_check_last_run_timestamp_seconds",
            "When the deep GPU check last finished, by trigger",
            ["trigger"],
            registry=self.registry,
        )
        self.deep_skipped = Counter(
            "gpuguard_deep_check_skipped_total",
            "Scheduled deep checks put off: GPUs busy, or their activity unknown",
            ["reason"],
            registry=self.registry,
        )
        self._alive_at = time.monotonic()
        self.ready = threading.Event()

    def observe_check(self, result: CheckResult) -> None:
        self.check_duration.labels(result.check).observe(result.duration_s)
        self.check_runs.labels(result.check, str(result.outcome)).inc()

    def observe_report(self, report: NodeReport) -> None:
        for layer, health in report.layers.items():
            for status in Status:
                self.layer_status.labels(str(layer), str(status)).set(status is health.status)
        self.findings.clear()
        for health in report.layers.values():
            for finding in health.findings:
                labels = (str(finding.layer), finding.code, str(finding.severity))
                self.findings.labels(*labels).inc()

    def alive(self) -> None:
        self._alive_at = time.monotonic()

    def is_alive(self) -> bool:
        return time.monotonic() - self._alive_at < LIVENESS_S


class Served(Protocol):
    """What the endpoint needs: a registry, a readiness flag and a liveness answer."""

    registry: CollectorRegistry
    ready: threading.Event

    def is_alive(self) -> bool: ...


def serve(metrics: Served, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve /metrics, /healthz and /readyz on a daemon thread; returns the server."""

    class Handler(BaseHTTPRequestHandler):
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

        def _answer(self, code: int, body: bytes, kind: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # scrapes every few seconds would flood the agent's log

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
