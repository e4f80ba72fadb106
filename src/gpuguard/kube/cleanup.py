"""What gpuguard leaves on Nodes, and taking it off (``gpuguard cleanup``, the chart's
uninstall hook).

After gpuguard is gone nothing may keep acting on what it wrote: a stale
``AcceleratedHardwareReady=False`` is a replacement order to Karpenter's node repair, a
leftover taint keeps work off a node for good. Per Node: gpuguard's conditions (the EKS
names only when gpuguard wrote them, ``profile="eks"``: the EKS node monitoring agent
writes them too), our taint, our cordon (only where our marker says we made it), and our
annotations. Nothing else is touched. NodeRemediations stay: they are the repair record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuguard.clock import SYSTEM_CLOCK
from gpuguard.contract.conditions import POSITION_CONDITION, PROFILES
from gpuguard.contract.keys import (
    CORDONED_BY_US_ANNOTATION,
    MEMORY_ANNOTATION,
    REPORT_ANNOTATION,
    VERIFY_REQUEST_ANNOTATION,
)
from gpuguard.kube import fleet
from gpuguard.kube.rest import NODES, PODS, Json, KubeApi

ANNOTATIONS = (REPORT_ANNOTATION, MEMORY_ANNOTATION, VERIFY_REQUEST_ANNOTATION)


@dataclass(frozen=True)
class NodeCleanup:
    """What one Node carries of gpuguard's."""

    node: str
    conditions: tuple[str, ...]
    annotations: tuple[str, ...]
    taint: bool
    cordon: bool

    def __bool__(self) -> bool:
        return bool(self.conditions or self.annotations or self.taint or self.cordon)

    def describe(self) -> str:
        parts = [f"condition {kind}" for kind in self.conditions]
        parts += [f"annotation {key}" for key in self.annotations]
        parts += ["taint gpuguard.io/unhealthy"] if self.taint else []
        parts += ["our cordon"] if self.cordon else []
        return f"{self.node}: " + ", ".join(parts)


def owned_types(profile: str) -> frozenset[str]:
    """The condition types gpuguard wrote under ``profile`` (its own names always, and
    the controller's)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown condition profile {profile!r} (profiles: {', '.join(PROFILES)})")
    ours = {*PROFILES["gpuguard"].values(), POSITION_CONDITION}
    return frozenset(ours) | frozenset(PROFILES[profile].values())


def plan(node: Json, profile: str) -> NodeCleanup:
    metadata = node.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    owned = owned_types(profile)
    conditions = (node.get("status") or {}).get("conditions") or []
    return NodeCleanup(
        node=str(metadata.get("name", "")),
        conditions=tuple(sorted(c["type"] for c in conditions if c.get("type") in owned)),
        annotations=tuple(key for key in ANNOTATIONS if key in annotations),
        taint=fleet.is_tainted(node),
        cordon=CORDONED_BY_US_ANNOTATION in annotations,
    )


def apply(api: KubeApi, cleanup: NodeCleanup) -> None:
    """Take ``cleanup`` off its Node; each write touches only what is ours."""
    name = cleanup.node
    if cleanup.conditions:
        fleet.patch_conditions(api, name, (), remove=cleanup.conditions)
    if cleanup.annotations:
        removed = dict.fromkeys(cleanup.annotations)
        api.patch(NODES.path(name), {"metadata": {"annotations": removed}})
    if cleanup.taint:
        fleet.untaint(api, fleet.get_node(api, name))
    if cleanup.cordon:
        fleet.uncordon(api, fleet.get_node(api, name))


def wait_for_pods_gone(
    api: KubeApi,
    namespace: str,
    selector: str,
    timeout_s: float,
    *,
    say: Callable[[str], None],
    poll_s: float = 1.0,
) -> bool:
    """Until no pod matches ``selector`` (gpuguard's agents and controllers, which would
    write it all again); False at the timeout."""
    deadline = SYSTEM_CLOCK.monotonic() + timeout_s
    while True:
        left = api.list(PODS.path(namespace=namespace), label_selector=selector).items
        if not left:
            return True
        if SYSTEM_CLOCK.monotonic() >= deadline:
            return False
        say(f"waiting for {len(left)} gpuguard pods to end ({selector})")
        time.sleep(poll_s)
