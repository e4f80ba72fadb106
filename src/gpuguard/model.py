"""The vocabulary every part of gpuguard speaks: findings, actions, layer health.

Kept free of I/O and of Kubernetes imports so that parsers, the agent, the remediation
policy and the simulator can all share it cheaply.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum


class Layer(StrEnum):
    """The fault domain a finding is about (one node condition per layer)."""

    GPU = "gpu"
    NETWORK = "network"
    KERNEL = "kernel"


class Severity(IntEnum):
    """How bad a finding is on its own; ordered so that ``max`` gives the worst."""

    INFO = 0
    WARNING = 1
    CRITICAL = 2

    def __str__(self) -> str:
        return self.name.lower()


class Action(IntEnum):
    """The remediation ladder, least disruptive first; ``max`` of findings gives the rung."""

    NONE = 0
    KILL_JOB = 1
    RESET_GPU = 2
    REBOOT = 3
    REPLACE = 4

    def __str__(self) -> str:
        return self.name


class Status(StrEnum):
    """Verdict for one layer or for the whole node."""

    HEALTHY = "Healthy"
    DEGRADED = "Degraded"
    UNKNOWN = "Unknown"
    UNHEALTHY = "Unhealthy"

    @property
    def rank(self) -> int:
        """Worse verdicts rank higher (Unknown sits between Degraded and Unhealthy)."""
        return _STATUS_RANK[self]


_STATUS_RANK = {Status.HEALTHY: 0, Status.DEGRADED: 1, Status.UNKNOWN: 2, Status.UNHEALTHY: 3}


class Outcome(StrEnum):
    """How a check run ended, independent of what it found."""

    OK = "ok"
    NOT_APPLICABLE = "not_applicable"
    TOOL_MISSING = "tool_missing"
    TIMED_OUT = "timed_out"
    FAILED = "failed"
    UNPARSEABLE = "unparseable"


# Codes for findings that say "this check could not give a verdict".
CHECK_TIMED_OUT = "CHECK_TIMED_OUT"
CHECK_FAILED = "CHECK_FAILED"
OUTPUT_UNPARSEABLE = "OUTPUT_UNPARSEABLE"
TOOL_MISSING = "TOOL_MISSING"
NOT_APPLICABLE = "NOT_APPLICABLE"
INCONCLUSIVE_CODES = frozenset({CHECK_TIMED_OUT, CHECK_FAILED, OUTPUT_UNPARSEABLE})

OUTCOME_CODES = {
    Outcome.TIMED_OUT: CHECK_TIMED_OUT,
    Outcome.FAILED: CHECK_FAILED,
    Outcome.UNPARSEABLE: OUTPUT_UNPARSEABLE,
    Outcome.TOOL_MISSING: TOOL_MISSING,
    Outcome.NOT_APPLICABLE: NOT_APPLICABLE,
}


@dataclass(frozen=True, order=True)
class Component:
    """The part a finding is about.

    ``kind`` is ``gpu``, ``nvswitch``, ``nic`` or ``node``. ``id`` is the canonical
    identity: a GPU or NVSwitch by its PCI bus id in ``DDDD:BB:DD.F`` form (lower case),
    a NIC port as ``<device>/<port>`` (``mlx5_0/1``), the node itself as ``node``.
    ``uuid`` carries the GPU UUID when the source knows it.
    """

    kind: str
    id: str
    uuid: str | None = None

    def __str__(self) -> str:
        return self.id if self.kind == "node" else f"{self.kind} {self.id}"


NODE = Component("node", "node")


def gpu(pci_bus_id: str, uuid: str | None = None) -> Component:
    """A GPU component from any PCI bus id spelling (NVML, nvidia-smi, kernel log)."""
    return Component("gpu", normalize_pci_bus_id(pci_bus_id), uuid)


def nic(device: str, port: int | str | None = None) -> Component:
    """A network adapter, or one port of it."""
    return Component("nic", device if port is None else f"{device}/{port}")


def normalize_pci_bus_id(raw: str) -> str:
    """Canonical ``dddd:bb:dd.f`` from the spellings tools use.

    NVML and nvidia-smi print an 8-digit domain (``00000000:19:00.0``); the kernel log
    prints ``0000:19:00`` without the function. Anything that does not look like a bus id
    is returned stripped and lower-cased so that it still identifies the part.
    """
    text = raw.strip().lower()
    if text.startswith("pci:"):
        text = text[4:]
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0000", *parts]
    if len(parts) != 3:
        return text
    domain, bus, devfn = parts
    if "." not in devfn:
        devfn += ".0"
    domain = domain[-4:].rjust(4, "0")
    return f"{domain}:{bus.rjust(2, '0')}:{devfn}"


_CANONICAL_BUS_ID = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def is_pci_bus_id(raw: str) -> bool:
    """Whether ``raw`` is a PCI bus id in a spelling :func:`normalize_pci_bus_id` reads."""
    return _CANONICAL_BUS_ID.fullmatch(normalize_pci_bus_id(raw)) is not None


@dataclass(frozen=True)
class Finding:
    """One thing a check saw, with the evidence and the action it calls for."""

    layer: Layer
    code: str
    severity: Severity
    action: Action
    component: Component
    source: str
    message: str
    evidence: str = ""
    # A repair that waits for running work: NVIDIA's "drain and reset" (a row remap or page
    # retirement pending, Xid 154's "Drain and Reset", a GPU the deep suite found slow).
    # The GPU still computes correctly, so its jobs may finish; no new work may start.
    deferred: bool = False

    @property
    def inconclusive(self) -> bool:
        """True when the finding says a check gave no verdict (hung, crashed, garbled)."""
        return self.code in INCONCLUSIVE_CODES

    def to_dict(self) -> dict[str, object]:
        data: dict[str, object] = {
            "layer": str(self.layer),
            "code": self.code,
            "severity": str(self.severity),
            "action": str(self.action),
            "component": str(self.component),
            "source": self.source,
            "message": self.message,
            "evidence": self.evidence,
        }
        if self.deferred:
            data["deferred"] = True
        return data


@dataclass
class CheckResult:
    """What one run of one check produced."""

    check: str
    layer: Layer
    outcome: Outcome
    findings: list[Finding] = field(default_factory=list)
    duration_s: float = 0.0
    detail: str = ""

    @property
    def answered(self) -> bool:
        """The check gave a verdict (including "nothing here to check")."""
        return self.outcome in (Outcome.OK, Outcome.NOT_APPLICABLE)


@dataclass
class LayerHealth:
    """The verdict for one layer and the findings behind it."""

    layer: Layer
    status: Status
    findings: list[Finding]
    answered_by: list[str]
    not_answered: list[str]

    @property
    def action(self) -> Action:
        return max((f.action for f in self.findings), default=Action.NONE)

    @property
    def problems(self) -> list[Finding]:
        """The findings worth publishing: above info, or a deferred repair."""
        return [f for f in self.findings if f.severity > Severity.INFO or f.deferred]

    @property
    def deferred(self) -> bool:
        """Unhealthy only for repairs that wait for running work (``Finding.deferred``):
        every finding that makes the layer unhealthy is deferred, none is critical now, no
        check of the layer went without a verdict, and some source answered."""
        if self.status is not Status.UNHEALTHY or not self.answered_by:
            return False
        blocking = [
            f
            for f in self.findings
            if f.deferred or f.inconclusive or f.severity is Severity.CRITICAL
        ]
        return bool(blocking) and all(f.deferred and not f.inconclusive for f in blocking)

    def to_dict(self) -> dict[str, object]:
        data: dict[str, object] = {
            "status": str(self.status),
            "action": str(self.action),
            "answered_by": self.answered_by,
            "not_answered": self.not_answered,
            "findings": [f.to_dict() for f in self.findings],
        }
        if self.deferred:
            data["deferred"] = True
        return data


def assess_layer(
    layer: Layer,
    findings: Iterable[Finding],
    answered_by: list[str],
    not_answered: list[str],
    *,
    fail_closed: bool = True,
) -> LayerHealth:
    """Decide a layer's status from its findings and from which sources answered.

    A real critical finding wins (Unhealthy), and so does a deferred one: a repair the
    evidence asks for, even one that waits for running work, takes the layer out of
    service for new work (docs/remediation.md, "Drain and reset"). Otherwise, if any check
    of the layer hung, crashed or printed garbage, or no source answered at all, the layer
    is Unknown, which the fail-closed default reports as Unhealthy: a diagnostic we could
    not read is never taken for a healthy part.
    """
    ordered = sorted(findings, key=lambda f: (-f.severity, -f.action, f.code, f.component))
    real = [f for f in ordered if not f.inconclusive]
    if any(f.severity is Severity.CRITICAL or f.deferred for f in real):
        status = Status.UNHEALTHY
    elif any(f.inconclusive for f in ordered) or not answered_by:
        status = Status.UNHEALTHY if fail_closed else Status.UNKNOWN
    elif any(f.severity is Severity.WARNING for f in real):
        status = Status.DEGRADED
    else:
        status = Status.HEALTHY
    return LayerHealth(layer, status, ordered, answered_by, not_answered)


@dataclass
class NodeReport:
    """Every layer's health for one node, and the check runs behind it."""

    layers: dict[Layer, LayerHealth]
    results: list[CheckResult]

    @property
    def status(self) -> Status:
        return max((h.status for h in self.layers.values()), key=lambda s: s.rank)

    @property
    def action(self) -> Action:
        return max((h.action for h in self.layers.values()), default=Action.NONE)

    def to_dict(self) -> dict[str, object]:
        return {
            "status": str(self.status),
            "action": str(self.action),
            "layers": {str(layer): h.to_dict() for layer, h in self.layers.items()},
            "checks": [
                {
                    "check": r.check,
                    "layer": str(r.layer),
                    "outcome": str(r.outcome),
                    "duration_s": round(r.duration_s, 3),
                    "detail": r.detail,
                }
                for r in self.results
            ],
        }
