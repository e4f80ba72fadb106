"""The ``gpuguard`` command: a thin shell over the checks, the runner and the bundle code.

Exit status of ``gpuguard check``: 0 Healthy, 1 Degraded, 2 Unhealthy, 3 Unknown (only
with ``--no-fail-closed``); 64 for bad usage or configuration. Errors are one line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from gpuguard import __version__, logs
from gpuguard.bundle import collect
from gpuguard.checks.registry import FALLBACKS, configured_checks, default_checks
from gpuguard.checks.xid_catalog import OVERRIDES, rule_for
from gpuguard.cleanup_command import add_arguments as add_cleanup_arguments
from gpuguard.cleanup_command import run_cleanup
from gpuguard.config import Config, load_config
from gpuguard.controller.options import add_arguments as add_controller_arguments
from gpuguard.errors import ConfigError
from gpuguard.evidence_read import local_bundle
from gpuguard.model import Status
from gpuguard.preflight.command import add_arguments as add_preflight_arguments
from gpuguard.preflight.command import run_preflight
from gpuguard.render import to_json, to_table
from gpuguard.runner import run_all
from gpuguard.sim.arguments import add_arguments as add_simulate_arguments
from gpuguard.sources import Artifact, BundleSources, LiveSources, Sources
from gpuguard.training.options import add_arguments as add_run_arguments

EXIT_CODES = {Status.HEALTHY: 0, Status.DEGRADED: 1, Status.UNHEALTHY: 2, Status.UNKNOWN: 3}
EXIT_USAGE = 64


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpuguard", description="GPU node health checks.")
    parser.add_argument("--version", action="version", version=f"gpuguard {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    check = commands.add_parser(
        "check",
        help="check this node (or a captured bundle) through every diagnostic layer",
        epilog="exit status: 0 Healthy, 1 Degraded, 2 Unhealthy, 3 Unknown, 64 usage error",
    )
    _add_check_arguments(check)

    agent = commands.add_parser(
        "agent",
        help="watch this node continuously and publish its health as Node conditions",
        epilog="environment: NODE_NAME names the Node when --node-name is not given",
    )
    _add_agent_arguments(agent)

    controller = commands.add_parser(
        "controller", help="remediate the fleet's sick nodes (leader-elected Deployment)"
    )
    add_controller_arguments(controller)

    simulate = commands.add_parser(
        "simulate",
        help="simulate a GPU fleet under no remediation, a reactive setup and gpuguard",
    )
    add_simulate_arguments(simulate)

    bundle = commands.add_parser("bundle", help="capture diagnostics for offline triage")
    _add_bundle_commands(bundle)

    run = commands.add_parser(
        "run",
        help="run a training job; restart it after interruptions, stop a crash loop",
        description="Run a training job; restart it after interruptions.",
    )
    add_run_arguments(run)

    cleanup = commands.add_parser(
        "cleanup",
        help="take gpuguard's conditions, taint, cordon and annotations off the Nodes "
        "(a dry run unless --apply; the chart runs it on uninstall)",
    )
    add_cleanup_arguments(cleanup)

    preflight = commands.add_parser(
        "preflight",
        help="check the pod's GPUs before its job starts (the gpuguard-preflight init container)",
        epilog="exit status: 0 passed, 1 a fault found, 2 no verdict (fail closed), 64 usage error",
    )
    add_preflight_arguments(preflight)

    xid = commands.add_parser("xid", help="explain an Xid code and what gpuguard does about it")
    xid.add_argument("code", type=int, metavar="N", help="the Xid number, as in 'Xid (...): 79'")
    return parser


def _add_check_arguments(check: argparse.ArgumentParser) -> None:
    check.add_argument(
        "--bundle",
        type=Path,
        metavar="DIR",
        help="inspect a captured bundle offline (a directory, an evidence .tar.gz, or"
        " s3://BUCKET/KEY with --config's evidence.s3)",
    )
    check.add_argument("--config", type=Path, metavar="FILE", help="YAML configuration file")
    check.add_argument(
        "--expected-gpus", type=int, metavar="N", help="GPUs the node should have (fewer: REPLACE)"
    )
    check.add_argument("--expected-nics", type=int, metavar="N", help="RDMA adapters (EFA/IB)")
    check.add_argument(
        "--expected-link-gbps",
        type=float,
        metavar="G",
        help="minimum rate of every active fabric port",
    )
    check.add_argument("--timeout", type=float, metavar="S", help="default per-check timeout")
    check.add_argument(
        "--no-fail-closed",
        action="store_true",
        help="report a layer whose checks gave no verdict as Unknown, not Unhealthy",
    )
    check.add_argument(
        "--deep",
        action="store_true",
        help="also run the load checks: GPUs under load, memory, host/peer links, NIC loopback",
    )
    check.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="time the deep checks may take (default: the config's deep.budget_s, 60)",
    )
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.add_argument("-v", "--verbose", action="store_true", help="list informational findings")


def _add_agent_arguments(agent: argparse.ArgumentParser) -> None:
    agent.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        metavar="NAME",
        help="the Node this agent reports on (default: $NODE_NAME, set by the DaemonSet)",
    )
    agent.add_argument("--config", type=Path, metavar="FILE", help="YAML configuration file")
    agent.add_argument(
        "--kubeconfig", type=Path, metavar="FILE", help="default: the pod's ServiceAccount"
    )
    agent.add_argument(
        "--bundle",
        type=Path,
        metavar="DIR",
        help="read a bundle directory instead of the live node (its kmsg.log is followed)",
    )
    logs.add_argument(agent)
    agent.add_argument(
        "--print-conditions",
        action="store_true",
        help="no Kubernetes: run every check once, print the conditions as JSON, exit",
    )


def _add_bundle_commands(bundle: argparse.ArgumentParser) -> None:
    bundle_commands = bundle.add_subparsers(
        dest="bundle_command", required=True, parser_class=_Parser
    )
    bundle_collect = bundle_commands.add_parser("collect", help="capture this node into DIR")
    bundle_collect.add_argument(
        "directory", type=Path, metavar="DIR", help="where to write it (created if missing)"
    )
    bundle_collect.add_argument(
        "--config", type=Path, metavar="FILE", help="YAML configuration file"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "check":
            return _check(args)
        if args.command == "bundle":
            return _bundle_collect(args)
        if args.command == "run":
            from gpuguard.training.launcher import run_launcher

            return run_launcher(args)
        if args.command == "controller":
            from gpuguard.controller.main import run_controller

            return run_controller(args)
        if args.command == "simulate":
            from gpuguard.sim.command import run_simulate

            return run_simulate(args)
        if args.command == "preflight":
            return run_preflight(args)
        if args.command == "cleanup":
            return run_cleanup(args)
        if args.command == "agent":
            # Imported here: the agent's dependencies cost start-up time `check` skips.
            from gpuguard.agent.main import run_agent

            return run_agent(args)
        return _explain_xid(args.code)
    except ConfigError as exc:
        print(f"gpuguard: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        if exc.filename is None:
            raise
        # A file named on the command line that a reader did not vet: one line, no traceback.
        print(f"gpuguard: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE


def _check(args: argparse.Namespace) -> int:
    config = load_config(args.config).with_overrides(
        expected_gpus=args.expected_gpus,
        expected_nics=args.expected_nics,
        expected_link_gbps=args.expected_link_gbps,
        default_timeout_s=args.timeout,
        fail_closed=False if args.no_fail_closed else None,
    )
    sources: Sources
    if args.bundle is not None:
        args.bundle = local_bundle(args.bundle, config)  # an evidence archive: unpacked
        if not args.bundle.is_dir():
            raise ConfigError(f"--bundle {args.bundle}: not a directory")
        known = [*(a.value for a in Artifact), "dmesg.log", "sysfs"]
        if not any((args.bundle / name).exists() for name in known):
            raise ConfigError(
                f"--bundle {args.bundle}: none of a bundle's files in it ({', '.join(known)};"
                " `gpuguard bundle collect DIR` writes them)"
            )
        sources = BundleSources(args.bundle)
        checks = default_checks()
    else:
        sources = LiveSources(config)
        checks = configured_checks(config)  # plugins look at the live node, not a bundle
    if args.deep:
        from gpuguard.checks.load.checks import deep_checks

        checks += deep_checks()
        if args.budget is not None:
            config = config.with_overrides(
                deep={**config.deep.model_dump(), "budget_s": args.budget}
            )
    elif args.budget is not None:
        raise ConfigError("--budget applies to --deep only")
    report = run_all(checks, sources, config, FALLBACKS)
    origin = str(args.bundle) if args.bundle is not None else "live node"
    if args.json:
        print(to_json(report, origin=origin))
    else:
        print(f"gpuguard check: {origin}")
        print(to_table(report, verbose=args.verbose))
    return EXIT_CODES[report.status]


def _bundle_collect(args: argparse.Namespace) -> int:
    config: Config = load_config(args.config)
    manifest = collect(args.directory, config, progress=lambda m: print(m, file=sys.stderr))
    for name, note in manifest.items():
        print(f"{name:<20} {note}")
    print(
        f"bundle written to {args.directory}; "
        f"inspect with: gpuguard check --bundle {args.directory}"
    )
    return 0


def _explain_xid(code: int) -> int:
    rule = rule_for(code)
    print(f"Xid {code}: {rule.mnemonic}")
    print(f"  meaning:         {rule.description}")
    print(f"  NVIDIA bucket:   {rule.bucket} (investigate: {rule.investigatory or '-'})")
    print(f"  gpuguard action: {rule.action} (severity {rule.severity})")
    print(f"  why:             {rule.why}")
    if code in OVERRIDES:
        print("  note:            gpuguard overrides the catalog bucket for this code")
    if rule.application:
        print("  application:     yes; a burst across GPUs from one job is one incident")
    return 0


if __name__ == "__main__":
    sys.exit(main())
