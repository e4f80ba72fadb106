"""The agent's one metrics registry; ``gpuguard.metrics_server`` serves it with the probes."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpuguard.metrics_server import Probes
from gpuguard.metrics_server import serve as serve  # still importable from here
from gpuguard.model import CheckResult, NodeReport, Status


class AgentMetrics(Probes):
    """Per-layer health, findings, check runs, Xids seen, and publishing."""

    def __init__(self) -> None:
        super().__init__()
        self.registry = CollectorRegistry()
        self._add_health()
        self._add_publishing()
        self._add_deep_checks()

    def _add_health(self) -> None:
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

    def _add_publishing(self) -> None:
        self.last_publish = Gauge(
            "gpuguard_last_publish_timestamp_seconds",
            "When conditions were last written",
            registry=self.registry,
        )
        self.publish_duration = Histogram(
            "gpuguard_publish_duration_seconds",
            "Wall time of each condition write to the API server (the Node status patch)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.publish_errors = Counter(
            "gpuguard_publish_errors_total",
            "Failed writes to the API server",
            ["kind"],
            registry=self.registry,
        )

    def _add_deep_checks(self) -> None:
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

    def count_xids(self, code: int, lines: int) -> None:
        self.xids.labels(str(code)).inc(lines)

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
