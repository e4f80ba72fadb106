"""Node conditions: the type each layer is published under, and what it says.

Conventions (see docs/architecture.md): one condition per layer, positive polarity
(``True`` = healthy), stable PascalCase types, CamelCase reasons, short messages naming
the component.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuguard.model import Finding, Layer, LayerHealth, Status

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"

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
# Karpenter's AWS provider replaces a node whose condition of these types has been False
# for its toleration (AcceleratedHardwareReady 10 min, the others 30 min).
KARPENTER_REPAIRS = frozenset(PROFILES["eks"].values())
# Every type some profile writes: those are ours to remove when no longer reported.
OWNED_TYPES = frozenset(t for profile in PROFILES.values() for t in profile.values())
# The controller's own condition (controller/position_faults.py): False while a node's
# position (a cable, an optic, a switch port) holds a fault replacing the machine did not
# cure. Not the agent's, so not in OWNED_TYPES: the agent never removes it.
POSITION_CONDITION = "GpuguardPositionHealthy"
POSITION_AT_FAULT = "PositionAtFault"
POSITION_RETURNED = "PositionReturned"
# Condition type -> layer name, for every profile an agent may be running with.
LAYER_OF_TYPE = {kind: str(layer) for names in PROFILES.values() for layer, kind in names.items()}

MESSAGE_LIMIT = 256
DRAIN_AND_RESET = "drain and reset when running work ends: "
_STATUS_OF = {
    Status.HEALTHY: TRUE,
    Status.DEGRADED: TRUE,  # usable: degraded parts are flagged, not taken out
    Status.UNHEALTHY: FALSE,
    Status.UNKNOWN: UNKNOWN,
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
            status = TRUE
        return Desired(kind, status, reason, _summary(problems, DRAIN_AND_RESET))
    return Desired(kind, status, reason, _summary(problems))


def camel_case(code: str) -> str:
    """``XID_79`` -> ``Xid79``; ``ROW_REMAP_PENDING`` -> ``RowRemapPending``."""
    return "".join(part[:1].upper() + part[1:].lower() for part in code.split("_") if part)


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
