"""Detection inside running jobs, for the gpuguard run: what the training-side telemetry
and the agent's clock sampling under load find, and when.

As ``gpuguard.training`` does in a real job: each rank times its compute per step, every
``window_steps`` the ranks exchange their records, and a rank whose compute is above its
peers' median by ``ratio`` for ``persistence_windows`` windows in a row is named (a
FAIL_SLOW verdict on its node; the judge needs three ranks); it withdraws the verdict after
as many windows back within the ratio. A smaller slowdown, down to ``change_ratio``, is
named after ``change_persistence_windows`` when it began under the job after
``change_baseline_windows`` at full pace (a change from the rank's own past; a GPU slow
when the job started is the job's usual). Every ``fingerprint_steps`` the replicas compare
parameter fingerprints, and one outside a strict majority (three replicas or more) that is
odd again ``recheck_steps`` later is named (REPLICA_MISMATCH), for good. Corruption that
the all-reduce spreads to every replica alike is left to the compute probe: every
``probe_steps`` the replicas compare their gradients of one fixed batch, each round showing
the corruption with ``sdc_probe_round_share``; an odd rank is re-checked every
``recheck_steps`` up to ``probe_rechecks`` times, and named (COMPUTE_MISMATCH) when one
shows it again. As the agent does, a verdict stands when its job ends (the GPU did not
recover) until a repair of the node forgets it. The agent's ``load-clocks`` check samples
busy GPUs every check round and names one whose SM clock is below its siblings' by its
``tolerance`` in most of a window of ``min_samples`` loaded samples: here a power-brake
fail-slow on a node running a job.

Cheap by construction: work is done per fault onset, job start and end, verdict and
repair, never per controller pass. The findings are the real checks' (``in_job_findings``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from gpuguard.config import LoadClocks
from gpuguard.sim.agent_view import GPUS
from gpuguard.sim.faults import DAY, Effect, Fault, Signal
from gpuguard.sim.in_job_findings import (
    COMPUTE_MISMATCH,
    FAIL_SLOW,
    LOAD_CLOCK,
    REPLICA_MISMATCH,
    InJobFinding,
)
from gpuguard.sim.jobs import Job, JobState
from gpuguard.sim.slot import Slot

if TYPE_CHECKING:
    from gpuguard.sim.engine import Engine

GOLDEN = 0.6180339887498949  # a low-discrepancy draw per job id, the same in every run
MIN_RANKS = 3  # "of two ranks apart, neither is the odd one out" (training/straggler.py)
MAX_PROBE_ROUNDS = 10_000  # a corruption no probe round shows in this many is not found
AGENT_CLOCKS = LoadClocks()  # the agent's load-clocks defaults
Key = tuple[str, int]  # (kind, fault id; a false verdict's own negative number)


class InJobPath:
    def __init__(self, engine: Engine, report: Callable[[Slot], None]) -> None:
        """``report``: the agent's fresh report after a finding came or went."""
        self.engine = engine
        self.config = config = engine.scenario.in_job
        self.check_s = engine.scenario.detection.check_interval_s
        self.report = report
        self.rng = np.random.default_rng([engine.scenario.seed, 4])
        self.adoption_offset = float(self.rng.random())
        # Whether a corrupting GPU's errors reach its replica's parameters, per fault.
        silent = [f.id for f in engine.faults if f.effect is Effect.SILENT]
        draws = self.rng.random(len(silent)) < config.sdc_parameter_share
        self.reaches = dict(zip(silent, draws.tolist(), strict=True))
        self.probe_rng = np.random.default_rng([engine.scenario.seed, 5])  # its own stream
        # Each slot's findings: key -> (finding, the job that raised it, machine).
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

    def step_s(self, job: Job) -> float:
        """A step at the job's pace now (its slowest rank's), or inf while it hangs."""
        factor = self.engine.speed_factor
        pace = job.speed / factor if factor else 0.0
        return self.config.step_s / pace if pace > 0 else math.inf

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
        it began within a window (a uniform part of one more); else with the job's first."""
        config, step_s, draw = self.config, self.step_s(job), self.rng.random
        if math.isinf(step_s):
            return  # a hung job takes no steps
        if fault.cls == "fail_slow" and fault.effect is Effect.SLOW:
            if config.passive and fault.signal is Signal.POWER_BRAKE:
                self._watch_clocks(slot, fault, job)
            if not self.adopted(job) or job.nodes * config.ranks_per_node < MIN_RANKS:
                return
            if fault.slowdown * config.ratio <= 1.0:
                windows = config.persistence_windows + (draw() if onset else 0.0)
            elif onset and self._a_change(fault, job):
                windows = config.change_persistence_windows + draw()
            else:
                return  # within the judge's ratio, and no change it can see
            self._at(windows * config.window_steps * step_s, self._name_slow, slot, fault, job)
        elif fault.effect is Effect.SILENT:
            if not self.adopted(job) or self.replicas(job) < 3:
                return  # no strict majority
            if self.reaches[fault.id]:
                # The next round after the first corrupted update, then the re-check.
                steps = draw() * config.fingerprint_steps + config.recheck_steps
                kind = REPLICA_MISMATCH
            else:  # the all-reduce spreads it to every replica: only the probe sees it
                probe = self._probe_named_after()
                if probe is None:
                    return
                steps, kind = probe, COMPUTE_MISMATCH
            self._at(steps * step_s, self._name_mismatch, slot, fault, job, kind)

    def _probe_named_after(self) -> float | None:
        """Steps from the first wrong pass until the probe names the rank: a round that
        shows it makes a suspect, re-checked ``recheck_steps`` apart until one shows it
        again (named) or ``probe_rechecks`` have not (forgotten; the rounds go on). None:
        no probe, or no round in MAX_PROBE_ROUNDS names it."""
        config, draw = self.config, self.probe_rng.random
        every, share = config.probe_steps, config.sdc_probe_round_share
        if every == 0 or share == 0.0:
            return None
        apart = min(config.recheck_steps, every)
        at = float(draw()) * every  # the first round after the onset
        for _ in range(MAX_PROBE_ROUNDS):
            if draw() < share:
                for n in range(1, config.probe_rechecks + 1):
                    if draw() < share:
                        return at + n * apart
            at += every  # the regular rounds go on (a re-check at a round's step is one)
        return None

    def _a_change(self, fault: Fault, job: Job) -> bool:
        """A slowdown within ``ratio`` the judge names as a change: beyond
        ``change_ratio``, after the rank's usual pace was seen long enough."""
        config = self.config
        if config.change_ratio is None or fault.slowdown * config.change_ratio > 1.0:
            return False
        usual_s = config.change_baseline_windows * config.window_steps * config.step_s
        return self.engine.now - job.segment_start >= usual_s

    def _watch_clocks(self, slot: Slot, fault: Fault, job: Job) -> None:
        if fault.slowdown >= 1.0 - AGENT_CLOCKS.tolerance:
            return  # within the tolerance of its siblings' clocks
        # min_samples loaded samples, one a check round from a random phase of the first.
        rounds = AGENT_CLOCKS.min_samples - 1 + fault.check_phase
        self._at(rounds * self.check_s, self._name_clocks, slot, fault, job)

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

    def _confirm(
        self, slot: Slot, machine: int | None, fault: Fault, job: Job, kind: str, path: str
    ) -> Key | None:
        """Raise ``kind`` for ``fault`` if it still stands where it was seen; its key."""
        if not self._still(slot, machine, fault, job):
            return None
        self._note(fault, path)
        key = (kind, fault.id)
        self._raise(slot, key, InJobFinding(kind, fault.gpu), job)
        return key

    def _name_slow(self, slot: Slot, machine: int | None, fault: Fault, job: Job) -> None:
        key = self._confirm(slot, machine, fault, job, FAIL_SLOW, "in_job")
        if key is None:
            return
        self._until_checkpoint(slot, key, job)
        if fault.end is not None:  # a transient: the rank recovers, and withdraws it
            back = self.config.persistence_windows * self.config.window_steps
            at = max(fault.end, self.engine.now) + back * self.step_s(job)
            self.engine.at(at, self._recovered, slot, machine, key, job)

    def _name_mismatch(
        self, slot: Slot, machine: int | None, fault: Fault, job: Job, kind: str
    ) -> None:
        if self._confirm(slot, machine, fault, job, kind, "in_job") is not None:
            self.engine.scheduler.sdc_caught(fault, job)

    def _name_clocks(self, slot: Slot, machine: int | None, fault: Fault, job: Job) -> None:
        key = self._confirm(slot, machine, fault, job, LOAD_CLOCK, "passive")
        # Clocks back: most of the window agrees within share.
        if key is not None and fault.end is not None:
            later = (1.0 - AGENT_CLOCKS.share) * AGENT_CLOCKS.window_s
            self.engine.at(fault.end + later, self._drop, slot, key, machine)

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

    def _drop(self, slot: Slot, key: Key, machine: int | None, owner: int | None = None) -> None:
        """Remove a finding (only the one ``owner``'s job raised, when given)."""
        mine = self.findings.get(slot.index, {})
        held = mine.get(key)
        if held is None or held[2] != machine or slot.machine != machine:
            return
        if owner is None or held[1] == owner:
            del mine[key]
            self._publish(slot)

    def _publish(self, slot: Slot) -> None:
        self._shown(slot)
        self.report(slot)

    def _shown(self, slot: Slot) -> None:
        """What the agent reports: the findings of the machine now in the slot (a replaced
        machine's are left in ``findings`` until the next one is raised there)."""
        mine = self.findings.get(slot.index, {}).values()
        slot.in_job = tuple(sorted(f for f, _, machine in mine if machine == slot.machine))

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
            checkpointed = InJobFinding(finding.kind, finding.gpu, checkpointed=True)
            self.findings[slot.index][key] = (checkpointed, owner, machine)
            self._publish(slot)

    def _recovered(self, slot: Slot, machine: int | None, key: Key, job: Job) -> None:
        """Only a rank still running there sees its GPU recover; else the verdict stands."""
        if slot.job is job and job.state is JobState.RUNNING:
            self._drop(slot, key, machine)

    def _job_released(self, job: Job) -> None:
        """The job left its nodes: the controller sees the pods gone (a waiting repair may
        start now). Its verdicts stand; the busy-clock samples age out of their window."""
        accused = self.by_job.pop(job.id, None)
        if not accused:
            return
        engine, slots = self.engine, self.engine.slots
        aged = AGENT_CLOCKS.window_s - (AGENT_CLOCKS.min_samples - 1) * self.check_s
        for index in accused:
            slot = slots[index]
            for key, (_, owner, machine) in list(self.findings.get(index, {}).items()):
                if owner == job.id and key[0] == LOAD_CLOCK:
                    later = engine.now + max(0.0, aged)
                    engine.at(later, self._drop, slot, key, machine, job.id)
            engine.at(engine.now, self.report, slot)

    def repaired(self, slot: Slot) -> None:
        """A reset or reboot finished: the agent forgets the verdicts it answered (a GPU
        still slow is named again by the next job on it)."""
        mine = self.findings.get(slot.index)
        if mine and any(key[0] != LOAD_CLOCK for key in mine):
            for key in [key for key in mine if key[0] != LOAD_CLOCK]:
                del mine[key]
            self._shown(slot)

    def contradicted(self, slot: Slot) -> None:
        """A deep run passed on the node: as the agent does, it forgets the fail-slow
        verdicts written before the run (slowness no second measurement confirms)."""
        mine = self.findings.get(slot.index)
        if mine and any(key[0] == FAIL_SLOW for key in mine):
            for key in [key for key in mine if key[0] == FAIL_SLOW]:
                del mine[key]
            self._shown(slot)

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
        if job.nodes * self.config.ranks_per_node < MIN_RANKS:
            return
        self.engine.stats.false_verdicts += 1
        key = (FAIL_SLOW, -1 - n)
        self._raise(slot, key, InJobFinding(FAIL_SLOW, gpu), job)
        self._until_checkpoint(slot, key, job)
