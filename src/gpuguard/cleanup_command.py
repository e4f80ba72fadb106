"""``gpuguard cleanup``: take gpuguard's conditions, taint, cordon and annotations off every
Node (``kube/cleanup.py`` says what and why). A dry run unless ``--apply``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpuguard.contract.conditions import PROFILES

if TYPE_CHECKING:
    from gpuguard.kube.rest import KubeApi


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--apply", action="store_true", help="remove what is listed (default: only list it)"
    )
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="gpuguard",
        help="the agents' condition_profile: with eks, the EKS-named conditions are "
        "gpuguard's too and go (default: gpuguard's own names only)",
    )
    parser.add_argument("--node", metavar="NAME", help="only this Node")
    parser.add_argument(
        "--kubeconfig", type=Path, metavar="FILE", help="default: the pod's ServiceAccount"
    )
    parser.add_argument(
        "--wait-for-pods",
        metavar="SELECTOR",
        help="first wait until no pod in --namespace matches this label selector (the "
        "agents and controllers being uninstalled, which would write it all again)",
    )
    parser.add_argument("--namespace", default="gpuguard", help="where --wait-for-pods looks")
    parser.add_argument(
        "--wait-s", type=float, default=300.0, metavar="S", help="how long to wait for them"
    )


def run_cleanup(args: argparse.Namespace) -> int:
    from gpuguard.kube import cleanup
    from gpuguard.kube.errors import KubeError
    from gpuguard.kube.fleet import get_node, list_nodes
    from gpuguard.kube.rest import load_api_for_command

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    api = load_api_for_command(args.kubeconfig)
    if args.wait_for_pods and not cleanup.wait_for_pods_gone(
        api, args.namespace, args.wait_for_pods, args.wait_s, say=say
    ):
        say(
            f"gpuguard cleanup: pods matching {args.wait_for_pods} still run after {args.wait_s:g}s"
        )
        return 1
    try:
        nodes = [get_node(api, args.node)] if args.node else list_nodes(api).items
    except KubeError as exc:
        say(f"gpuguard cleanup: cannot read the Nodes: {exc}")
        return 1
    found = [c for c in (cleanup.plan(node, args.profile) for node in nodes) if c]
    verb = "removed" if args.apply else "would remove"
    failed = 0
    for item in found:
        if args.apply:
            try:
                cleanup.apply(api, item)
            except KubeError as exc:  # the other Nodes still get theirs taken off
                failed += 1
                say(f"gpuguard cleanup: {item.node}: {exc}")
                continue
        print(f"{verb} {item.describe()}")
    print(
        f"gpuguard cleanup: {len(found)} of {len(nodes)} Nodes carried gpuguard's marks"
        + ("" if args.apply else " (dry run: --apply removes them)")
    )
    failed += _device_taint_rules(api, args.node or "", args.apply, say)
    return 1 if failed else 0


def _device_taint_rules(api: KubeApi, node: str, apply: bool, say: Callable[[str], None]) -> int:
    """gpuguard's DeviceTaintRules (per-GPU quarantine) go too; the number that failed."""
    from gpuguard.kube import dra
    from gpuguard.kube.errors import KubeError

    try:
        taints = dra.discover(api)
        rules = dra.our_rules(api, taints, node) if taints.available else []
    except KubeError as exc:
        say(f"gpuguard cleanup: cannot read the DeviceTaintRules: {exc}")
        return 1
    failed = 0
    for rule in rules:
        name = rule["metadata"]["name"]
        if apply:
            try:
                dra.delete_rule(api, taints, name)
            except KubeError as exc:
                failed += 1
                say(f"gpuguard cleanup: DeviceTaintRule {name}: {exc}")
                continue
        print(f"{'removed' if apply else 'would remove'} DeviceTaintRule {name}")
    return failed
