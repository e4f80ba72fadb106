"""A fault's life on a node: its onset, the signals the agent reads of it, its end.

A fault shows as a kernel log line (seconds after it starts) or as a value a periodic
check reads (at the node's next check); ``signals`` is what the agent reads now. A fault
that was repaired or replaced away before one of its signals comes due shows nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuguard.sim.accounting import FaultTimes, HiddenTimes
from gpuguard.sim.agent_view import CHECKED_SIGNALS, NodeSignals, is_application_line, kernel_line
from gpuguard.sim.faults import HIDDEN_CLASSES, HOUR, OFFLINE_CLASSES, Effect, Fault, Fix
from gpuguard.sim.slot import Slot
from gpuguard.sim.world import World

APPLICATION_FAULT_TTL_S = 600.0  # the agent's default application_fault_ttl_s


class FaultProcess:
    """Starts each fault of the run's failure stream, shows its signals and ends it."""

    def __init__(self, world: World) -> None:
        self._world = world
        self._events = world.events
        self._stats = world.stats
        self._driver = world.driver
        self._detection = world.scenario.detection
        self._slots = world.slots
        self.on_start: Callable[[Slot, Fault], None] | None = None  # a fault began on a node

    def start(self, fault: Fault) -> None:
        slot = self._slots[fault.slot]
        self._begin(slot, fault)
        if (
            fault.recorded_end is not None
            and fault.cls in OFFLINE_CLASSES
            and slot.machine is not None
            and not slot.down
        ):  # the trace's operators took the node offline, job or not
            self._world.fleet.take_offline(slot, fault)

    def _arm_notice(self, slot: Slot, fault: Fault) -> None:
        """People notice a persistently slow node through the job on it, in time."""
        delay = self._detection.slow_noticed_h
        if delay is None or fault.effect is not Effect.SLOW or fault.fix is Fix.SELF:
            return
        self._events.at(self._events.now + delay * HOUR, self._noticed, slot, fault)

    def _noticed(self, slot: Slot, fault: Fault) -> None:
        if not self.is_current(slot, fault) or slot.machine is None:
            return
        if slot.job is None or slot.down:  # nobody's job is slow here now: look again later
            self._arm_notice(slot, fault)
            return
        self._stats.detected([fault], self._events.now)
        self._world.fleet.request_human(slot)

    def _begin(self, slot: Slot, fault: Fault) -> None:
        # A cable or a switch fails whether or not a machine is running in the slot; it
        # shows once one is (``show_again``). A replayed record happened even while an
        # action held the node: it shows when the node is back.
        held = slot.down and fault.recorded_end is None
        if not fault.stays_with_slot and (slot.machine is None or held):
            self._stats.dropped_faults += 1  # no machine running there to fail
            return
        if fault.lemon and not slot.original:
            self._stats.dropped_faults += 1  # the lemon left with its extra faults
            return
        if fault.fix is Fix.RESTART and fault.effect is not Effect.NONE and slot.job is None:
            self._stats.dropped_faults += 1  # a job's own fault needs a job
            return
        slot.faults[fault.id] = fault
        self._stats.started(fault)
        if fault.disables:
            slot.incidents.append(fault.id)
            self._stats.fault_times[fault.id] = FaultTimes()
        if fault.cls in HIDDEN_CLASSES:
            self._stats.hidden[fault.id] = HiddenTimes()
        if fault.effect is Effect.DOWN:
            slot.notready = True
            self._world.fleet.request_human(slot)  # a machine that stopped answering gets a ticket
        at = self._events.at
        line = kernel_line(fault.signal, fault.gpu)
        if line is not None:
            at(fault.start + self._detection.kernel_log_s, self._show_line, slot, fault, line)
        if fault.signal in CHECKED_SIGNALS:
            delay = fault.check_phase * self._detection.check_interval_s
            at(fault.start + delay, self._show_checked, slot, fault)
        if fault.end is not None:
            at(fault.end, self._end, slot, fault)
        self._arm_notice(slot, fault)
        self._world.scheduler.hit(slot, fault)
        self._world.fleet.refresh(slot)
        if self.on_start is not None:
            self.on_start(slot, fault)

    @staticmethod
    def is_current(slot: Slot, fault: Fault) -> bool:
        """The fault is still on the node (not ended, repaired or replaced away)."""
        return slot.faults.get(fault.id) is fault

    def _show_line(self, slot: Slot, fault: Fault, line: str) -> None:
        if not self.is_current(slot, fault) or slot.down or slot.machine is None:
            return
        now = self._events.now
        application = is_application_line(line)
        slot.kernel.append((fault.id, line, now, application))
        if application:
            self._events.at(now + APPLICATION_FAULT_TTL_S, self._expire_lines, slot)
        self._driver.signals_changed(slot)

    def _expire_lines(self, slot: Slot) -> None:
        now = self._events.now
        before = len(slot.kernel)
        slot.kernel = [
            k for k in slot.kernel if not (k[3] and now - k[2] >= APPLICATION_FAULT_TTL_S)
        ]
        if len(slot.kernel) != before:
            self._driver.signals_changed(slot)

    def _show_checked(self, slot: Slot, fault: Fault) -> None:
        if not self.is_current(slot, fault) or slot.down or slot.machine is None:
            return
        slot.checked[fault.id] = (fault.signal, fault.gpu)
        self._driver.signals_changed(slot)

    def show_again(self, slot: Slot) -> None:
        """A node back from an action, or a new machine in the slot: what is still wrong
        (for a new machine, what the position has: the same port down) shows again once
        its checks run."""
        at = self._events.at
        due = self._events.now + self._detection.check_interval_s
        for fault in list(slot.faults.values()):
            line = kernel_line(fault.signal, fault.gpu)
            if line is not None and not any(k[0] == fault.id for k in slot.kernel):
                at(due, self._show_line, slot, fault, line)
            if fault.signal in CHECKED_SIGNALS and fault.id not in slot.checked:
                at(due, self._show_checked, slot, fault)

    def _end(self, slot: Slot, fault: Fault) -> None:
        if not self.is_current(slot, fault):
            return
        self.remove(slot, [fault])
        self._driver.signals_changed(slot)

    def remove(self, slot: Slot, gone: list[Fault]) -> None:
        for fault in gone:
            del slot.faults[fault.id]
            slot.checked.pop(fault.id, None)
            if fault.effect is Effect.DOWN and not any(
                f.effect is Effect.DOWN for f in slot.faults.values()
            ):
                slot.notready = False
        if slot.job is not None:
            self._world.scheduler.speed_changed(slot.job)
        self._world.fleet.refresh(slot)

    @staticmethod
    def signals(slot: Slot) -> NodeSignals:
        """What the agent reads on the node now."""
        # Read after every deep run, on nodes that mostly show nothing: skip the sorting.
        kernel, checked = slot.kernel, slot.checked
        return NodeSignals(
            tuple(sorted({line for _, line, _, _ in kernel})) if kernel else (),
            tuple(sorted(checked.values())) if checked else (),
            slot.deep,
            slot.in_job,
        )

    @staticmethod
    def has_node_fault(slot: Slot) -> bool:
        """Something is wrong with the machine itself: not a job's own fault, not a switch
        or a link that ends by itself while the machine is fine."""
        return any(
            (f.disables or f.effect is Effect.SLOW)
            and (Fix.RESET <= f.fix <= Fix.REPLACE or f.effect is Effect.DOWN)
            for f in slot.faults.values()
        )
