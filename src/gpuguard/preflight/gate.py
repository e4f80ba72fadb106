"""The preflight webhook as one part of the controller: its server and its certificate's
rotation, started together (``start_gate``), stopped with the process's stop event."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from gpuguard import threads
from gpuguard.clock import SYSTEM_CLOCK, Clock
from gpuguard.kube.rest import KubeApi
from gpuguard.preflight import certs
from gpuguard.preflight.cert_rotation import EVERY_S, Place, Rotator
from gpuguard.preflight.certs import DEFAULT_LIFETIMES, Lifetimes
from gpuguard.preflight.mutate import Settings
from gpuguard.preflight.webhook_server import (
    ServingCert,
    WebhookMetrics,
    WebhookServer,
    serve_webhook,
)


@dataclass(frozen=True)
class Gate:
    """What ``gpuguard controller --webhook-port`` was given."""

    port: int
    namespace: str
    secret: str
    webhook_config: str
    service: str
    settings: Settings
    ips: tuple[str, ...] = ()
    host: str = "0.0.0.0"

    def place(self) -> Place:
        names = certs.service_names(self.service, self.namespace)
        return Place(self.namespace, self.secret, self.webhook_config, names, self.ips)


@dataclass
class Running:
    server: WebhookServer
    rotator: Rotator
    thread: threading.Thread

    def shutdown(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_gate(
    gate: Gate,
    api: KubeApi,
    leading: threading.Event,
    registry: CollectorRegistry,
    stop: threading.Event,
    *,
    lifetimes: Lifetimes = DEFAULT_LIFETIMES,
    clock: Clock = SYSTEM_CLOCK,
    every_s: float = EVERY_S,
) -> Running:
    """Serve the webhook and keep its certificate; ``api`` should be fenced by the
    leadership ``leading`` tells of (every write the rotation makes is the leader's)."""
    metrics = WebhookMetrics(registry)
    cert = ServingCert(metrics)
    rotator = Rotator(
        api, gate.place(), cert, leading, lifetimes=lifetimes, clock=clock, every_s=every_s
    )
    server = serve_webhook(gate.settings, cert, metrics, gate.port, gate.host)
    thread = threads.start("webhook-certificate", rotator.run, stop)
    return Running(server, rotator, thread)
