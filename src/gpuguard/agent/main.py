"""Wiring for ``gpuguard agent``: configuration, sources, signals, metrics endpoint."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import signal
import sys
import threading

from gpuguard import logs, threads
from gpuguard.agent.daemon import Agent
from gpuguard.agent.metrics import AgentMetrics
from gpuguard.checks.registry import configured_checks
from gpuguard.config import Config, load_config
from gpuguard.errors import ConfigError
from gpuguard.kernel_log.followers import Follower, follower_for
from gpuguard.metrics_server import serve
from gpuguard.model import Status
from gpuguard.sources import BundleSources, LiveSources, Sources

FIRST_ROUND_TIMEOUT_S = 600.0
EXIT_USAGE = 64

log = logging.getLogger("gpuguard.agent")


def run_agent(args: argparse.Namespace) -> int:
    logs.configure(args.log_format, **({"node": args.node_name} if args.node_name else {}))
    # The HTTP client logs every request at INFO: a line per condition write, noise here.
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = load_config(args.config)
    sources: Sources
    if args.bundle is not None:
        if not args.bundle.is_dir():
            raise ConfigError(f"--bundle {args.bundle}: not a directory")
        sources = BundleSources(args.bundle)
        follower = follower_for(config.kernel_log, sources.kernel_log_path())
    else:
        sources = LiveSources(config)
        try:
            follower = follower_for(config.kernel_log)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    stop = threading.Event()
    if args.print_conditions:
        return _print_conditions(config, sources, follower, args.node_name or "", stop)
    if not args.node_name:
        raise ConfigError("--node-name (or NODE_NAME) is required to publish conditions")
    # Imported here: the Kubernetes client costs start-up time the other commands skip.
    from gpuguard.agent.maintenance_ack import with_maintenance_ack
    from gpuguard.agent.repair import BundleRepair, NvidiaSmiRepair, RepairBackend
    from gpuguard.kube.client import NodeApi
    from gpuguard.kube.rest import load_api_for_command

    kube = load_api_for_command(args.kubeconfig)
    api = NodeApi(kube)
    metrics = AgentMetrics()
    if config.metrics_port:
        serve(metrics, config.metrics_port)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    checks = configured_checks(config)
    agent = Agent(config, sources, checks, follower, args.node_name, api, metrics)
    backend: RepairBackend
    if isinstance(sources, BundleSources):
        backend = BundleRepair(sources.root / "repairs.log")
    else:
        smi = config.tools.get("nvidia-smi") or shutil.which("nvidia-smi") or "nvidia-smi"
        backend = NvidiaSmiRepair(smi, config.reboot_command)
    executor = agent.orders.repairs(kube, with_maintenance_ack(backend, config.maintenance))
    repairs = threads.start("repairs", executor.run, stop)
    log.info(
        "gpuguard agent publishing %s conditions for node %s; kernel log: %s",
        config.condition_profile,
        args.node_name,
        follower.description,
    )
    agent.run(stop, also_supervise=[repairs])
    if agent.failed:
        log.error("gpuguard agent failed: %s", agent.failed)
        return 1
    log.info("gpuguard agent stopped")
    return 0


def _print_conditions(
    config: Config, sources: Sources, follower: Follower, node_name: str, stop: threading.Event
) -> int:
    agent = Agent(config, sources, configured_checks(config), follower, node_name, api=None)
    agent.start_observers(stop)
    if not agent.wait_first_round(FIRST_ROUND_TIMEOUT_S):
        print("gpuguard agent: checks did not complete", file=sys.stderr)
        return 2
    report = agent.report()
    stop.set()
    assert report is not None
    conditions = [vars(d) for d in agent.desired(report)]
    print(json.dumps({"conditions": conditions, "report": report.to_dict()}, indent=2))
    return 0 if report.status is Status.HEALTHY else 2
