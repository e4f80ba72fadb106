"""The ``gpuguard controller`` flags, apart from the controller so ``--help`` stays cheap."""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

from gpuguard import logs

PROVIDER_NAMES = ("delete-node", "karpenter")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help="remediation policy YAML (default: the built-in policy)",
    )
    parser.add_argument(
        "--kubeconfig", type=Path, metavar="FILE", help="default: the pod's ServiceAccount"
    )
    parser.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", "gpuguard"),
        help="where the leader Lease and the breaker state live",
    )
    parser.add_argument(
        "--identity",
        default=os.environ.get("POD_NAME", socket.gethostname()),
        help="this replica's name in the Lease",
    )
    parser.add_argument(
        "--provider",
        choices=PROVIDER_NAMES,
        default="karpenter",
        help="how REPLACE hands a machine back",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="decide and record everything (NodeRemediations, Events), act on nothing",
    )
    parser.add_argument(
        "--metrics-port", type=int, default=9466, metavar="PORT", help="0 disables /metrics"
    )
    logs.add_argument(parser)
    add_preflight_argument(parser)
    add_gpu_quarantine(parser)
    parser.add_argument(
        "--keep-closed-days",
        type=_positive_days,
        default=30.0,
        metavar="DAYS",
        help="delete NodeRemediations of episodes closed longer ago than this (never less "
        "than the policy's lemon and breaker windows)",
    )
    # Not for production: the wall clock set wrong by this many seconds, as on a machine
    # whose time sync failed (the clock-skew tests of docs/reliability.md use it).
    parser.add_argument("--clock-offset-s", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--gpu-node-selector",
        type=_selector,
        default="nvidia.com/gpu.present=true",
        metavar="SELECTOR",
        help="label selector (key=value or key terms, comma separated) of the nodes counted in "
        "GPU-node availability; the chart passes the agent's nodeSelector",
    )
    _add_evidence_argument(parser)
    _add_webhook_arguments(parser)


def _add_evidence_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--evidence-wait-s",
        type=float,
        default=0.0,
        metavar="S",
        help="before a REPLACE, ask the node's agent for RMA evidence and wait at most this "
        "long for its answer (docs/remediation.md, RMA evidence); 0 (the default): off",
    )


def _add_webhook_arguments(parser: argparse.ArgumentParser) -> None:
    """The preflight gate (docs/preflight.md): off unless --webhook-port is given."""
    group = parser.add_argument_group("preflight webhook")
    group.add_argument(
        "--webhook-port",
        type=int,
        default=0,
        metavar="PORT",
        help="serve the preflight admission webhook (HTTPS) here; 0 (the default): off",
    )
    group.add_argument(
        "--webhook-secret",
        default="gpuguard-webhook-tls",
        metavar="NAME",
        help="Secret (in --namespace) holding the webhook's CA and certificate",
    )
    group.add_argument(
        "--webhook-config",
        default="gpuguard-preflight",
        metavar="NAME",
        help="MutatingWebhookConfiguration whose caBundle the leader keeps; '' for none",
    )
    group.add_argument(
        "--webhook-service",
        default="gpuguard-controller-webhook",
        metavar="NAME",
        help="Service (in --namespace) the API server calls: the certificate's DNS names",
    )
    group.add_argument(
        "--webhook-ip",
        action="append",
        type=_ip,
        default=[],
        metavar="IP",
        help="an IP address the certificate also names (repeatable)",
    )
    group.add_argument(
        "--preflight-image",
        default=os.environ.get("GPUGUARD_PREFLIGHT_IMAGE", ""),
        metavar="IMAGE",
        help="image of the init container the webhook adds (gpuguard's own)",
    )
    group.add_argument(
        "--preflight-budget",
        type=_positive_seconds,
        default=60.0,
        metavar="S",
        help="time limit of the check the init container runs",
    )


def add_preflight_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preflight",
        action="store_true",
        help="read the preflight gate's outcomes: a failed gpuguard-preflight init container "
        "quarantines its node; GPU pods admitted unchecked in opted-in namespaces are counted "
        "(watches Namespaces)",
    )


def add_gpu_quarantine(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpu-quarantine",
        action="store_true",
        help="quarantine a fault confined to some GPUs by tainting just those DRA devices "
        "(DeviceTaintRules; docs/gpu-quarantine.md), not the node; the node's taint stands "
        "in where that cannot be done",
    )
    parser.add_argument(
        "--gpu-quarantine-driver",
        default="gpu.nvidia.com",
        metavar="DRIVER",
        help="the DRA driver whose ResourceSlices publish the GPUs (default: %(default)s)",
    )


def _positive_days(text: str) -> float:
    try:
        days = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of days: {text!r}") from None
    if not days > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 days: {text!r}")
    return days


def _positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < seconds < 86400:
        raise argparse.ArgumentTypeError(f"must be more than 0 and under a day: {text!r}")
    return seconds


def _ip(text: str) -> str:
    import ipaddress

    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IP address: {text!r}") from None


def _selector(text: str) -> object:
    from gpuguard.controller.slis import parse_selector  # here: --help stays cheap

    try:
        return parse_selector(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
