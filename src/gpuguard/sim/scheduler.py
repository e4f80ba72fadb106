"""The workload on the fleet: placement, start-up, checkpoints, the hang watchdog, silent
data corruption, and requeueing interrupted jobs.

Jobs go on free schedulable slots, interrupted jobs first. A placed job starts up, then
runs at the pace of its slowest node; an interruption rolls it back to its last
checkpoint and requeues it, or fails it once its retries or its wait for capacity run out.
A job's timers (its start-up, end, watchdog, requeue and capacity timeout) belong to one
stretch of its life: each placement, speed change and interruption cancels the ones
before it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from gpuguard.sim.events import Event
from gpuguard.sim.faults import ATTRIBUTED, HOUR, Effect, Fault, Fix
from gpuguard.sim.gpu_slots import pick_partial
from gpuguard.sim.jobs import Job, JobState, effective_speed
from gpuguard.sim.slot import Slot
from gpuguard.sim.world import World


class Scheduler:
    """The jobs' queues and each job's course on the nodes it was given."""

    def __init__(self, world: World) -> None:
        self._world = world
        self._events = world.events
        self._stats = world.stats
        self._driver = world.driver
        self._slots = world.slots
        scenario = world.scenario
        self._jobs = scenario.jobs
        self._detection = scenario.detection
        self._sdc_fails_job = scenario.failures.sdc_fails_job
        self._free = world.fleet.free
        self._partial = world.fleet.partial  # nodes with GPUs out alone (``gpu_slots``)
        # The preflight gate (``preflight.py``): its seconds at each start, and its verdict.
        self.gate_s = 0.0
        self.gate: Callable[[Job], bool] | None = None
        # Gang scheduling (Kueue, JobSet): an interrupted job keeps its quota, so the nodes
        # freed meanwhile are its first and it never gives up for want of capacity.
        self._gang = scenario.jobs.restart_scheduling == "gang"
        self._requeueing: dict[int, int] = {}  # job id -> nodes, in their requeue delay
        self.waiting: list[Job] = []  # interrupted, restart first
        self.queued: list[Job] = []
        self.smallest_job = min(size.nodes for size in scenario.jobs.mix)
        # Warm spares: idle nodes no new job may take (placeholder pods hold them), kept for
        # an interrupted job. One taken is back after the provider's launch time.
        self.spares_ready = scenario.fleet.warm_spares(world.driver.warm_spares)
        self._launch_s = scenario.fleet.new_capacity_h * HOUR
        self.speed_factor = effective_speed(scenario.jobs)
        self._scheduling = False
        # (fault, job) -> the owners' trace, when the job first computed there, its work then
        self._armed_sdc: dict[tuple[int, int], tuple[Event, float, float]] = {}
        self.on_running: Callable[[Job], None] | None = None  # a job's stretch began
        self.on_released: Callable[[Job], None] | None = None  # it left its nodes
        self._timers: dict[int, tuple[Event, ...]] = {}  # by job id: the current stretch's

    def arrive(self, job: Job) -> None:
        self.queued.append(job)
        self.want_scheduling()

    # -- placement --------------------------------------------------------------------

    def want_scheduling(self) -> None:
        if not self._scheduling:
            self._scheduling = True
            self._events.at(self._events.now, self._schedule)

    def _schedule(self) -> None:
        self._scheduling = False
        free, partial = self._free, self._partial
        # Under gang scheduling the quota of every interrupted job is held back from the
        # jobs behind it; first-fit lets any job that fits take the nodes.
        held = sum(self._requeueing.values())
        for line in (self.waiting, self.queued):
            kept = self.spares_ready if line is self.queued else 0
            index = 0
            while index < len(line) and (len(free) - held - kept >= self.smallest_job or partial):
                job = line[index]
                # A sub-node job takes a node with GPUs out alone first (it fits there).
                spot = None
                if partial and job.nodes == 1:
                    spot = pick_partial(partial, self._slots, job.gpus)
                if spot is not None or job.nodes <= len(free) - held - kept:
                    del line[index]
                    self._place(job, spot)
                    if line is self.waiting and spot is None:
                        self._take_spares(len(free) - held)
                else:
                    if self._gang and line is self.waiting:
                        held += job.nodes
                    index += 1

    def _take_spares(self, left: int) -> None:
        """An interrupted job left ``left`` nodes free: the spares below that were its."""
        taken = min(self.spares_ready, self.spares_ready - left)
        if taken > 0:
            self.spares_ready -= taken
            self._stats.spares_taken += taken
            self._events.at(self._events.now + self._launch_s, self._spares_back, taken)

    def _spares_back(self, count: int) -> None:
        self.spares_ready += count

    def _place(self, job: Job, spot: int | None = None) -> None:
        now = self._events.now
        slots = self._slots
        if spot is not None:
            self._partial.discard(spot)
        picked = [spot] if spot is not None else list(itertools.islice(self._free, job.nodes))
        # Its GPUs are the deep suite's until a run in progress on its nodes ends.
        starts = now
        discard = self._free.discard  # not difference_update: it resizes the set, and
        for index in picked:  # the set's order is which nodes the next job gets
            slot = slots[index]
            slot.job = job
            discard(index)
            if slot.testing and slot.test_ends > starts:
                starts = slot.test_ends
        job.slots = picked
        job.state = JobState.RESTARTING
        self._cancel_timers(job)
        job.placed_at = now
        job.starts_at = starts
        job.waiting_since = None
        if job.first_start is None:
            job.first_start = now
        if self.gate is not None:  # the check runs before the workload starts up
            self._timers[job.id] = (self._events.at(starts + self.gate_s, self._gated, job),)
            return
        overhead = self._jobs.restart_overhead_min * 60.0
        self._timers[job.id] = (self._events.at(job.starts_at + overhead, self._ready, job),)

    def _gated(self, job: Job) -> None:
        """The gate's verdict: the start goes on, or fails and the job is placed again."""
        assert self.gate is not None
        if not self.gate(job):
            self.interrupt(job, cause="platform")
            return
        overhead = self._jobs.restart_overhead_min * 60.0
        self._timers[job.id] = (self._events.at(self._events.now + overhead, self._ready, job),)

    def _ready(self, job: Job) -> None:
        now = self._events.now
        faulty = [slot for slot in map(self._slots.__getitem__, job.slots) if slot.faults]
        for slot in faulty:
            for fault in slot.faults.values():
                if fault.effect in (Effect.CRASH, Effect.DOWN) and not slot.spares(fault):
                    # Dies initialising: the interruption books the start-up, once.
                    self.interrupt(job, cause="fault", fault=fault)
                    return
        job.start_up_until(now)
        job.state = JobState.RUNNING
        job.segment_start = now
        job.speed = self._pace(job)
        job.pieces = [(now, job.speed)]
        self._plan_end(job)
        for slot in faulty:
            for fault in slot.faults.values():
                if fault.effect is Effect.SILENT and not slot.spares(fault):
                    self._arm_sdc(fault, job)
        if self.on_running is not None:
            self.on_running(job)

    def _release(self, job: Job) -> None:
        refresh = self._world.fleet.refresh
        for index in job.slots:
            slot = self._slots[index]
            if slot.job is job:
                slot.job = None
                refresh(slot)
        if self.on_released is not None:
            self.on_released(job)
        job.slots = []

    # -- running ----------------------------------------------------------------------

    def _pace(self, job: Job) -> float:
        slots = self._slots
        # A slot without faults runs at full pace: only the others are asked.
        pace = min((slots[i].speed() for i in job.slots if slots[i].faults), default=1.0)
        return pace * self.speed_factor

    def _plan_end(self, job: Job) -> None:
        """Its end at the current pace, or, while a node hangs, the watchdog."""
        now = self._events.now
        self._cancel_timers(job)
        if job.speed > 0:
            remaining = max(0.0, job.work_h - job.progress_at(now))
            end = self._events.at(now + remaining * HOUR / job.speed, self._done, job)
        else:
            end = self._events.at(now + self._detection.watchdog_min * 60.0, self._watchdog, job)
        self._timers[job.id] = (end,)

    def speed_changed(self, job: Job) -> None:
        if job.state is not JobState.RUNNING:
            return
        pace = self._pace(job)
        if pace != job.speed:
            job.speed = pace
            job.pieces.append((self._events.now, pace))
            self._plan_end(job)

    def _watchdog(self, job: Job) -> None:
        if job.state is JobState.RUNNING and job.speed == 0:
            hung = next(
                (
                    f
                    for i in job.slots
                    for f in self._slots[i].faults.values()
                    if f.effect is Effect.HANG
                ),
                None,
            )
            self.interrupt(job, cause="fault", fault=hung)

    def _done(self, job: Job) -> None:
        if job.state is not JobState.RUNNING:
            return
        now = self._events.now
        job.running_h += (now - job.segment_start) / HOUR
        job.saved_h = job.work_h
        job.state = JobState.SUCCEEDED
        job.ended_at = now
        self._cancel_timers(job)  # an ended job keeps none
        self._release(job)

    def hit(self, slot: Slot, fault: Fault) -> None:
        """A fault starts under the slot's job."""
        job = slot.job
        if job is None or job.state is not JobState.RUNNING or slot.spares(fault):
            return  # a job initialising finds the fault when it is ready
        if fault.effect in (Effect.CRASH, Effect.DOWN):
            self.interrupt(job, cause="fault", fault=fault)
        elif fault.effect in (Effect.HANG, Effect.SLOW):
            self.speed_changed(job)
        elif fault.effect is Effect.SILENT:
            self._arm_sdc(fault, job)

    # -- silent data corruption -------------------------------------------------------

    def _arm_sdc(self, fault: Fault, job: Job) -> None:
        """The job computes on a corrupting GPU; its owners find out some time later."""
        if (fault.id, job.id) in self._armed_sdc:
            return
        now = self._events.now
        found = now + self._detection.sdc_detection_h * HOUR
        good = job.progress_at(now)
        event = self._events.at(found, self._sdc_found, fault, job, now, good)
        self._armed_sdc[fault.id, job.id] = (event, now, good)

    def sdc_caught(self, fault: Fault, job: Job) -> None:
        """The job's replica check or compute probe named the corrupting GPU: it stops and
        resumes from its last checkpoint before the corruption now, not when its owners
        would have traced the bad results (``sim/in_job.py``)."""
        armed = self._armed_sdc.get((fault.id, job.id))
        if armed is None:
            return
        event, corrupted_at, good_h = armed
        self._events.cancel(event)
        if job.state is JobState.RUNNING:
            self.interrupt(job, cause="platform", fault=fault, rollback_to=corrupted_at)
        _keep_only(job, good_h)  # it may have computed there in an earlier stretch

    def _sdc_found(self, fault: Fault, job: Job, corrupted_at: float, good_h: float) -> None:
        """Bad results traced to the node: the work since the corruption is lost wherever
        the job is now (its checkpoints carry it), and the job fails if the scenario says
        so. A job that already ended loses that work too."""
        # The job's owners now keep it off that GPU: it is not corrupted there again.
        self._stats.found_by_job(fault, self._events.now)
        slot = self._slots[fault.slot]
        if self._world.fault_process.is_current(slot, fault):
            # The job's owners trace the bad results to the node.
            self._world.fleet.request_human(slot)
        if job.state is JobState.FAILED:
            return
        if job.state in (JobState.RUNNING, JobState.RESTARTING):
            self.interrupt(job, cause="fault", fault=fault, rollback_to=corrupted_at)
        _keep_only(job, good_h)
        if not self._sdc_fails_job or job.failure:  # failed meanwhile
            return
        if job.state is JobState.SUCCEEDED:  # it ended when it ended, on wrong numbers
            job.state, job.failure = JobState.FAILED, "silent data corruption"
            return
        if job in self.waiting:
            self.waiting.remove(job)
        self._fail(job, "silent data corruption")

    # -- interruptions ----------------------------------------------------------------

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
        now = self._events.now
        if job.state is JobState.RESTARTING:
            job.start_up_until(now)
        elif job.state is JobState.RUNNING:
            interval = self._jobs.checkpoint_interval_min * 60.0
            good = min(now, rollback_to if rollback_to is not None else now)
            checkpoint = job.last_checkpoint(max(good, job.segment_start), interval)
            saved = job.progress_at(checkpoint)
            job.lost_h += job.progress_at(now) - saved
            job.lost_wall_h += (now - checkpoint) / HOUR  # a hang's time included
            job.saved_h = saved
            job.running_h += (now - job.segment_start) / HOUR
        else:
            return
        job.interruptions += 1
        if fault is not None and fault.cls in ATTRIBUTED:
            job.attributed_interruptions += 1
        charged = self._driver.charges(job, cause, fault)
        self._cancel_timers(job)
        slots = [self._slots[i] for i in job.slots]
        self._release(job)
        faults = self._world.fault_process
        for slot in slots:  # a job's own fault (its crash, its hang) ends with it
            ended = [f for f in slot.faults.values() if f.fix is Fix.RESTART]
            if ended:
                faults.remove(slot, ended)
        if charged:
            job.retries += 1
        if job.retries > self._jobs.retry_budget:
            self._fail(job, "retry budget exhausted")
        else:
            job.state = JobState.WAITING
            job.waiting_since = now
            at = self._events.at
            requeue = at(now + self._jobs.requeue_delay_s, self._requeue, job)
            if self._gang:
                self._requeueing[job.id] = job.nodes
                self._timers[job.id] = (requeue,)
            else:
                timeout = at(
                    now + self._jobs.capacity_timeout_h * HOUR, self._capacity_timeout, job
                )
                self._timers[job.id] = (timeout, requeue)
        if cause == "fault":
            for slot in slots:
                if slot.faults and faults.has_node_fault(slot):
                    self._world.fleet.request_human(slot)  # operators chase nodes that kill jobs

    def _requeue(self, job: Job) -> None:
        self._requeueing.pop(job.id, None)
        if job.state is JobState.WAITING:
            self.waiting.append(job)
            self.want_scheduling()

    def _capacity_timeout(self, job: Job) -> None:
        if job.state is JobState.WAITING:
            if job in self.waiting:
                self.waiting.remove(job)
            self._fail(job, "no capacity in time")

    def _fail(self, job: Job, why: str) -> None:
        self._requeueing.pop(job.id, None)
        job.state = JobState.FAILED
        job.failure = why
        job.ended_at = self._events.now
        self._cancel_timers(job)  # an ended job keeps none

    def _cancel_timers(self, job: Job) -> None:
        for event in self._timers.pop(job.id, ()):
            self._events.cancel(event)

    @staticmethod
    def close_books(jobs: list[Job], t: float) -> None:
        """Count the stretch each job is in at the end of the run."""
        for job in jobs:
            if job.state is JobState.RUNNING:
                job.running_h += (t - job.segment_start) / HOUR
                job.saved_h = job.progress_at(t)
            elif job.state is JobState.RESTARTING:
                job.start_up_until(t)


def _keep_only(job: Job, good_h: float) -> None:
    """Saved work beyond ``good_h`` was computed on wrong numbers: it is lost."""
    if job.saved_h > good_h:
        job.lost_h += job.saved_h - good_h
        job.saved_h = good_h
