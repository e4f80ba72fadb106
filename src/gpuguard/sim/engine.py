"""The discrete-event engine: one clock, one event queue, the fleet, its jobs and faults.

The engine is the world: machines fail, jobs run, checkpoint and crash, the scheduler
places work on schedulable nodes, machines are rebooted, reset or swapped for a spare.
What a remediation system would decide is left to a ``Driver`` (``policies.py``); the
engine only carries out what the driver asks for, with the scenario's durations.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from gpuguard.sim.agent_view import (
    CHECKED_SIGNALS,
    AgentView,
    DeepFinding,
    NodeSignals,
    is_application_line,
    kernel_line,
)
from gpuguard.sim.faults import ATTRIBUTED, DAY, HIDDEN_CLASSES, HOUR, Effect, Fault, Fix
from gpuguard.sim.jobs import Job, JobState, effective_speed
from gpuguard.sim.scenario import Scenario
from gpuguard.sli import TimeShare, in_service

APPLICATION_FAULT_TTL_S = 600.0  # the agent's default application_fault_ttl_s
BIN_S = HOUR  # resolution of the availability time series


class Driver(Protocol):
    """A remediation system (or none) reacting to what the fleet shows."""

    name: str
    job_aware: bool  # its own kills and evictions do not use up a job's retries

    def attach(self, engine: Engine) -> None: ...
    def signals_changed(self, slot: Slot) -> None: ...
    def node_replaced(self, slot: Slot) -> None: ...
    def action_done(self, slot: Slot, what: str, succeeded: bool) -> None: ...


@dataclass
class Slot:
    """One GPU-node slot of the fleet and the machine in it."""

    index: int
    pool: str
    machine: int | None
    generation: int = 0
    original: bool = True  # still the first machine (a lemon's extra faults apply to it)
    faults: dict[int, Fault] = field(default_factory=dict)
    kernel: list[tuple[int, str, float, bool]] = field(default_factory=list)
    checked: dict[int, tuple[Any, int]] = field(default_factory=dict)
    job: Job | None = None
    down: str = ""  # "reset", "reboot", "manual": an action holds the node
    testing: bool = False  # the deep suite is loading every GPU
    test_ends: float = 0.0  # when the current deep run ends (a job placed meanwhile waits)
    deep: tuple[DeepFinding, ...] = ()  # what the last deep run found (in the GPU layer)
    notready: bool = False
    tainted: bool = False
    cordoned: bool = False
    drain_until: float = 0.0
    human_pending: bool = False
    schedulable: bool = False
    in_service: bool = False
    incidents: list[int] = field(default_factory=list)  # disabling faults not yet repaired

    @property
    def name(self) -> str:
        return f"gpu-node-{self.index:05d}" + (f"-r{self.generation}" if self.generation else "")

    def speed(self) -> float:
        pace = 1.0
        for fault in self.faults.values():
            if fault.effect is Effect.HANG:
                return 0.0
            if fault.effect is Effect.SLOW:
                pace = min(pace, fault.slowdown)
        return pace


@dataclass
class FaultTimes:
    detected: float | None = None
    quarantined: float | None = None
    repaired: float | None = None


@dataclass
class HiddenTimes:
    """A fault no periodic check reads (SDC, fail-slow): who found it, when it left."""

    by_checks: float | None = None  # a deep run named it
    by_job: float | None = None  # a job's owners traced bad results to it
    removed: float | None = None  # repaired or replaced away (not ended by itself)


@dataclass
class Stats:
    actions: Counter[str] = field(default_factory=Counter)
    false_drains: int = 0
    breaker_trips: int = 0
    dropped_faults: int = 0
    decide_calls: int = 0
    fault_times: dict[int, FaultTimes] = field(default_factory=dict)
    hidden: dict[int, HiddenTimes] = field(default_factory=dict)
    deep_runs: Counter[str] = field(default_factory=Counter)  # by trigger
    availability_bins: list[float] = field(default_factory=list)  # in-service slot-seconds


class Engine:
    def __init__(
        self,
        scenario: Scenario,
        faults: list[Fault],
        jobs: list[Job],
        driver: Driver,
        view: AgentView,
        *,
        seed: int,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self.scenario = scenario
        self.faults = faults
        self.jobs = jobs
        self.driver = driver
        self.view = view
        self.rng = np.random.default_rng([seed, 2])  # action outcomes
        self.progress = progress
        self.now = 0.0
        self.horizon = scenario.days * DAY
        self._events: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        fleet = scenario.fleet
        self.slots = [Slot(i, f"pool-{i % fleet.pools}", machine=i) for i in range(fleet.nodes)]
        self.next_machine = fleet.nodes + fleet.spare_nodes
        self.spares = fleet.spare_nodes
        self.repairing = 0
        self.refill_wanted: list[Slot] = []
        self.free: set[int] = set()
        self.waiting: list[Job] = []  # interrupted, restart first
        self.queued: list[Job] = []
        self.smallest_job = min(size.nodes for size in scenario.jobs.mix)
        self.slot_share = TimeShare(0.0)
        self.machine_share = TimeShare(0.0)
        self.in_service = 0
        self.occupied = fleet.nodes
        self.stats = Stats()
        self.stats.availability_bins = [0.0] * (int(self.horizon // BIN_S) + 1)
        self._bin_since = 0.0
        self._scheduling = False
        self._armed_sdc: set[tuple[int, int]] = set()  # (fault, job)
        self.on_idle: Callable[[Slot], None] | None = None  # a slot just became free
        self.speed_factor = effective_speed(scenario.jobs)
        for slot in self.slots:
            self._update(slot)
        driver.attach(self)

    # -- the clock --------------------------------------------------------------------

    def at(self, t: float, action: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._events, (max(t, self.now), next(self._seq), action, args))

    def run(self) -> None:
        for fault in self.faults:
            self.at(fault.start, self._fault_start, fault)
        for job in self.jobs:
            self.at(job.arrival, self._arrive, job)
        step = self.horizon / 100
        shown = 0.0
        events = self._events
        while events:
            t, _, action, args = heapq.heappop(events)
            if t > self.horizon:
                break
            self.now = t
            action(*args)
            if self.progress is not None and t - shown >= step:
                shown = t
                self.progress(t / self.horizon)
        self.now = self.horizon
        self._account(self.horizon)
        for job in self.jobs:
            if job.state is JobState.RUNNING:
                job.running_h += (self.horizon - job.segment_start) / HOUR
                job.saved_h = job.progress_at(self.horizon)
            elif job.state is JobState.RESTARTING:
                job.start_up_until(self.horizon)
        if self.progress is not None:
            self.progress(1.0)

    # -- service accounting -----------------------------------------------------------

    def _account(self, now: float) -> None:
        bins = self.stats.availability_bins
        t = self._bin_since
        while t < now:
            index = int(t // BIN_S)
            end = min(now, (index + 1) * BIN_S)
            bins[min(index, len(bins) - 1)] += self.in_service * (end - t)
            t = end
        self._bin_since = now
        total = len(self.slots)
        self.slot_share.set(now, up=self.in_service, total=total)
        self.machine_share.set(now, up=self.in_service, total=self.occupied + self.repairing)

    def _update(self, slot: Slot) -> None:
        """Recompute whether the slot takes work and is in service; keep the books."""
        now = self.now
        # A machine in the slot and no action holding it, then the one definition the
        # controller uses; the scheduler goes by the same flags but cannot see faults.
        present = slot.machine is not None and not slot.down
        ready, cordoned, quarantined = not slot.notready, slot.cordoned, slot.tainted
        schedulable = present and in_service(
            ready=ready, cordoned=cordoned, quarantined=quarantined, faulty=False
        )
        up = present and in_service(
            ready=ready,
            cordoned=cordoned,
            quarantined=quarantined,
            faulty=any(f.disables for f in slot.faults.values()),
        )
        newly_free = False
        if schedulable and slot.job is None:
            if slot.index not in self.free:
                self.free.add(slot.index)
                self._want_scheduling()
                newly_free = True
        else:
            self.free.discard(slot.index)
        if not schedulable:
            for fault_id in slot.incidents:
                times = self.stats.fault_times[fault_id]
                if times.quarantined is None:
                    times.quarantined = now
        if up != slot.in_service:
            self._account(now)
            self.in_service += 1 if up else -1
            self.slot_share.up = self.machine_share.up = self.in_service
            if up:
                for fault_id in slot.incidents:
                    self.stats.fault_times[fault_id].repaired = now
                slot.incidents.clear()
        slot.schedulable, slot.in_service = schedulable, up
        if newly_free and self.on_idle is not None:
            self.on_idle(slot)

    # -- faults -----------------------------------------------------------------------

    def _fault_start(self, fault: Fault) -> None:
        slot = self.slots[fault.slot]
        if slot.machine is None or slot.down or (fault.lemon and not slot.original):
            self.stats.dropped_faults += 1  # no machine running there to fail
            return
        if fault.fix is Fix.RESTART and fault.effect is not Effect.NONE and slot.job is None:
            self.stats.dropped_faults += 1  # a job's own fault needs a job
            return
        slot.faults[fault.id] = fault
        if fault.disables:
            slot.incidents.append(fault.id)
            self.stats.fault_times[fault.id] = FaultTimes()
        if fault.cls in HIDDEN_CLASSES:
            self.stats.hidden[fault.id] = HiddenTimes()
        if fault.effect is Effect.DOWN:
            slot.notready = True
            self.request_human(slot)  # a machine that stopped answering gets a ticket
        detection = self.scenario.detection
        line = kernel_line(fault.signal, fault.gpu)
        if line is not None:
            self.at(fault.start + detection.kernel_log_s, self._show_line, slot, fault, line)
        if fault.signal in CHECKED_SIGNALS:
            delay = fault.check_phase * detection.check_interval_s
            self.at(fault.start + delay, self._show_checked, slot, fault)
        if fault.end is not None:
            self.at(fault.end, self._fault_end, slot, fault)
        self._hit_job(slot, fault)
        self._update(slot)

    def _current(self, slot: Slot, fault: Fault) -> bool:
        return slot.faults.get(fault.id) is fault

    def _show_line(self, slot: Slot, fault: Fault, line: str) -> None:
        if not self._current(slot, fault) or slot.down:
            return
        application = is_application_line(line)
        slot.kernel.append((fault.id, line, self.now, application))
        if application:
            self.at(self.now + APPLICATION_FAULT_TTL_S, self._expire_line, slot)
        self.driver.signals_changed(slot)

    def _expire_line(self, slot: Slot) -> None:
        before = len(slot.kernel)
        slot.kernel = [
            k for k in slot.kernel if not (k[3] and self.now - k[2] >= APPLICATION_FAULT_TTL_S)
        ]
        if len(slot.kernel) != before:
            self.driver.signals_changed(slot)

    def _show_checked(self, slot: Slot, fault: Fault) -> None:
        if not self._current(slot, fault) or slot.down:
            return
        slot.checked[fault.id] = (fault.signal, fault.gpu)
        self.driver.signals_changed(slot)

    def _fault_end(self, slot: Slot, fault: Fault) -> None:
        if not self._current(slot, fault):
            return
        self._remove(slot, [fault])
        self.driver.signals_changed(slot)

    def _remove(self, slot: Slot, gone: list[Fault]) -> None:
        for fault in gone:
            del slot.faults[fault.id]
            slot.checked.pop(fault.id, None)
            if fault.effect is Effect.DOWN and not any(
                f.effect is Effect.DOWN for f in slot.faults.values()
            ):
                slot.notready = False
        if slot.job is not None:
            self._speed_changed(slot.job)
        self._update(slot)

    def signals(self, slot: Slot) -> NodeSignals:
        """What the agent reads on the node now."""
        return NodeSignals(
            tuple(sorted({line for _, line, _, _ in slot.kernel})),
            tuple(sorted(slot.checked.values())),
            slot.deep,
        )

    def set_flags(
        self, slot: Slot, *, tainted: bool | None = None, cordoned: bool | None = None
    ) -> None:
        if tainted is not None:
            slot.tainted = tainted
        if cordoned is not None:
            slot.cordoned = cordoned
        self._update(slot)

    def has_node_fault(self, slot: Slot) -> bool:
        """Something is wrong with the machine itself: not a job's own fault, not a switch
        or a link that ends by itself while the machine is fine."""
        return any(
            (f.disables or f.effect is Effect.SLOW)
            and (Fix.RESET <= f.fix <= Fix.REPLACE or f.effect is Effect.DOWN)
            for f in slot.faults.values()
        )

    def start_test(self, slot: Slot, duration: float) -> None:
        """The deep suite starts on the node. As in production the node stays as it was
        (a scheduled run starts on an idle node that stays in service; a verify runs under
        the quarantine taint): a job placed meanwhile starts once the run ends."""
        slot.testing = True
        slot.test_ends = self.now + duration

    def end_test(self, slot: Slot) -> None:
        slot.testing = False

    def found_by_checks(self, faults: list[Fault]) -> None:
        for fault in faults:
            times = self.stats.hidden.get(fault.id)
            if times is not None and times.by_checks is None:
                times.by_checks = self.now

    def _mark_removed(self, faults: list[Fault]) -> None:
        for fault in faults:
            times = self.stats.hidden.get(fault.id)
            if times is not None and times.removed is None:
                times.removed = self.now

    def detected(self, slot: Slot) -> None:
        for fault in slot.faults.values():
            times = self.stats.fault_times.get(fault.id)
            if times is not None and times.detected is None:
                times.detected = self.now

    # -- repairs ----------------------------------------------------------------------

    def repair(
        self, slot: Slot, what: str, *, gpus: tuple[int, ...] = (), manual: bool = False
    ) -> None:
        """Reset GPUs or reboot: the node is held for the action's time, then the faults
        the action can clear are gone (unless the action itself failed)."""
        actions = self.scenario.actions
        duration = actions.gpu_reset_s if what == "reset" else actions.reboot_min * 60.0
        self.stats.actions[("manual_" if manual else "") + what] += 1
        self.interrupt_job(slot, cause="platform")
        slot.down = "manual" if manual else what
        slot.test_ends = min(slot.test_ends, self.now)  # a deep run stops with the GPUs
        machine = slot.machine
        self.at(self.now + duration, self._repair_done, slot, machine, what, gpus, manual)
        self._update(slot)

    def _repair_done(
        self, slot: Slot, machine: int | None, what: str, gpus: tuple[int, ...], manual: bool
    ) -> None:
        if slot.machine != machine:
            return
        slot.down = ""
        failed = not manual and self.rng.random() < self.scenario.actions.failure_probability
        level = Fix.RESET if what == "reset" else Fix.REBOOT
        if not failed:
            cleared = [
                f
                for f in slot.faults.values()
                if f.fix <= level and (not gpus or f.gpu in gpus or level is Fix.REBOOT)
            ]
            if level is Fix.REBOOT:
                slot.kernel.clear()
            else:
                slot.kernel = [k for k in slot.kernel if slot.faults.get(k[0]) not in cleared]
            slot.deep = ()  # the agent forgets a deep verdict on the GPUs as they were
            self._mark_removed(cleared)
            self._remove(slot, cleared)
        # What is still wrong shows again once the node is back and its checks run.
        delay = self.scenario.detection.check_interval_s
        for fault in list(slot.faults.values()):
            line = kernel_line(fault.signal, fault.gpu)
            if line is not None and not any(k[0] == fault.id for k in slot.kernel):
                self.at(self.now + delay, self._show_line, slot, fault, line)
            if fault.signal in CHECKED_SIGNALS and fault.id not in slot.checked:
                self.at(self.now + delay, self._show_checked, slot, fault)
        self._update(slot)
        self.driver.action_done(slot, what, not failed)

    def replace(self, slot: Slot, *, manual: bool = False) -> None:
        """The machine leaves for repair; a spare (or new capacity) takes the slot."""
        if slot.machine is None:
            return
        self.stats.actions["manual_replace" if manual else "replace"] += 1
        self.interrupt_job(slot, cause="platform")
        self._account(self.now)
        self._mark_removed(list(slot.faults.values()))
        slot.machine = None
        slot.testing = False
        slot.test_ends = self.now
        slot.deep = ()
        slot.faults.clear()
        slot.kernel.clear()
        slot.checked.clear()
        slot.notready = False
        slot.down = ""
        slot.tainted = slot.cordoned = False
        self.occupied -= 1
        self.repairing += 1
        self.at(self.now + self.scenario.fleet.repair_days * DAY, self._repaired_machine)
        self._update(slot)
        self._account(self.now)
        self._refill(slot)

    def _refill(self, slot: Slot) -> None:
        fleet = self.scenario.fleet
        if self.spares > 0:
            self.spares -= 1
            machine = -1  # a spare
            delay = fleet.replace_from_spare_min * 60.0
        else:
            machine = self.next_machine
            self.next_machine += 1
            delay = fleet.new_capacity_h * HOUR
        self.at(self.now + delay, self._fill, slot, machine)

    def _fill(self, slot: Slot, machine: int) -> None:
        if machine < 0:
            machine = self.next_machine
            self.next_machine += 1
        self._account(self.now)
        slot.machine = machine
        slot.generation += 1
        slot.original = False
        self.occupied += 1
        self._update(slot)
        self._account(self.now)
        self.driver.node_replaced(slot)

    def _repaired_machine(self) -> None:
        self._account(self.now)
        self.repairing -= 1
        self.spares += 1
        self._account(self.now)

    def request_human(self, slot: Slot) -> None:
        """A person looks at the node after the scenario's response time."""
        if slot.human_pending:
            return
        slot.human_pending = True
        response = self.scenario.detection.manual_response_h * HOUR
        self.at(self.now + response, self._human, slot, slot.machine)

    def _human(self, slot: Slot, machine: int | None) -> None:
        slot.human_pending = False
        if slot.machine != machine or slot.down:
            return
        persistent = [
            f for f in slot.faults.values() if f.fix in (Fix.RESET, Fix.REBOOT, Fix.REPLACE)
        ]
        if not persistent:
            return
        self.detected(slot)
        if max(f.fix for f in persistent) <= Fix.REBOOT:
            self.repair(slot, "reboot", manual=True)
        else:
            self.replace(slot, manual=True)

    # -- jobs -------------------------------------------------------------------------

    def _arrive(self, job: Job) -> None:
        self.queued.append(job)
        self._want_scheduling()

    def _want_scheduling(self) -> None:
        if not self._scheduling:
            self._scheduling = True
            self.at(self.now, self._schedule)

    def _schedule(self) -> None:
        self._scheduling = False
        for line in (self.waiting, self.queued):
            index = 0
            while index < len(line) and len(self.free) >= self.smallest_job:
                job = line[index]
                if job.nodes <= len(self.free):
                    del line[index]
                    self._place(job)
                else:
                    index += 1

    def _place(self, job: Job) -> None:
        picked = list(itertools.islice(self.free, job.nodes))
        for index in picked:
            slot = self.slots[index]
            slot.job = job
            self.free.discard(index)
        job.slots = picked
        job.state = JobState.RESTARTING
        job.version += 1
        job.placed_at = self.now
        # Its GPUs are the deep suite's until a run in progress on its nodes ends.
        job.starts_at = max(
            [self.now, *(self.slots[i].test_ends for i in picked if self.slots[i].testing)]
        )
        job.waiting_since = None
        if job.first_start is None:
            job.first_start = self.now
        overhead = self.scenario.jobs.restart_overhead_min * 60.0
        self.at(job.starts_at + overhead, self._ready, job, job.version)

    def _ready(self, job: Job, version: int) -> None:
        if job.version != version:
            return
        job.start_up_until(self.now)
        for index in job.slots:
            for fault in self.slots[index].faults.values():
                if fault.effect in (Effect.CRASH, Effect.DOWN):
                    self.interrupt(job, cause="fault", fault=fault)  # dies initialising
                    return
        job.state = JobState.RUNNING
        job.segment_start = self.now
        job.speed = self._pace(job)
        job.pieces = [(self.now, job.speed)]
        self._plan_end(job)
        for index in job.slots:
            for fault in self.slots[index].faults.values():
                if fault.effect is Effect.SILENT:
                    self._arm_sdc(fault, job)

    def _pace(self, job: Job) -> float:
        return min(self.slots[i].speed() for i in job.slots) * self.speed_factor

    def _plan_end(self, job: Job) -> None:
        job.version += 1
        if job.speed > 0:
            remaining = max(0.0, job.work_h - job.progress_at(self.now))
            self.at(self.now + remaining * HOUR / job.speed, self._done, job, job.version)
        else:
            watchdog = self.scenario.detection.watchdog_min * 60.0
            self.at(self.now + watchdog, self._watchdog, job, job.version)

    def _speed_changed(self, job: Job) -> None:
        if job.state is not JobState.RUNNING:
            return
        pace = self._pace(job)
        if pace != job.speed:
            job.speed = pace
            job.pieces.append((self.now, pace))
            self._plan_end(job)

    def _watchdog(self, job: Job, version: int) -> None:
        if job.version == version and job.state is JobState.RUNNING and job.speed == 0:
            hung = next(
                (
                    f
                    for i in job.slots
                    for f in self.slots[i].faults.values()
                    if f.effect is Effect.HANG
                ),
                None,
            )
            self.interrupt(job, cause="fault", fault=hung)

    def _done(self, job: Job, version: int) -> None:
        if job.version != version or job.state is not JobState.RUNNING:
            return
        job.running_h += (self.now - job.segment_start) / HOUR
        job.saved_h = job.work_h
        job.state = JobState.SUCCEEDED
        job.ended_at = self.now
        self._release(job)

    def _release(self, job: Job) -> None:
        for index in job.slots:
            slot = self.slots[index]
            if slot.job is job:
                slot.job = None
                self._update(slot)
        job.slots = []

    def _hit_job(self, slot: Slot, fault: Fault) -> None:
        job = slot.job
        if job is None or job.state is not JobState.RUNNING:
            return  # a job initialising finds the fault when it is ready
        if fault.effect in (Effect.CRASH, Effect.DOWN):
            self.interrupt(job, cause="fault", fault=fault)
        elif fault.effect in (Effect.HANG, Effect.SLOW):
            self._speed_changed(job)
        elif fault.effect is Effect.SILENT:
            self._arm_sdc(fault, job)

    def _arm_sdc(self, fault: Fault, job: Job) -> None:
        """The job computes on a corrupting GPU; its owners find out some time later."""
        if (fault.id, job.id) in self._armed_sdc:
            return
        self._armed_sdc.add((fault.id, job.id))
        found = self.now + self.scenario.detection.sdc_detection_h * HOUR
        self.at(found, self._sdc_found, fault, job, self.now, job.progress_at(self.now))

    def _sdc_found(self, fault: Fault, job: Job, corrupted_at: float, good_h: float) -> None:
        """Bad results traced to the node: the work since the corruption is lost wherever
        the job is now (its checkpoints carry it), and the job fails if the scenario says
        so. A job that already ended loses that work too."""
        # The job's owners now keep it off that GPU: it is not corrupted there again.
        times = self.stats.hidden.get(fault.id)
        if times is not None and times.by_job is None:
            times.by_job = self.now
        slot = self.slots[fault.slot]
        if self._current(slot, fault):
            self.request_human(slot)  # the job's owners trace the bad results to the node
        if job.state is JobState.FAILED:
            return
        if job.state in (JobState.RUNNING, JobState.RESTARTING):
            self.interrupt(job, cause="fault", fault=fault, rollback_to=corrupted_at)
        if job.saved_h > good_h:
            job.lost_h += job.saved_h - good_h
            job.saved_h = good_h
        if not self.scenario.failures.sdc_fails_job or job.failure:  # failed meanwhile
            return
        if job.state is JobState.SUCCEEDED:  # it ended when it ended, on wrong numbers
            job.state, job.failure = JobState.FAILED, "silent data corruption"
            return
        if job in self.waiting:
            self.waiting.remove(job)
        self._fail(job, "silent data corruption")

    def interrupt_job(self, slot: Slot, *, cause: str) -> None:
        if slot.job is not None:
            self.interrupt(slot.job, cause=cause)

    def interrupt(
        self,
        job: Job,
        *,
        cause: str,
        fault: Fault | None = None,
        rollback_to: float | None = None,
    ) -> None:
        """The job stops on all its nodes; it restarts from its last good checkpoint."""
        now = self.now
        if job.state is JobState.RESTARTING:
            job.start_up_until(now)
        elif job.state is JobState.RUNNING:
            interval = self.scenario.jobs.checkpoint_interval_min * 60.0
            good = min(now, rollback_to if rollback_to is not None else now)
            saved = job.progress_at(job.last_checkpoint(max(good, job.segment_start), interval))
            job.lost_h += job.progress_at(now) - saved
            job.saved_h = saved
            job.running_h += (now - job.segment_start) / HOUR
        else:
            return
        job.interruptions += 1
        if fault is not None and fault.cls in ATTRIBUTED:
            job.attributed_interruptions += 1
        job.version += 1
        slots = [self.slots[i] for i in job.slots]
        self._release(job)
        for slot in slots:  # a job's own fault (its crash, its hang) ends with it
            ended = [f for f in slot.faults.values() if f.fix is Fix.RESTART]
            if ended:
                self._remove(slot, ended)
        if cause != "platform" or not self.driver.job_aware:
            job.retries += 1
        if job.retries > self.scenario.jobs.retry_budget:
            self._fail(job, "retry budget exhausted")
        else:
            job.state = JobState.WAITING
            job.waiting_since = now
            timeout = self.scenario.jobs.capacity_timeout_h * HOUR
            self.at(now + timeout, self._capacity_timeout, job, job.version)
            self.at(now + self.scenario.jobs.requeue_delay_s, self._requeue, job, job.version)
        if cause == "fault":
            for slot in slots:
                if slot.faults and self.has_node_fault(slot):
                    self.request_human(slot)  # operators chase nodes that kill jobs

    def _requeue(self, job: Job, version: int) -> None:
        if job.version == version and job.state is JobState.WAITING:
            self.waiting.append(job)
            self._want_scheduling()

    def _capacity_timeout(self, job: Job, version: int) -> None:
        if job.version == version and job.state is JobState.WAITING:
            if job in self.waiting:
                self.waiting.remove(job)
            self._fail(job, "no capacity in time")

    def _fail(self, job: Job, why: str) -> None:
        job.state = JobState.FAILED
        job.failure = why
        job.ended_at = self.now
