"""The gpuguard run's attribution of job interruptions and its crash memory.

When a fault ends a job's run, the pod on the fault's node failed first; the controller
judges it with the real ``remediation.attribution.attribute`` against the node as the
agent reports it within the attribution window (the fault's own kernel line or GPU fact
included: they show seconds after the fault, well within the window). An interruption
judged the infrastructure's is marked in time for the Job's ``podFailurePolicy`` with
probability ``attribution.coverage`` and then costs no retry; a job's own failure is
wrongly marked with probability ``attribution.error_rate``. A crash nothing explains is
recorded against its node in the real ``remediation.crash_memory``; a suspicion it raises
becomes the node's ``crashes`` layer, which the real ``decide`` acts on.

Only the pod on the fault's node is judged: the job's pods on other nodes fail on the
collective with it (a NCCL error or a lost peer), which the signature catalog and the
lost-peer rule attribute, so they add no unexplained crash (an assumption, stated in
docs/simulator.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from gpuguard.contract.report import LayerReport
from gpuguard.remediation.attribution import NodeAtFailure, PodFailure, attribute
from gpuguard.remediation.crash_memory import Crash, CrashMemory, Suspicion, crash_layer
from gpuguard.remediation.policy import Policy
from gpuguard.sim.agent_view import CHECKED_SIGNALS, NodeSignals, kernel_line
from gpuguard.sim.faults import Effect, Fault
from gpuguard.sim.jobs import Job
from gpuguard.sim.slot import Slot

if TYPE_CHECKING:
    from gpuguard.sim.engine import Engine

# Classes whose faults are the job's own doing: its retries are for them.
JOBS_OWN = frozenset({"application"})
# Classes that leave nothing on the node: only the pod's last words can name them.
NO_NODE_SIGNAL = frozenset({"unattributed", "nccl_hang"})


class JobAttribution:
    """Judges each fault interruption of a job; remembers the crashes nothing explains."""

    def __init__(
        self, engine: Engine, policy: Policy, suspected: Callable[[Slot, Suspicion], None]
    ) -> None:
        self.engine = engine
        self.policy = policy
        self.settings = engine.scenario.attribution
        self.memory = CrashMemory(policy)
        self.suspected = suspected
        self._rng = np.random.default_rng([engine.scenario.seed, 4])

    def charges(self, job: Job, cause: str, fault: Fault | None) -> bool:
        """Does the interruption use up one of the job's retries?"""
        if cause == "platform":
            return False  # our own kill or eviction: DisruptionTarget, set by Kubernetes
        stats = self.engine.stats
        if fault is None or fault.effect is Effect.SILENT or not self.policy.attribution.enabled:
            return True  # no pod failed (bad results traced by the owners), or not judged
        slot = self.engine.slots[fault.slot]
        verdict = attribute(
            self._failure(job, slot, fault),
            self._node(slot, fault),
            self.policy.attribution.window_s,
        )
        draw = float(self._rng.random())
        if verdict.infrastructure:
            marked = draw < self.settings.coverage
            stats.attribution["attributed" if marked else "attributed_late"] += 1
            return not marked
        if fault.cls in JOBS_OWN and draw < self.settings.error_rate:
            stats.attribution["wrongly_attributed"] += 1
            return False
        stats.attribution["charged_own" if fault.cls in JOBS_OWN else "charged_infra"] += 1
        if verdict.unexplained:
            self._remember(slot, job)
        return True

    def _failure(self, job: Job, slot: Slot, fault: Fault) -> PodFailure:
        now = self.engine.now
        share = self.settings.signature_share
        signature = fault.cls in NO_NODE_SIGNAL and self._rng.random() < share
        return PodFailure(
            pod=f"job-{job.id}/{slot.name}",
            job=f"job-{job.id}",
            node=slot.name,
            at=now,
            # A whole-node pod holds every GPU: any GPU a finding names is its own.
            signature="NCCL_ERROR" if signature else "",
            infrastructure_signature=True if signature else None,
        )

    def _node(self, slot: Slot, fault: Fault) -> NodeAtFailure:
        """The node as the agent reports it within the window: the fault's signal shown."""
        now = self.engine.now
        signals = self.engine.signals(slot)
        line = kernel_line(fault.signal, fault.gpu)
        kernel = tuple(sorted({*signals.kernel, line})) if line else signals.kernel
        checked = signals.checked
        if fault.signal in CHECKED_SIGNALS:
            checked = tuple(sorted({*checked, (fault.signal, fault.gpu)}))
        shown = dataclasses.replace(signals, kernel=kernel, checked=checked)
        return NodeAtFailure(
            exists=slot.machine is not None,
            ready=not slot.notready,
            not_ready_since=fault.start if slot.notready else None,
            layers=self._layers(shown, now),
        )

    def _layers(self, signals: NodeSignals, now: float) -> tuple[LayerReport, ...]:
        layers = self.engine.view.verdict(signals).layers.values()
        return tuple(dataclasses.replace(layer, since=now) for layer in layers)

    def _remember(self, slot: Slot, job: Job) -> None:
        stats = self.engine.stats
        stats.attribution["unexplained"] += 1
        suspicion = self.memory.record(Crash(slot.name, f"job-{job.id}", self.engine.now))
        if suspicion is None:
            return
        stats.suspicions += 1
        stats.false_suspicions += not (slot.silent or self.engine.has_node_fault(slot))
        self.suspected(slot, suspicion)

    def layer(self, slot: Slot, now: float) -> tuple[str, LayerReport] | None:
        """The node's ``crashes`` layer while a suspicion stands."""
        suspicion = self.memory.suspicion(slot.name, now)
        return crash_layer(suspicion) if suspicion is not None else None

    def forget(self, name: str) -> None:
        """The machine left: its crashes say nothing of the next."""
        self.memory.clear(name)
