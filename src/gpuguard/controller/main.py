"""Wiring for ``gpuguard controller``: policy file, credentials, provider, signals, metrics."""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import threading

from gpuguard import logs, threads
from gpuguard.clock import SYSTEM_CLOCK, OffsetClock
from gpuguard.controller.evidence_gate import EvidenceGate
from gpuguard.controller.gpu_quarantine import install
from gpuguard.controller.loop import Controller
from gpuguard.controller.metrics import ControllerMetrics
from gpuguard.errors import ConfigError
from gpuguard.kube.rest import load_api_for_command
from gpuguard.metrics_server import serve
from gpuguard.preflight.gate import Gate, start_gate
from gpuguard.preflight.mutate import Settings
from gpuguard.remediation.policy import Policy, load_policy

log = logging.getLogger("gpuguard.controller")


START_PAUSE_S = 120.0  # 100,000 Nodes take ~30 s; an API server down at start, longer


def collect_after_start(
    ready: threading.Event, stop: threading.Event, *, most_s: float = START_PAUSE_S
) -> None:
    """The Node cache filled at start lives as long as the process, and the cyclic
    collector would walk it again and again while it grows (a seventh of the start's CPU
    at 100,000 Nodes). The collector waits until ready, or ``most_s`` at most (retries
    against an API server that is down make garbage); what the start made is then set
    aside from its walks (``gc.freeze``): nothing in it is garbage yet."""
    gc.disable()
    deadline = SYSTEM_CLOCK.monotonic() + most_s

    def settle(stop: threading.Event) -> None:
        while not (ready.wait(1.0) or stop.is_set() or SYSTEM_CLOCK.monotonic() > deadline):
            pass
        gc.freeze()
        gc.enable()

    threads.start("collect-after-start", settle, stop)


def run_controller(args: argparse.Namespace) -> int:
    logs.configure(args.log_format)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    policy = Policy() if args.policy is None else load_policy(args.policy)
    gate = _gate(args) if args.webhook_port else None
    api = load_api_for_command(args.kubeconfig)
    metrics = ControllerMetrics()
    if args.metrics_port:
        serve(metrics, args.metrics_port)
    stop = threading.Event()
    collect_after_start(metrics.ready, stop)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    controller = Controller(
        api,
        policy,
        args.provider,
        namespace=args.namespace,
        identity=args.identity,
        dry_run=args.dry_run,
        metrics=metrics,
        gpu_nodes=args.gpu_node_selector,
        keep_closed_s=args.keep_closed_days * 86400,
        clock=OffsetClock(args.clock_offset_s) if args.clock_offset_s else SYSTEM_CLOCK,
        preflight=args.preflight,
        gpu_quarantine=install(args.gpu_quarantine_driver) if args.gpu_quarantine else None,
    )
    log.info(
        "gpuguard controller %s starting%s (provider %s)",
        args.identity,
        " in dry-run" if args.dry_run else "",
        args.provider,
    )
    if args.evidence_wait_s > 0:  # RMA evidence before REPLACE: off by default
        evidence = EvidenceGate(controller.writer, controller.applier.events, args.evidence_wait_s)
        controller.applier.evidence = evidence
    if gate is not None:
        start_gate(gate, controller.writer, controller.leading, metrics.registry, stop)
    controller.run(stop)
    if controller.failed:
        log.error("gpuguard controller %s failed: %s", args.identity, controller.failed)
        return 1
    log.info("gpuguard controller %s stopped", args.identity)
    return 0


def _gate(args: argparse.Namespace) -> Gate:
    """The preflight webhook's settings (docs/preflight.md)."""
    if not args.preflight_image:
        raise ConfigError("--webhook-port needs --preflight-image (the init container's image)")
    return Gate(
        port=args.webhook_port,
        namespace=args.namespace,
        secret=args.webhook_secret,
        webhook_config=args.webhook_config,
        service=args.webhook_service,
        settings=Settings(image=args.preflight_image, budget_s=args.preflight_budget),
        ips=tuple(args.webhook_ip),
    )
