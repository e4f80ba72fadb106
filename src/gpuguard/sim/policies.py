"""The two baselines the gpuguard policy is compared with, on the same failures.

- ``none``: Kubernetes defaults only. Nothing reads GPU signals; a node is dealt with when
  it stops answering, a GPU fault kills the job (retried by its own budget), and people
  chase the nodes that keep killing jobs.
- ``reactive``: node-problem-detector plus a drain controller and reboots. Any kernel log
  line its rules match (any Xid, as the usual custom rule ``NVRM: Xid`` does) cordons,
  drains and reboots the node; the condition clears with the new boot. It reads no GPU
  facts and no RDMA ports, runs no deep or load checks, and its drains cost the jobs a
  retry (no job-aware recovery).
"""

from __future__ import annotations

from collections import defaultdict

from gpuguard.sim.engine import Engine, Slot
from gpuguard.sim.faults import DAY

REPEAT_WINDOW_S = 7 * DAY  # a second drain within this window gets a person's attention


class NoPolicy:
    name = "none"
    job_aware = False

    def attach(self, engine: Engine) -> None:
        self.engine = engine

    def signals_changed(self, slot: Slot) -> None:
        """Nothing reads the node's signals."""

    def node_replaced(self, slot: Slot) -> None:
        """A new machine needs nothing from us."""

    def action_done(self, slot: Slot, what: str, succeeded: bool) -> None:
        """Only people act, and they need no answer."""


class ReactivePolicy:
    name = "reactive"
    job_aware = False

    def attach(self, engine: Engine) -> None:
        self.engine = engine
        self.busy: set[int] = set()
        self.drains: dict[int, list[float]] = defaultdict(list)

    def signals_changed(self, slot: Slot) -> None:
        engine = self.engine
        if slot.index in self.busy or slot.machine is None or slot.down:
            return
        if not engine.view.kernel_events(line for _, line, _, _ in slot.kernel):
            return
        # A node condition is set; the drain controller cordons and drains at once.
        now = engine.now
        engine.detected(slot)
        self.busy.add(slot.index)
        if not engine.has_node_fault(slot):
            engine.stats.false_drains += 1
        engine.stats.actions["drain"] += 1
        engine.set_flags(slot, cordoned=True)
        engine.interrupt_job(slot, cause="platform")
        recent = [t for t in self.drains[slot.index] if now - t < REPEAT_WINDOW_S]
        self.drains[slot.index] = [*recent, now]
        if recent:
            engine.request_human(slot)
        drain = engine.scenario.actions.drain_min * 60.0
        engine.at(now + drain, self._reboot, slot, slot.machine)

    def _reboot(self, slot: Slot, machine: int | None) -> None:
        if slot.machine != machine or slot.down:
            self.busy.discard(slot.index)
            return
        self.engine.repair(slot, "reboot")

    def action_done(self, slot: Slot, what: str, succeeded: bool) -> None:
        # The new boot clears the kernel-log condition; the drain controller uncordons.
        self.busy.discard(slot.index)
        self.engine.set_flags(slot, cordoned=False)
        self.signals_changed(slot)

    def node_replaced(self, slot: Slot) -> None:
        self.busy.discard(slot.index)
        self.drains.pop(slot.index, None)
