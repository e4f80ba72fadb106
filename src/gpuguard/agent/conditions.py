"""From layer health to Node conditions, and from conditions to the write that keeps them.

Pure: no clock, no I/O. Conventions (see docs/architecture.md): one condition per layer,
positive polarity (``True`` = healthy), stable PascalCase types, CamelCase reasons, short
messages naming the component; ``lastTransitionTime`` moves only when ``status`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuguard.model import Finding, Layer, LayerHealth, Status

# Condition type per layer, by profile. "eks" writes the names that Karpenter's node repair
# (and the EKS node monitoring agent) already act on.
PROFILES: dict[str, dict[Layer, str]] = {
    "gpuguard": {
        Layer.GPU: "GpuguardGPUHealthy",
        Layer.NETWORK: "GpuguardNetworkHealthy",
        Layer.KERNEL: "GpuguardKernelHealthy",
    },
    "eks": {
        Layer.GPU: "AcceleratedHardwareReady",
        Layer.NETWORK: "NetworkingReady",
        Layer.KERNEL: "KernelReady",
    },
}
# Profiles whose conditions a replace-only repairer acts on: Karpenter's node repair replaces
# a node whose AcceleratedHardwareReady has been False for 10 minutes, ignoring PDBs. A
# deferred repair (drain and reset) waits for running work for hours, so under these names
# it stays True (its reason and message still say it) and the controller reads the deferral
# from the report annotation; under our own names it is False.
DEFERRED_STAYS_TRUE = frozenset({"eks"})
# Every type some profile writes: those are ours to remove when no longer reported.
OWNED_TYPES = frozenset(t for profile in PROFILES.values() for t in profile.values())

MESSAGE_LIMIT = 256
_STATUS_OF = {
    Status.HEALTHY: "True",
    Status.DEGRADED: "True",  # usable: degraded parts are flagged, not taken out
    Status.UNHEALTHY: "False",
    Status.UNKNOWN: "Unknown",
}


@dataclass(frozen=True)
class Desired:
    """What one condition should say."""

    type: str
    status: str
    reason: str
    message: str


def desired_conditions(layers: Mapping[Layer, LayerHealth], profile: str) -> list[Desired]:
    names = PROFILES[profile]
    return [_desired(names[layer], health, profile) for layer, health in layers.items()]


def _desired(kind: str, health: LayerHealth, profile: str) -> Desired:
    status = _STATUS_OF[health.status]
    problems = health.problems
    if health.status is Status.HEALTHY:
        return Desired(kind, status, "Healthy", _answered(health))
    if not problems:  # nothing answered and nothing failed: every source is missing
        return Desired(
            kind, status, "NoSourceAnswered", "no diagnostic source answered"[:MESSAGE_LIMIT]
        )
    reason = camel_case(problems[0].code)
    if health.status is Status.DEGRADED:
        reason = f"Degraded{reason}"
    if health.deferred:
        # Drain and reset: no new work, running work finishes, then the GPU is reset.
        if profile in DEFERRED_STAYS_TRUE:
            status = "True"
        return Desired(kind, status, reason, _summary(problems, DRAIN_AND_RESET))
    return Desired(kind, status, reason, _summary(problems))


def camel_case(code: str) -> str:
    """``XID_79`` -> ``Xid79``; ``ROW_REMAP_PENDING`` -> ``RowRemapPending``."""
    return "".join(part[:1].upper() + part[1:].lower() for part in code.split("_") if part)


DRAIN_AND_RESET = "drain and reset when running work ends: "


def _summary(problems: list[Finding], prefix: str = "") -> str:
    shown: list[str] = []
    for finding in problems:
        entry = f"{finding.code} {finding.component}"
        if len(prefix + "; ".join([*shown, entry])) > MESSAGE_LIMIT - 16:
            break
        shown.append(entry)
    rest = len(problems) - len(shown)
    return prefix + "; ".join(shown) + (f" (+{rest} more)" if rest else "")


def _answered(health: LayerHealth) -> str:
    return f"checked by {', '.join(health.answered_by)}"[:MESSAGE_LIMIT]


@dataclass(frozen=True)
class ConditionWrite:
    """The conditions to write now, the types to remove, and the status transitions."""

    conditions: list[dict[str, Any]]
    remove: list[str]
    transitions: list[tuple[Desired, str | None]]  # (new, old status or None)

    @property
    def empty(self) -> bool:
        return not self.conditions and not self.remove


def plan_write(
    desired: list[Desired],
    current: Mapping[str, Mapping[str, Any]],
    now: str,
    *,
    heartbeat_due: bool,
) -> ConditionWrite:
    """What to write so the Node says ``desired``; ``current`` is what it says now.

    A condition is written when its status, reason or message changed, or when the
    heartbeat is due. ``lastTransitionTime`` is kept unless the status changed.
    """
    conditions = []
    transitions: list[tuple[Desired, str | None]] = []
    for want in desired:
        have = current.get(want.type)
        old_status = have.get("status") if have else None
        changed = have is None or (old_status, have.get("reason"), have.get("message")) != (
            want.status,
            want.reason,
            want.message,
        )
        if not changed and not heartbeat_due:
            continue
        transitioned = old_status != want.status
        if transitioned:
            transitions.append((want, old_status))
        last_transition = now if transitioned or not have else have.get("lastTransitionTime")
        conditions.append(
            {
                "type": want.type,
                "status": want.status,
                "reason": want.reason,
                "message": want.message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": last_transition or now,
            }
        )
    wanted = {d.type for d in desired}
    remove = sorted(t for t in current if t in OWNED_TYPES and t not in wanted)
    return ConditionWrite(conditions, remove, transitions)
