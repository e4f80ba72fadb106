"""Detection inside running jobs, for the gpuguard run: what the training-side telemetry
and the agent's passive sampling under load find, and when.

As ``gpuguard.training`` does in a real job (issue 17): each rank times its compute per
step, every ``window_steps`` the ranks exchange their medians, and a rank above its peers'
median by ``ratio`` for ``persistence_windows`` windows in a row is named (a FAIL_SLOW
verdict on its node); it withdraws the verdict when it recovers. Every
``fingerprint_steps`` the replicas compare parameter fingerprints, and one that differs
from the majority on ``mismatch_rounds`` rounds is named (REPLICA_MISMATCH): that needs a
strict majority, three replicas or more. A verdict lapses ``verdict_ttl_s`` after its job
left the node. The agent also samples NVML under load: a GPU clocked below its siblings
with a throttle reason (a power-brake fail-slow) on a busy node is named after
``passive_window_s``. The findings are ``in_job_findings``'s; the real policy decides.

Cheap by construction: work is done per fault onset, per job start and end and per
verdict, never per controller pass.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from gpuguard.sim.agent_view import GPUS
from gpuguard.sim.faults import DAY, Effect, Fault, Signal
from gpuguard.sim.fleet import Slot
from gpuguard.sim.in_job_findings import FAIL_SLOW, LOAD_CLOCK, REPLICA_MISMATCH, InJobFinding
from gpuguard.sim.jobs import Job, JobState

if TYPE_CHECKING:
    from gpuguard.sim.engine import Engine

GOLDEN = 0.6180339887498949  # a low-discrepancy draw per job id, the same in every run
Key = tuple[str, int]  # (code, fault id; a false verdict's own negative number)


class InJobPath:
    def __init__(self, engine: Engine, report: Callable[[Slot], None]) -> None:
        """``report``: the agent's fresh report after a finding came or went."""
        self.engine = engine
        self.config = config = engine.scenario.in_job
        self.report = report
        self.rng = np.random.default_rng([engine.scenario.seed, 4])
        self.adoption_offset = float(self.rng.random())
        # Whether a corrupting GPU's errors reach its replica's parameters, per fault.
        silent = [f.id for f in engine.faults if f.effect is Effect.SILENT]
        draws = self.rng.random(len(silent)) < config.sdc_parameter_share
        self.reaches = dict(zip(silent, draws.tolist(), strict=True))
        # Each slot's findings: key -> (finding, job id, machine).
        self.findings: dict[int, dict[Key, tuple[InJobFinding, int, int | None]]] = {}
        self.by_job: dict[int, set[int]] = defaultdict(set)  # job id -> slots it accused
        engine.fault_process.on_start = self._fault_started
        engine.scheduler.on_running = self._job_running
        engine.scheduler.on_released = self._job_released
        self._false_verdict_stream()

    # -- who can be seen ----------------------------------------------------------------

    def adopted(self, job: Job) -> bool:
        return (job.id * GOLDEN + self.adoption_offset) % 1.0 < self.config.adoption

    def replicas(self, job: Job) -> int:
        return job.nodes * GPUS // self.config.gpus_per_replica

    def _pace(self, job: Job) -> float:
        return job.speed / self.engine.speed_factor if self.engine.speed_factor else 0.0

    # -- onsets: a fault under a running job, a job starting on a faulty node -------------

    def _fault_started(self, slot: Slot, fault: Fault) -> None:
        job = slot.job
        if job is not None and job.state is JobState.RUNNING:
            self._watch(slot, fault, job, onset=True)

    def _job_running(self, job: Job) -> None:
        slots = self.engine.slots
        for index in job.slots:
            slot = slots[index]
            if slot.faults:  # most nodes have none: skip them cheaply
                for fault in list(slot.faults.values()):
                    self._watch(slot, fault, job, onset=False)

    def _watch(self, slot: Slot, fault: Fault, job: Job, *, onset: bool) -> None:
        """Schedule the verdict a fault will get from this job's stretch, if any. ``onset``:
        it began mid-window (a uniform share of one window or round more); else the job's
        first window or round starts with it."""
        config, pace = self.config, self._pace(job)
        if pace <= 0:
            return  # a hung job takes no steps
        step_s = config.step_s / pace
        if fault.cls == "fail_slow" and fault.effect is Effect.SLOW:
            if fault.signal is Signal.POWER_BRAKE and config.passive:
                self._at(config.passive_window_s, self._name_passive, slot, fault, job)
            if not self.adopted(job) or job.nodes * config.ranks_per_node < 2:
                return  # no peers to be slower than
            if fault.slowdown * config.ratio > 1.0:
                return  # within the judge's ratio: not told apart from jitter
            windows = config.persistence_windows + (self.rng.random() if onset else 0.0)
            self._at(windows * config.window_steps * step_s, self._name_slow, slot, fault, job)
        elif fault.effect is Effect.SILENT:
            if not self.adopted(job) or self.replicas(job) < 3 or not self.reaches[fault.id]:
                return  # no strict majority, or corruption the all-reduce spreads to all
            rounds = config.mismatch_rounds - 1 + (self.rng.random() if onset else 1.0)
            delay = rounds * config.fingerprint_steps * step_s
            self._at(delay, self._name_mismatch, slot, fault, job)

    def _at(self, delay: float, action: Callable[..., None], slot: Slot, *args: object) -> None:
        engine = self.engine
        engine.at(engine.now + delay, action, slot, slot.machine, *args)

    def _still(self, slot: Slot, machine: int | None, fault: Fault, job: Job) -> bool:
        """The fault and the job's stretch are both still on this machine."""
        return (
            slot.machine == machine
            and slot.faults.get(fault.id) is fault
            and slot.job is job
            and job.state is JobState.RUNNING
        )

    # -- verdicts -----------------------------------------------------------------------

    def _name_slow(self, slot: Slot, machine: int | None, fault: Fault, job: Job) -> None:
        if not self._still(slot, machine, fault, job):
            return
        self._note(fault, "in_job")
        self._raise(slot, (FAIL_SLOW, fault.id), InJobFinding(FAIL_SLOW, fault.gpu, True), job)
        self._until_checkpoint(slot, (FAIL_SLOW, fault.id), job)
        self._withdraw_at_end(slot, fault, (FAIL_SLOW, fault.id))

    def _name_mismatch(self, slot: Slot, machine: int | None, fault: Fault, job: Job) -> None:
        if not self._still(slot, machine, fault, job):
            return
        self._note(fault, "in_job")
        finding = InJobFinding(REPLICA_MISMATCH, fault.gpu, False)
        self._raise(slot, (REPLICA_MISMATCH, fault.id), finding, job)
        self.engine.scheduler.sdc_caught(fault, job)

    def _name_passive(self, slot: Slot, machine: int | None, fault: Fault, job: Job) -> None:
        if not self._still(slot, machine, fault, job):
            return
        self._note(fault, "passive")
        # The throttle reason is the evidence: the finding lasts while it does.
        self._raise(slot, (LOAD_CLOCK, fault.id), InJobFinding(LOAD_CLOCK, fault.gpu, True), job)
        self._withdraw_at_end(slot, fault, (LOAD_CLOCK, fault.id))

    def _note(self, fault: Fault, path: str) -> None:
        times = self.engine.stats.hidden.get(fault.id)
        if times is not None and getattr(times, path) is None:
            setattr(times, path, self.engine.now)

    def _raise(self, slot: Slot, key: Key, finding: InJobFinding, job: Job) -> None:
        mine = self.findings.setdefault(slot.index, {})
        if any(machine != slot.machine for _, _, machine in mine.values()):
            mine.clear()  # left from the machine the slot had before
        mine[key] = (finding, job.id, slot.machine)
        self.by_job[job.id].add(slot.index)
        self._publish(slot)

    def _drop(self, slot: Slot, key: Key, machine: int | None) -> None:
        mine = self.findings.get(slot.index, {})
        held = mine.get(key)
        if held is not None and held[2] == machine and slot.machine == machine:
            del mine[key]
            self._publish(slot)

    def _publish(self, slot: Slot) -> None:
        slot.in_job = tuple(sorted(f for f, _, _ in self.findings.get(slot.index, {}).values()))
        self.report(slot)

    def _until_checkpoint(self, slot: Slot, key: Key, job: Job) -> None:
        """The job's next checkpoint after the verdict: from then the repair need not wait."""
        interval = self.engine.scenario.jobs.checkpoint_interval_min * 60.0
        done = math.floor((self.engine.now - job.segment_start) / interval) + 1
        at = job.segment_start + done * interval
        self.engine.at(at, self._checkpointed, slot, slot.machine, key, job, job.segment_start)

    def _checkpointed(
        self, slot: Slot, machine: int | None, key: Key, job: Job, segment_start: float
    ) -> None:
        held = self.findings.get(slot.index, {}).get(key)
        if held is None or held[2] != machine or slot.machine != machine:
            return
        if job.state is JobState.RUNNING and job.segment_start == segment_start:
            finding, owner, _ = held
            self.findings[slot.index][key] = (
                InJobFinding(finding.code, finding.gpu, False),
                owner,
                machine,
            )
            self._publish(slot)

    def _withdraw_at_end(self, slot: Slot, fault: Fault, key: Key) -> None:
        """A transient slowdown ends: the rank recovers and withdraws its verdict."""
        if fault.end is not None:
            self.engine.at(max(fault.end, self.engine.now), self._drop, slot, key, slot.machine)

    def _job_released(self, job: Job) -> None:
        """The job left its nodes: its verdicts lapse unless it comes back; the controller
        sees the pods gone, so a waiting repair may start now."""
        accused = self.by_job.pop(job.id, None)
        if not accused:
            return
        slots = self.engine.slots
        lapse = self.engine.now + self.config.verdict_ttl_s
        for index in accused:
            slot = slots[index]
            for key, (_, owner, machine) in list(self.findings.get(index, {}).items()):
                if owner == job.id and key[0] != LOAD_CLOCK:  # a job's verdicts, not NVML's
                    self.engine.at(lapse, self._lapse, slot, key, machine, job)
            self.engine.at(self.engine.now, self.report, slot)

    def _lapse(self, slot: Slot, key: Key, machine: int | None, job: Job) -> None:
        if slot.job is job and job.state is JobState.RUNNING:
            self.by_job[job.id].add(slot.index)  # back on the node: its ranks refresh it
            return
        self._drop(slot, key, machine)

    # -- false verdicts -------------------------------------------------------------------

    def _false_verdict_stream(self) -> None:
        """Healthy ranks named slow, at the scenario's rate per node-day of running jobs:
        drawn over every node-day and kept where a job with the telemetry runs."""
        engine, rate = self.engine, self.config.false_verdicts_per_node_day
        nodes = len(engine.slots)
        count = int(self.rng.poisson(rate * nodes * engine.horizon / DAY)) if rate > 0 else 0
        for n in range(count):
            slot = engine.slots[int(self.rng.integers(0, nodes))]
            gpu = int(self.rng.integers(0, GPUS))
            engine.at(float(self.rng.random()) * engine.horizon, self._false_verdict, slot, gpu, n)

    def _false_verdict(self, slot: Slot, gpu: int, n: int) -> None:
        job = slot.job
        if job is None or job.state is not JobState.RUNNING or not self.adopted(job):
            return
        self.engine.stats.false_verdicts += 1
        key = (FAIL_SLOW, -1 - n)
        self._raise(slot, key, InJobFinding(FAIL_SLOW, gpu, True), job)
        self._until_checkpoint(slot, key, job)
