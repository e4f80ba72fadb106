"""Shared causes: several nodes of one topology domain failing in one layer together.

A leaf switch or a cable bundle that dies takes a port down on every node behind it at
once. Each node on its own looks like a NIC fault that asks for a reboot, then a
replacement; together they are one incident that no action on the nodes can fix. So the
policy holds them (docs/remediation.md, "Shared causes"): tainted, no disruptive rung, no
budget slot, until the domain recovers or a person acts.

Pure and stateless: the grouping is recomputed from the observed layers on every call, so
it needs no stored state, and a node's membership changes only when one of its layers
changes status (``since`` is the condition's lastTransitionTime).
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Mapping

from gpuguard.contract.conditions import FALSE
from gpuguard.remediation.model import NodeObservation
from gpuguard.remediation.policy_sections import Correlation

# node -> layer -> why that layer's fault is held
SharedCauses = dict[str, dict[str, str]]


def shared_causes(nodes: Mapping[str, NodeObservation], config: Correlation) -> SharedCauses:
    """The layers of each node whose fault is shared with its domain.

    A node's layer is shared when at least ``min_nodes`` nodes of its domain (itself
    included) have that layer False and turned False within ``window_s`` of it.
    """
    if not config.enabled:
        return {}
    failing: dict[tuple[str, str], list[tuple[float, str]]] = defaultdict(list)
    for name, node in nodes.items():
        if not node.domain or not node.exists:
            continue
        for watched in config.layers:
            report = node.layers.get(watched)
            if report is not None and report.status == FALSE:
                failing[node.domain, watched].append((report.since, name))
    shared: SharedCauses = defaultdict(dict)
    window = config.window_s
    for (domain, layer), members in failing.items():
        if len(members) < config.min_nodes:
            continue
        members.sort()
        times = [since for since, _ in members]
        for since, name in members:
            together = bisect_right(times, since + window) - bisect_left(times, since - window)
            if together >= config.min_nodes:
                shared[name][layer] = (
                    f"{layer} fault shared by {together} nodes of"
                    f" {config.domain_label}={domain} (within {window:g}s)"
                )
    return dict(shared)


def has_own_fault(node: NodeObservation, shared: Mapping[str, str]) -> bool:
    """Does a layer without a shared cause show a fault? (``false_layers(own_faults(...))``
    without building the node: a held node is asked this on every pass.)"""
    return any(report.status == FALSE for name, report in node.layers.items() if name not in shared)


def own_faults(node: NodeObservation, shared: Mapping[str, str]) -> NodeObservation:
    """The node as its own faults show it: the layers with a shared cause left out."""
    if not shared:
        return node
    layers = {name: report for name, report in node.layers.items() if name not in shared}
    return dataclasses.replace(node, layers=layers)
