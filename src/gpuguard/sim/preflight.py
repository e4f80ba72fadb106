"""The preflight gate in the gpuguard run: a quick check on each node at each job start.

With ``preflight.enabled`` every placement waits ``cost_s`` for the check (the init
container) before the job starts up. The check catches, with the class's ``catch``
chance, a fault present on the node that the agent has not read yet (its periodic check
not yet due, or no periodic check reads it); the agent reads it at once and the policy
quarantines the node as usual. A healthy node fails with the ``false_failure`` chance: a
noisy slowness measurement, as a deep run's false positive, which the verify clears. A
failed check fails the start: the job is placed again, the retry not charged (the Jobs'
``podFailurePolicy`` ignores the gate's exit code).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpuguard.sim.agent_view import CHECKED_SIGNALS, DeepFinding, is_application_line, kernel_line
from gpuguard.sim.deep_suite import FALSE_POSITIVE_PACE
from gpuguard.sim.engine import Engine
from gpuguard.sim.faults import GPUS_PER_NODE, Effect, Fault
from gpuguard.sim.jobs import Job
from gpuguard.sim.slot import Slot


def unread(slot: Slot, fault: Fault) -> bool:
    """Nothing of the fault has reached the agent yet: no line, no fact, no finding."""
    if fault.id in slot.checked or any(k[0] == fault.id for k in slot.kernel):
        return False
    # A deep run's or a job's finding on its GPU.
    named = {d.gpu for d in slot.deep} | {f.gpu for f in slot.in_job}
    return fault.gpu not in named


class PreflightGate:
    """The gate's verdict on a placement's nodes, and what it leaves on them."""

    def __init__(self, engine: Engine, report: Callable[[Slot], None]) -> None:
        self.engine = engine
        self.report = report  # the agent reports the node now
        self.config = engine.scenario.preflight
        self.rng = np.random.default_rng([engine.scenario.seed, 8])

    def attach(self) -> None:
        self.engine.scheduler.gate_s = self.config.cost_s
        self.engine.scheduler.gate = self.check

    def check(self, job: Job) -> bool:
        """Run the check on each of the job's nodes: True when every one passed."""
        engine, config = self.engine, self.config
        stats, draw = engine.stats, self.rng.random
        passed = True
        for index in job.slots:
            slot = engine.slots[index]
            stats.preflight_checks += 1
            stats.preflight_node_s += config.cost_s
            caught = [
                f
                for f in slot.faults.values()
                if unread(slot, f) and draw() < config.catch.get(f.cls, 0.0)
            ]
            if caught:
                stats.preflight_caught.update(f.cls for f in caught)
                self._read(slot, caught)
            elif draw() < config.false_failure:
                stats.preflight_false += 1
                gpu = int(self.rng.integers(0, GPUS_PER_NODE))
                self._found(slot, DeepFinding("slow", gpu, FALSE_POSITIVE_PACE))
            else:
                continue
            passed = False
        if not passed:
            stats.preflight_blocked += 1
        return passed

    def _read(self, slot: Slot, caught: list[Fault]) -> None:
        """The agent reads what the check caught now, as its own checks would later."""
        now = self.engine.now
        findings = []
        for fault in caught:
            line = kernel_line(fault.signal, fault.gpu)
            if fault.signal in CHECKED_SIGNALS:
                slot.checked[fault.id] = (fault.signal, fault.gpu)
            elif line is not None and not is_application_line(line):
                slot.kernel.append((fault.id, line, now, False))
            elif fault.effect is Effect.SILENT:
                findings.append(DeepFinding("corrupt", fault.gpu))
            else:
                findings.append(DeepFinding("slow", fault.gpu, round(fault.slowdown, 2)))
        self.engine.found_by_checks(caught)
        self.engine.detected(slot)
        self._found(slot, *findings)

    def _found(self, slot: Slot, *findings: DeepFinding) -> None:
        if findings:
            slot.deep = tuple(sorted({*slot.deep, *findings}))
        self.report(slot)
