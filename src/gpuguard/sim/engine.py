"""The discrete-event engine: one clock, the fleet, its jobs and faults, wired together.

The engine is the world: machines fail (``fault_process.py``), jobs run, checkpoint and
crash while the scheduler places work on schedulable nodes (``scheduler.py``), machines
are rebooted, reset or swapped for a spare (``fleet.py``), and the time in service is
booked (``accounting.py``), all on one event queue (``events.py``). What a remediation
system would decide is left to a ``Driver`` (``policies.py``); the engine only carries
out what the driver asks for, with the scenario's durations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gpuguard.sim.accounting import BIN_S, FaultTimes, HiddenTimes, ServiceBooks, Stats
from gpuguard.sim.agent_view import AgentView, NodeSignals
from gpuguard.sim.events import EventQueue
from gpuguard.sim.fault_process import FaultProcess
from gpuguard.sim.faults import DAY, Fault
from gpuguard.sim.fleet import Fleet
from gpuguard.sim.jobs import NO_BOOKS, Job, JobBooks
from gpuguard.sim.scenario import Scenario
from gpuguard.sim.scheduler import Scheduler
from gpuguard.sim.slot import Slot
from gpuguard.sim.world import Reactions
from gpuguard.sli import TimeShare

__all__ = ["BIN_S", "Driver", "Engine", "FaultTimes", "HiddenTimes", "Slot", "Stats"]


class Driver(Reactions, Protocol):
    """A remediation system (or none) reacting to what the fleet shows."""

    name: str

    def attach(self, engine: Engine) -> None: ...


class Engine:
    """The world's parts, and what the drivers and the reports use of them."""

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
        self.progress = progress
        # The warm-up runs first and is left out of every figure (``measured_*`` below).
        self.warmup = scenario.warmup_days * DAY
        self.horizon = scenario.span_days * DAY
        self._counts_before = Stats()
        self._books_before: dict[int, JobBooks] = {}
        self.events = EventQueue()
        self.at = self.events.at  # the drivers schedule their own events on the same clock
        self.stats = Stats()
        self.books = ServiceBooks(self.stats, slots=scenario.fleet.nodes, horizon=self.horizon)
        # The parts reach one another through the engine; in this order, each finds what
        # it keeps a reference to already built (the scheduler takes the fleet's free set).
        self.fleet = Fleet(self, seed=seed)
        self.slots = self.fleet.slots
        for fault in faults:
            if fault.of_silent_machine:
                self.slots[fault.slot].silent = True
        self.fault_process = FaultProcess(self)
        self.scheduler = Scheduler(self)
        for slot in self.slots:
            self.fleet.refresh(slot)
        driver.attach(self)

    # -- the clock --------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self.events.now

    def run(self) -> None:
        self.events.at_each(self.fault_process.start, self.faults, lambda fault: fault.start)
        self.events.at_each(self.scheduler.arrive, self.jobs, lambda job: job.arrival)
        if self.warmup > 0:
            self.at(self.warmup, self._start_measuring)
        self.events.run(self.horizon, self.progress)
        self.books.account(self.horizon)
        self.scheduler.close_books(self.jobs, self.horizon)
        if self.progress is not None:
            self.progress(1.0)

    def _start_measuring(self) -> None:
        now = self.now
        self.books.start_measuring(now)
        self._counts_before = self.stats.counts()
        self._books_before = {job.id: job.books_at(now) for job in self.jobs if job.arrival < now}

    # -- what the reports use: the measured days alone --------------------------------

    def measured_stats(self) -> Stats:
        """The counts and times of the measured days (after the warm-up)."""
        starts = {fault.id: fault.start for fault in self.faults}
        return self.stats.since(self._counts_before, self.warmup, starts)

    def measured_jobs(self) -> list[Job]:
        """The jobs submitted in the measured days (a job of the warm-up is left out)."""
        return [job for job in self.jobs if job.arrival >= self.warmup]

    def measured_books(self) -> list[tuple[Job, JobBooks]]:
        """Each job's books over the measured days: as the run closed them less when those
        days began, so a job of the warm-up counts for what it did and met after."""
        return [(job, job.booked() - self._books_before.get(job.id, NO_BOOKS)) for job in self.jobs]

    # -- what the drivers and reports use ---------------------------------------------

    @property
    def slot_share(self) -> TimeShare:
        return self.books.slot_share

    @property
    def machine_share(self) -> TimeShare:
        return self.books.machine_share

    @property
    def speed_factor(self) -> float:
        return self.scheduler.speed_factor

    @property
    def on_idle(self) -> Callable[[Slot], None] | None:
        """Called when a slot just became free."""
        return self.fleet.on_idle

    @on_idle.setter
    def on_idle(self, hook: Callable[[Slot], None] | None) -> None:
        self.fleet.on_idle = hook

    def signals(self, slot: Slot) -> NodeSignals:
        """What the agent reads on the node now."""
        return self.fault_process.signals(slot)

    def has_node_fault(self, slot: Slot) -> bool:
        return self.fault_process.has_node_fault(slot)

    def set_flags(
        self, slot: Slot, *, tainted: bool | None = None, cordoned: bool | None = None
    ) -> None:
        self.fleet.set_flags(slot, tainted=tainted, cordoned=cordoned)

    def start_test(self, slot: Slot, duration: float) -> None:
        self.fleet.start_test(slot, duration)

    def end_test(self, slot: Slot) -> None:
        self.fleet.end_test(slot)

    def repair(
        self, slot: Slot, what: str, *, gpus: tuple[int, ...] = (), manual: bool = False
    ) -> None:
        self.fleet.repair(slot, what, gpus=gpus, manual=manual)

    def replace(self, slot: Slot, *, manual: bool = False) -> None:
        self.fleet.replace(slot, manual=manual)

    def request_human(self, slot: Slot) -> None:
        self.fleet.request_human(slot)

    def interrupt_job(self, slot: Slot, *, cause: str) -> None:
        self.scheduler.interrupt_job(slot, cause=cause)

    def detected(self, slot: Slot) -> None:
        self.stats.detected(slot.faults.values(), self.now)

    def found_by_checks(self, faults: list[Fault]) -> None:
        self.stats.found_by_checks(faults, self.now)
