"""The agents' deep suite (``agent/deep.py``) in simulated time, for the gpuguard run.

On the scenario's schedule each node's agent runs the suite once the node has been idle
(free of jobs) for ``min_idle_s``, as the agent waits for that many seconds of idle samples:
a job placed before then, such as a failed job coming back to its nodes, prevents the run,
and the wait starts again when the node is next free. As in production the node is neither
cordoned nor tainted for a run, so it stays in service and a job placed meanwhile starts
when the run ends. On the controller's verify
request it runs at once (the node is then quarantined, so out of service). A run measures
each GPU: a corrupting GPU shows wrong products and a slow one a lower speed, each with the
scenario's chance per run, and a healthy node sometimes measures slow (a false positive).
The measurement is judged by the real rules (``checks.load.judge``) and folds into the GPU
layer, as the agent's does.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpuguard.contract.verify import VerifyAnswer
from gpuguard.sim.agent_view import GPUS, DeepFinding
from gpuguard.sim.engine import Engine, Slot
from gpuguard.sim.faults import HOUR, Effect, Fault

FALSE_POSITIVE_PACE = 0.75  # a noisy measurement: below both of the judge's thresholds


class DeepSuite:
    def __init__(
        self,
        engine: Engine,
        report: Callable[[Slot], None],
        passed: Callable[[Slot], None] | None = None,
    ) -> None:
        """``report``: the agent's fresh report after a run (the controller then decides);
        ``passed``: what the agent forgets when a run passes (unconfirmed slowness)."""
        self.engine = engine
        self.passed = passed
        self.config = engine.scenario.deep_checks
        self.report = report
        self.rng = np.random.default_rng([engine.scenario.seed, 3])
        self.due: set[int] = set()
        self.free_since: dict[int, float] = {}  # when each slot last became free (else 0)
        self.requests: dict[int, str] = {}  # the id of the verify request on each Node
        self.answers: dict[int, VerifyAnswer] = {}  # each agent's latest verify answer
        if self.config.interval_h is not None:
            engine.on_idle = self._idle
            for slot in engine.slots:  # the agents started at different times
                self._schedule(slot, self.config.interval_h * HOUR * self.rng.random())

    def node_replaced(self, slot: Slot) -> None:
        """A new machine and a new agent: its first scheduled run one interval on."""
        self.due.discard(slot.index)
        self.requests.pop(slot.index, None)
        self.answers.pop(slot.index, None)
        if self.config.interval_h is not None:
            self._schedule(slot, self.config.interval_h * HOUR)

    def request_verify(self, slot: Slot, stamp: str) -> None:
        if self.requests.get(slot.index) == stamp:
            return  # re-sent until seen
        self.requests[slot.index] = stamp
        engine = self.engine
        engine.at(engine.now + self.config.verify_pickup_s, self._pickup, slot, slot.machine, stamp)

    def clear_verify(self, slot: Slot) -> None:
        self.requests.pop(slot.index, None)

    # -- the schedule -----------------------------------------------------------------

    def _schedule(self, slot: Slot, delay: float) -> None:
        self.engine.at(self.engine.now + delay, self._due, slot, slot.machine)

    def _due(self, slot: Slot, machine: int | None) -> None:
        if slot.machine == machine:
            self.due.add(slot.index)
            self._try(slot)

    def _idle(self, slot: Slot) -> None:
        """The slot just became free: its idle time starts now."""
        self.free_since[slot.index] = self.engine.now
        if slot.index in self.due:  # every slot a job leaves comes here: most are not due
            self._try(slot)

    def _try(self, slot: Slot) -> None:
        """Due and idle long enough: run now. Idle, not yet long enough: look again when
        it will be. Busy: the agent waits for the GPUs to be idle, which here is the
        moment the slot next becomes free."""
        if slot.index not in self.due or not self._is_idle(slot):
            return
        since = self.free_since.get(slot.index, 0.0)
        ready = since + self.config.min_idle_s
        if self.engine.now < ready:
            self.engine.at(ready, self._settled, slot, slot.machine, since)
            return
        self.due.discard(slot.index)
        self._start(slot, None)

    def _settled(self, slot: Slot, machine: int | None, since: float) -> None:
        """Idle since ``since``, if no job came meanwhile (it would have moved the mark)."""
        if slot.machine == machine and self.free_since.get(slot.index, 0.0) == since:
            self._try(slot)

    @staticmethod
    def _is_idle(slot: Slot) -> bool:
        return (
            slot.machine is not None
            and slot.job is None
            and not slot.down
            and not slot.notready
            and not slot.testing
        )

    def _pickup(self, slot: Slot, machine: int | None, stamp: str) -> None:
        if slot.machine != machine or self.requests.get(slot.index) != stamp:
            return
        if slot.testing or slot.down or slot.notready:  # after the run or repair under way
            later = self.engine.now + self.config.verify_pickup_s
            self.engine.at(later, self._pickup, slot, machine, stamp)
            return
        self._start(slot, stamp)

    # -- one run ----------------------------------------------------------------------

    def _start(self, slot: Slot, stamp: str | None) -> None:
        engine = self.engine
        engine.stats.deep_runs["schedule" if stamp is None else "verify"] += 1
        # The run loads the GPUs: the agent measures idleness anew from its end.
        self.free_since[slot.index] = engine.now + self.config.duration_s
        engine.start_test(slot, self.config.duration_s)
        engine.at(engine.now + self.config.duration_s, self._finish, slot, slot.machine, stamp)

    def _finish(self, slot: Slot, machine: int | None, stamp: str | None) -> None:
        if slot.machine != machine:
            return  # replaced meanwhile
        engine = self.engine
        if stamp is None and self.config.interval_h is not None:
            self._schedule(slot, self.config.interval_h * HOUR)
        if not slot.down:  # a reset or reboot cuts a run short: no verdict
            measured, shown = self._measure(slot)
            slot.deep = measured
            flagged = engine.view.deep_flagged(measured)
            engine.found_by_checks([f for f in shown if f.gpu in flagged])
            run = engine.view.deep_run(measured)
            if run.passed and self.passed is not None:
                self.passed(slot)
            if stamp is not None:
                self.answers[slot.index] = VerifyAnswer(stamp, run.passed, tuple(run.codes))
                if not run.passed:
                    engine.stats.deep_runs["verify_failed"] += 1
            self.report(slot)
        engine.end_test(slot)

    def _measure(self, slot: Slot) -> tuple[tuple[DeepFinding, ...], list[Fault]]:
        """What this run sees on the node's GPUs, and the faults that showed in it."""
        config, draw = self.config, self.rng.random
        measured: set[DeepFinding] = set()
        shown: list[Fault] = []
        for fault in slot.faults.values():
            if fault.effect is Effect.SILENT and draw() < config.sdc_detection_probability:
                measured.add(DeepFinding("corrupt", fault.gpu))
            elif (
                fault.cls == "fail_slow"
                and fault.effect is Effect.SLOW
                and draw() < config.fail_slow_detection_probability
            ):
                measured.add(DeepFinding("slow", fault.gpu, round(fault.slowdown, 2)))
            else:
                continue
            shown.append(fault)
        if draw() < config.false_positive_probability:
            measured.add(DeepFinding("slow", int(self.rng.integers(0, GPUS)), FALSE_POSITIVE_PACE))
        return tuple(sorted(measured)), shown
