"""The fleet: GPU-node slots and the machines in them, repairs, spares and people.

A slot is where a node is in the cluster; the machine in it can be reset, rebooted, or
sent away for repair while a spare (or, when none is left, new capacity) takes its place.
``refresh`` is the one place that decides whether a slot takes work and is in service.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from gpuguard.sim.faults import DAY, GPUS_PER_NODE, HOUR, Effect, Fault, Fix
from gpuguard.sim.gpu_slots import gpus_in_service
from gpuguard.sim.slot import Slot
from gpuguard.sim.world import World
from gpuguard.sli import in_service


class Fleet:
    """The slots and the machines: what holds a node, takes it away and brings it back."""

    def __init__(self, world: World, *, seed: int) -> None:
        self._world = world
        self._events = world.events
        self._stats = world.stats
        self._books = world.books
        self._driver = world.driver
        scenario = world.scenario
        self._fleet = scenario.fleet
        self._actions = scenario.actions
        self._detection = scenario.detection
        self._rng = np.random.default_rng([seed, 2])  # action outcomes
        self.slots = [
            Slot(i, f"pool-{i % self._fleet.pools}", machine=i) for i in range(self._fleet.nodes)
        ]
        self.free: set[int] = set()  # schedulable slots without a job
        self.partial: set[int] = set()  # the same, but with GPUs out alone (``gpu_slots``)
        self.spares = self._fleet.spare_nodes
        self.next_machine = self._fleet.nodes + self._fleet.spare_nodes
        self.on_idle: Callable[[Slot], None] | None = None  # a slot just became free

    def refresh(self, slot: Slot) -> None:
        """Recompute whether the slot takes work and is in service; keep the books."""
        # A machine in the slot and no action holding it, then the one definition the
        # controller uses; the scheduler goes by the same flags but cannot see faults.
        # A withdrawn GPU leaves 7 of 8 allocatable: no whole-node pod fits, as if cordoned.
        # In service is schedulable and no disabling fault: the faults are read only then
        # (this runs for every slot a job leaves, millions of times in a long run).
        schedulable = (
            slot.machine is not None
            and not slot.down
            and in_service(
                ready=not slot.notready,
                cordoned=slot.cordoned or slot.gpu_withdrawn,
                quarantined=slot.tainted,
                faulty=False,
            )
        )
        # A node with GPUs out alone takes no whole-node job: out of node-slot service,
        # offered to the jobs that fit its other GPUs (``gpu_slots``).
        whole = schedulable and not slot.gpus_out
        up = whole and not (slot.faults and any(f.disables for f in slot.faults.values()))
        newly_free = False
        if whole and slot.job is None:
            if slot.index not in self.free:
                self.free.add(slot.index)
                self._world.scheduler.want_scheduling()
                newly_free = True
        else:
            self.free.discard(slot.index)
        if slot.gpus_out or slot.index in self.partial:
            self._offer_partial(slot, schedulable)
        if not whole and slot.incidents:
            self._stats.quarantined(slot.incidents, self._events.now)
        now = self._events.now
        gpus = GPUS_PER_NODE if up else 0
        if slot.gpus_out and not up:
            gpus = gpus_in_service(slot, schedulable=schedulable, up=up)
        if up != slot.in_service or gpus != slot.gpus_up:
            nodes = up - slot.in_service  # +1, -1 or 0
            self._books.service_changed(now, nodes=nodes, gpus=gpus - slot.gpus_up)
            slot.gpus_up = gpus
            if up and not slot.in_service and slot.incidents:
                self._stats.repaired(slot.incidents, now)
                slot.incidents.clear()
        slot.schedulable, slot.in_service = schedulable, up
        if newly_free and self.on_idle is not None:
            self.on_idle(slot)

    def _offer_partial(self, slot: Slot, schedulable: bool) -> None:
        """Keep ``partial``: schedulable nodes with GPUs out alone and no job."""
        if schedulable and slot.gpus_out and slot.job is None:
            if slot.index not in self.partial:
                self.partial.add(slot.index)
                self._world.scheduler.want_scheduling()
        else:
            self.partial.discard(slot.index)

    def set_flags(
        self, slot: Slot, *, tainted: bool | None = None, cordoned: bool | None = None
    ) -> None:
        if tainted is not None:
            slot.tainted = tainted
        if cordoned is not None:
            slot.cordoned = cordoned
        self.refresh(slot)

    def withdraw_gpu(self, slot: Slot) -> None:
        """The device plugin stops offering a GPU; a person is asked to look (the node no
        longer takes a whole-node job, which an operator's capacity alert shows)."""
        if slot.gpu_withdrawn:
            return
        slot.gpu_withdrawn = True
        self._stats.detected(slot.faults.values(), self._events.now)
        self.request_human(slot)
        self.refresh(slot)

    def start_test(self, slot: Slot, duration: float) -> None:
        """The deep suite starts on the node. As in production the node stays as it was
        (a scheduled run starts on an idle node that stays in service; a verify runs under
        the quarantine taint): a job placed meanwhile starts once the run ends."""
        slot.testing = True
        slot.test_ends = self._events.now + duration

    def end_test(self, slot: Slot) -> None:
        slot.testing = False

    # -- resets and reboots -----------------------------------------------------------

    def repair(
        self, slot: Slot, what: str, *, gpus: tuple[int, ...] = (), manual: bool = False
    ) -> None:
        """Reset GPUs or reboot: the node is held for the action's time, then the faults
        the action can clear are gone (unless the action itself failed)."""
        now = self._events.now
        duration = self._actions.gpu_reset_s if what == "reset" else self._actions.reboot_min * 60.0
        self._stats.actions[("manual_" if manual else "") + what] += 1
        self._world.scheduler.interrupt_job(slot, cause="platform")
        slot.down = "manual" if manual else what
        slot.test_ends = min(slot.test_ends, now)  # a deep run stops with the GPUs
        machine = slot.machine
        self._events.at(now + duration, self._repair_done, slot, machine, what, gpus, manual)
        self.refresh(slot)

    def _repair_done(
        self, slot: Slot, machine: int | None, what: str, gpus: tuple[int, ...], manual: bool
    ) -> None:
        if slot.machine != machine:
            return
        slot.down = ""
        self.finish_repair(slot, what, gpus, manual=manual)

    def finish_repair(
        self, slot: Slot, what: str, gpus: tuple[int, ...], *, manual: bool = False
    ) -> None:
        """A reset or a reboot is over: what it clears is gone (unless the action itself
        failed), and the driver hears how it went."""
        failed = not manual and self._rng.random() < self._actions.failure_probability
        level = Fix.RESET if what == "reset" else Fix.REBOOT
        faults = self._world.fault_process
        if level is Fix.REBOOT:
            slot.gpu_withdrawn = False  # the device plugin starts again, every GPU healthy
        if not failed:
            # A reset or a reboot acts on the machine: a cable or a switch stays as it was.
            cleared = [
                f
                for f in slot.faults.values()
                if f.fix <= level
                and not f.stays_with_slot
                and (not gpus or f.gpu in gpus or level is Fix.REBOOT)
            ]
            if level is Fix.REBOOT:
                slot.kernel.clear()
            else:
                slot.kernel = [k for k in slot.kernel if slot.faults.get(k[0]) not in cleared]
            slot.deep = ()  # the agent forgets a deep verdict on the GPUs as they were
            self._stats.removed(cleared, self._events.now)
            faults.remove(slot, cleared)
        faults.show_again(slot)
        self.refresh(slot)
        self._driver.action_done(slot, what, not failed)

    # -- replacement ------------------------------------------------------------------

    def replace(self, slot: Slot, *, manual: bool = False) -> None:
        """The machine leaves for repair; a spare (or new capacity) takes the slot. The
        machine's faults leave with it; a fault of the position or of its domain (a cable,
        a switch) stays on the slot, and the machine that fills it shows it again."""
        if slot.machine is None:
            return
        now = self._events.now
        books = self._books
        self._stats.actions["manual_replace" if manual else "replace"] += 1
        if not manual:
            self._stats.replaced_at[slot.index].append(now)
        self._world.scheduler.interrupt_job(slot, cause="platform")
        books.account(now)
        gone = [f for f in slot.faults.values() if not f.stays_with_slot]
        self._stats.removed(gone, now)
        slot.machine = None
        slot.testing = False
        slot.test_ends = now
        slot.deep = ()
        slot.in_job = ()
        slot.faults = {i: f for i, f in slot.faults.items() if f.stays_with_slot}
        slot.kernel.clear()
        slot.checked.clear()
        slot.notready = any(f.effect is Effect.DOWN for f in slot.faults.values())
        slot.down = ""
        slot.tainted = slot.cordoned = slot.gpu_withdrawn = False
        slot.gpus_out.clear()
        books.occupied -= 1
        books.repairing += 1
        # A machine leaving with replayed records is back when the record says it was.
        recorded = _recorded_end(gone)
        back = max(now, recorded) if recorded is not None else now + self._fleet.repair_days * DAY
        self._events.at(back, self._repaired_machine)
        self.refresh(slot)
        books.account(now)
        self._refill(slot)

    def _refill(self, slot: Slot) -> None:
        if self.spares > 0:
            self.spares -= 1
            machine = -1  # a spare
            delay = self._fleet.replace_from_spare_min * 60.0
        else:
            machine = self.next_machine
            self.next_machine += 1
            delay = self._fleet.new_capacity_h * HOUR
        self._events.at(self._events.now + delay, self._fill, slot, machine)

    def _fill(self, slot: Slot, machine: int) -> None:
        if machine < 0:
            machine = self.next_machine
            self.next_machine += 1
        now = self._events.now
        self._books.account(now)
        slot.refill(machine)
        self._books.occupied += 1
        self.refresh(slot)
        self._books.account(now)
        self._driver.node_replaced(slot)
        if slot.faults:  # what the position still has shows on the new machine
            self._world.fault_process.show_again(slot)

    def _repaired_machine(self) -> None:
        now = self._events.now
        self._books.account(now)
        self._books.repairing -= 1
        self.spares += 1
        self._books.account(now)

    # -- people -----------------------------------------------------------------------

    def request_human(self, slot: Slot) -> None:
        """A person looks at the node after the scenario's response time, or, for a
        replayed record, when the trace's operators had it repaired (its recorded end). A
        ticket is for the machine in the slot: one still pending for a machine since
        replaced does not hold back the new machine's (its visit is dropped when it comes
        due)."""
        if slot.human_pending and slot.human_for == slot.machine:
            return
        slot.human_pending = True
        slot.human_for = slot.machine
        now = self._events.now
        recorded = _recorded_end(slot.faults.values())
        visit = max(now, recorded) if recorded is not None else None
        if visit is None:
            visit = now + self._detection.manual_response_h * HOUR
        self._events.at(visit, self._human, slot, slot.machine)

    # -- the trace's operators ----------------------------------------------------------

    def take_offline(self, slot: Slot, fault: Fault) -> None:
        """The trace's operators hold the node out of service for the record's span (a
        machine suspected while a job was troubleshot, a failed stress test); it comes back
        repaired, the fault gone, as the record's end says. A job hit by a fault with no
        signal (it hangs) is left to it: the job fails first, then the node is suspected;
        a job on a node failing a stress test is drained."""
        assert fault.recorded_end is not None
        if fault.effect is Effect.SLOW:
            self._world.scheduler.interrupt_job(slot, cause="platform")
        slot.down = "offline"
        self._stats.actions["manual_offline"] += 1
        self._events.at(max(self._events.now, fault.recorded_end), self._online, slot, fault)
        self.refresh(slot)

    def _online(self, slot: Slot, fault: Fault) -> None:
        if slot.down != "offline" or slot.machine is None:
            return  # replaced, or another action holds it and brings it back
        slot.down = ""
        faults = self._world.fault_process
        if faults.is_current(slot, fault):
            self._stats.detected([fault], self._events.now)
            self._stats.removed([fault], self._events.now)
            faults.remove(slot, [fault])
        faults.show_again(slot)
        self.refresh(slot)
        self._driver.signals_changed(slot)

    def _repaired_in_place(self, slot: Slot, faults: list[Fault], action: str) -> None:
        """A person's repair of ``faults`` where they are: gone, with their kernel lines."""
        now = self._events.now
        self._stats.actions[action] += 1
        self._stats.detected(faults, now)
        self._stats.removed(faults, now)
        ids = {f.id for f in faults}
        slot.kernel = [k for k in slot.kernel if k[0] not in ids]
        self._world.fault_process.remove(slot, faults)  # their checked facts too
        self._driver.signals_changed(slot)

    def _human(self, slot: Slot, machine: int | None) -> None:
        if slot.human_for != machine:
            return  # a visit for a machine since replaced; the new one's is pending
        slot.human_pending = False
        if slot.machine != machine or slot.down:
            return
        now = self._events.now
        # A replayed record over by now was repaired in place by the trace's operators.
        done = [
            f
            for f in slot.faults.values()
            if f.recorded_end is not None and f.recorded_end <= now and f.fix is not Fix.SELF
        ]
        if done:
            self._repaired_in_place(slot, done, "manual_recorded_repair")
        # A person repairs what needs a hand where it is: a cable, an optic, a port (a fault
        # of the position that does not end by itself) is swapped in place, the server left.
        fixed = [f for f in slot.faults.values() if f.stays_with_slot and f.fix is not Fix.SELF]
        if fixed:
            self._repaired_in_place(slot, fixed, "manual_position_repair")
        persistent = [
            f
            for f in slot.faults.values()
            if f.fix in (Fix.RESET, Fix.REBOOT, Fix.REPLACE) and not f.stays_with_slot
        ]
        if not persistent:
            if slot.gpu_withdrawn:  # nothing wrong now: a reboot gives the GPU back
                self.repair(slot, "reboot", manual=True)
            return
        self._stats.detected(slot.faults.values(), self._events.now)
        if max(f.fix for f in persistent) <= Fix.REBOOT:
            self.repair(slot, "reboot", manual=True)
        else:
            self.replace(slot, manual=True)


def _recorded_end(faults: Iterable[Fault]) -> float | None:
    """The latest recorded end of replayed records of the machine (not a cable's or a
    switch's, which end by themselves), or None when it has none."""
    ends = [
        f.recorded_end
        for f in faults
        if f.recorded_end is not None and not f.stays_with_slot and f.fix is not Fix.SELF
    ]
    return max(ends) if ends else None
