"""Crashes no check explains, remembered per node across jobs.

A job's own bug crashes it on whatever node it runs; a node with a fault no check sees
crashes whatever job runs on it. So a crash that nothing attributes (no finding, no
lost node, no known signature) is counted against the node with the job it belonged to,
and a node where pods of ``crashes.jobs`` different jobs crashed within
``crashes.window_s`` becomes suspect (docs/remediation.md, "Crashes no check explains").

A suspicion is the ``crashes`` layer of the node's observation, read by ``decide`` as any
other evidence: the first quarantines the node and asks the deep suite for a second
measurement before anything is destroyed (``confirm``); a node suspect again within the
lemon window is a repeat offender, replaced through the ladder (and its position cap).
The crashes that raised a suspicion are spent with it: the next needs new ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuguard.contract.report import LayerReport
from gpuguard.model import Action
from gpuguard.remediation.policy import Policy

CRASH_LAYER = "crashes"
CRASHES_ACROSS_JOBS = "NODE_CRASHES_ACROSS_JOBS"  # first suspicion: confirm, then act
CRASHES_REPEATED = "NODE_CRASHES_REPEATED"  # suspect again within the lemon window: replace
SUSPECT = "CrashesAcrossJobs"  # the layer's reason


@dataclass(frozen=True)
class Crash:
    """A pod that failed on ``node`` with no cause attributed, as part of ``job``."""

    node: str
    job: str  # the owning job's identity (namespace/name), never the pod's
    at: float


@dataclass(frozen=True)
class Suspicion:
    node: str
    jobs: tuple[str, ...]  # the distinct jobs whose crashes raised it
    at: float  # when the last of them crashed
    repeats: int  # suspicions of this node within the lemon window, this one included

    @property
    def code(self) -> str:
        return CRASHES_REPEATED if self.repeats > 1 else CRASHES_ACROSS_JOBS


@dataclass
class _NodeCrashes:
    crashes: list[Crash] = field(default_factory=list)
    suspicions: list[Suspicion] = field(default_factory=list)


class CrashMemory:
    """Unattributed crashes and the suspicions they raised, per node."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._nodes: dict[str, _NodeCrashes] = {}

    def record(self, crash: Crash) -> Suspicion | None:
        """Remember ``crash``; the suspicion it completes, if it completes one."""
        settings = self.policy.crashes
        if not settings.enabled:
            return None
        node = self._nodes.setdefault(crash.node, _NodeCrashes())
        node.crashes = [c for c in node.crashes if crash.at - c.at < settings.window_s]
        node.crashes.append(crash)
        jobs = tuple(sorted({c.job for c in node.crashes}))
        if len(jobs) < settings.jobs:
            return None
        earlier = [s for s in node.suspicions if crash.at - s.at < self.policy.lemon_window_s]
        suspicion = Suspicion(crash.node, jobs, crash.at, repeats=len(earlier) + 1)
        node.crashes = []
        node.suspicions = [*earlier, suspicion]
        return suspicion

    def suspicion(self, node: str, now: float) -> Suspicion | None:
        """The node's suspicion standing at ``now`` (held for ``crashes.window_s``)."""
        known = self._nodes.get(node)
        if known is None or not known.suspicions:
            return None
        latest = known.suspicions[-1]
        return latest if now - latest.at < self.policy.crashes.window_s else None

    def crashes(self, node: str, now: float) -> list[Crash]:
        """The node's unspent crashes still within the window."""
        known = self._nodes.get(node)
        window = self.policy.crashes.window_s
        return [c for c in known.crashes if now - c.at < window] if known else []

    def clear(self, node: str) -> None:
        """The machine left (replaced, deleted): what it did says nothing of the next."""
        self._nodes.pop(node, None)

    def nodes(self) -> Iterable[str]:
        return tuple(self._nodes)


def crash_layer(suspicion: Suspicion) -> tuple[str, LayerReport]:
    """The layer a standing suspicion adds to the node's observation.

    The first asks for a reboot, which ``confirm`` holds back until the deep suite has
    measured the node (its code is one of the codes that need a second measurement);
    a repeat asks for a replacement at once.
    """
    repeated = suspicion.repeats > 1
    return CRASH_LAYER, LayerReport(
        status="False",
        reason=SUSPECT,
        since=suspicion.at,
        action=Action.REPLACE if repeated else Action.REBOOT,
        codes=(suspicion.code,),
    )
