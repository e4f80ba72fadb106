"""The Events the agent records on its Node: one per condition status transition, naming
the findings behind it (``kubectl describe node`` shows them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuguard.contract.conditions import PROFILES, TRUE, Desired
from gpuguard.contract.keys import AGENT_CONTROLLER
from gpuguard.kube.errors import NodeView
from gpuguard.model import NodeReport

if TYPE_CHECKING:
    from gpuguard.kube.client import NodeApi

HEALTH_CHANGED = "HealthChanged"


def record_health_changed(
    api: NodeApi, node: NodeView, report: NodeReport, want: Desired, old: str | None, profile: str
) -> None:
    """A Warning unless the condition became True; raises ``KubeError`` like any write."""
    api.create_event(
        node,
        reason=want.reason,
        note=health_changed_note(report, want, old, profile),
        warning=want.status != TRUE,
        controller=AGENT_CONTROLLER,
        instance=f"{AGENT_CONTROLLER}/{node.name}",
        action=HEALTH_CHANGED,
    )


def health_changed_note(report: NodeReport, want: Desired, old: str | None, profile: str) -> str:
    layer = next(layer for layer in report.layers if PROFILES[profile][layer] == want.type)
    codes = sorted({f.code for f in report.layers[layer].findings if f.severity > 0})
    return f"{want.type}: {old or 'none'} -> {want.status} ({want.reason}); " + (
        f"findings: {', '.join(codes)}" if codes else "no findings"
    )
