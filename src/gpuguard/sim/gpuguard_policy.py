"""The gpuguard run: the controller's real policy core in simulated time.

This plays the agent and the cluster around ``remediation.Reconciler``, as
``controller/loop.py`` does against a cluster: the agent's verdicts (``agent_view``)
become the Node projections, the reconciler decides and hands the plan to this class as
its actuator, and the engine carries the decisions out. A pass runs whenever a node's
report changes or an action ends, and again at the reconciler's deadline (the next time
one of the policy's own clocks runs out).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection

from gpuguard.contract.report import LayerReport
from gpuguard.model import Action
from gpuguard.remediation.crash_memory import Suspicion
from gpuguard.remediation.model import (
    ActionResult,
    DecisionKind,
    NodeObservation,
    Phase,
    Plan,
)
from gpuguard.remediation.policy import Policy
from gpuguard.remediation.reconciler import Reconciler
from gpuguard.sim.agent_view import Verdict
from gpuguard.sim.attribution import JobAttribution
from gpuguard.sim.deep_suite import DeepSuite
from gpuguard.sim.engine import Engine, Slot
from gpuguard.sim.faults import Fault
from gpuguard.sim.gpu_quarantine import GPU_INDEX, GpuQuarantine
from gpuguard.sim.in_job import InJobPath
from gpuguard.sim.jobs import Job
from gpuguard.sim.preflight import PreflightGate

K = DecisionKind


class GpuguardPolicy:
    name = "gpuguard"
    warm_spares = True

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def attach(self, engine: Engine) -> None:
        self.engine = engine
        per_gpu = engine.scenario.gpu_quarantine.enabled
        self.gpus = GpuQuarantine(engine) if per_gpu else None
        self.reconciler = Reconciler(self.policy)
        self.reconciler.stale = False  # a new fleet: no episodes to read
        self.reconciler.population.update(slot.pool for slot in engine.slots)
        healthy = engine.view.verdict(engine.signals(engine.slots[0]))
        self.layers = {slot.index: dict(healthy.layers) for slot in engine.slots}
        # The verdict each node's layers were last taken from: the same verdict again (the
        # view returns one object per set of signals) leaves them as they are.
        self.verdicts: dict[int, Verdict] = dict.fromkeys(self.layers, healthy)
        self.reported: dict[int, float] = {}
        self.by_name = {slot.name: slot.index for slot in engine.slots}
        per_rack = engine.scenario.fleet.nodes_per_rack
        self.domains = [f"rack-{slot.index // per_rack}" for slot in engine.slots]
        # Where each node is: the slot, which a replacement (a new Node name) keeps.
        self.positions = [
            f"rack-{slot.index // per_rack}/slot-{slot.index}" for slot in engine.slots
        ]
        self.ours: set[int] = set()  # cordoned by us
        self.started: set[tuple[str, float, str, int]] = set()  # (node, episode, what, attempt)
        self.false_counted: set[tuple[str, float]] = set()
        self.pending: set[float] = set()
        # Each node's last projection and what it was made of (``_observation``).
        self.observed: dict[int, tuple[tuple[object, ...], NodeObservation]] = {}
        enabled = engine.scenario.in_job.enabled
        self.in_job = InJobPath(engine, self.signals_changed) if enabled else None
        passed = self.in_job.contradicted if self.in_job is not None else None
        self.deep = DeepSuite(engine, self.signals_changed, passed)
        self.attribution = JobAttribution(engine, self.policy, self._suspected)
        if engine.scenario.preflight.enabled:
            PreflightGate(engine, self.signals_changed).attach()

    # -- the jobs' interruptions ------------------------------------------------------

    def charges(self, job: Job, cause: str, fault: Fault | None) -> bool:
        """Our kills and evictions (DisruptionTarget) and what the attribution marks in
        time cost no retry: the Jobs' ``podFailurePolicy`` ignores them."""
        return self.attribution.charges(job, cause, fault)

    def _suspected(self, slot: Slot, suspicion: Suspicion) -> None:
        """Crash memory suspects the node: its observation gains the ``crashes`` layer,
        and loses it when the suspicion lapses."""
        lapse = suspicion.at + self.policy.crashes.window_s
        self.engine.at(lapse, self._crash_layer_changed, slot, slot.name)
        self._crash_layer_changed(slot, slot.name)

    def _crash_layer_changed(self, slot: Slot, name: str) -> None:
        if slot.name == name and slot.machine is not None:
            self._mark(slot)
            self._decide_at(self.engine.now)

    # -- what the agent reports -------------------------------------------------------

    def signals_changed(self, slot: Slot) -> None:
        engine = self.engine
        now = engine.now
        verdict = engine.view.verdict(engine.signals(slot))
        changed = verdict is not self.verdicts[slot.index] and self._take(slot, verdict, now)
        self.reported[slot.index] = now
        if not verdict.healthy:
            engine.detected(slot)
        if self.gpus is not None:
            self.gpus.follow(slot, self._observation(slot, now).layers)
        if changed or slot.name in self.reconciler.attention:
            self._mark(slot)
            self._decide_at(now)

    def _take(self, slot: Slot, verdict: Verdict, now: float) -> bool:
        """The node's layers from a new verdict, each ``since`` moved only where its status
        changed; True when any layer reads differently."""
        old = self.layers[slot.index]
        new: dict[str, LayerReport] = {}
        changed = False
        for name, report in verdict.layers.items():
            previous = old[name]
            if previous.status == report.status:
                since = previous.since
            else:
                since, changed = now, True
            new[name] = dataclasses.replace(report, since=since)
            changed = changed or new[name] != previous
        self.layers[slot.index] = new
        self.verdicts[slot.index] = verdict
        return changed

    def action_done(self, slot: Slot, what: str, succeeded: bool) -> None:
        engine = self.engine
        if self.in_job is not None:
            self.in_job.repaired(slot)
        episode = self.reconciler.episodes.get(slot.name)
        if episode is not None and episode.phase is Phase.ACTING and episode.rung is not None:
            result = ActionResult(episode.attempt, episode.rung, succeeded, engine.now)
            self.reconciler.take_result(slot.name, episode.opened_at, result)
        # After a reset or a boot the agent runs every check and reports at once.
        engine.at(engine.now + 1.0, self.signals_changed, slot)
        self._decide_at(engine.now)

    def node_replaced(self, slot: Slot) -> None:
        now = self.engine.now
        self.by_name[slot.name] = slot.index
        verdict = self.engine.view.verdict(self.engine.signals(slot))
        self.layers[slot.index] = {
            name: dataclasses.replace(layer, since=now) for name, layer in verdict.layers.items()
        }
        self.verdicts[slot.index] = verdict
        self.reported[slot.index] = now
        self.ours.discard(slot.index)
        self.deep.node_replaced(slot)
        self._mark(slot)
        self._decide_at(now)

    def _mark(self, slot: Slot) -> None:
        self.reconciler.attend(slot.name, self._observation(slot, self.engine.now))

    # -- one controller pass ----------------------------------------------------------

    def _decide_at(self, t: float) -> None:
        if t not in self.pending:
            self.pending.add(t)
            self.engine.at(t, self._decide, t)

    def _decide(self, t: float) -> None:
        self.pending.discard(t)
        engine = self.engine
        now = engine.now
        engine.stats.decide_calls += 1
        observations = self._observe(now)
        was_open = self.reconciler.breaker.open
        done = self.reconciler.reconcile(observations, now, self)
        if done.plan.breaker.open and not was_open:
            engine.stats.breaker_trips += 1
        # Only a decision changes what the attention set reads (taint, cordon, verify
        # request); the other nodes' standing is as their last report left it.
        for name in observations.keys() & {d.node for d in done.plan.decisions}:
            self._mark(engine.slots[self.by_name[name]])
        if done.deadline < math.inf:
            self._decide_at(done.deadline)

    def _observe(self, now: float) -> dict[str, NodeObservation]:
        slots = self.engine.slots
        observations = {}
        for name in self.reconciler.wanted():
            index = self.by_name.get(name)
            if index is None:
                continue
            slot = slots[index]
            if slot.machine is None or slot.name != name:
                self.reconciler.attend(name, None)  # the Node is gone, for good
                continue
            observations[name] = self._observation(slot, now)
        return observations

    def _observation(self, slot: Slot, now: float) -> NodeObservation:
        index = slot.index
        episode = self.reconciler.episodes.get(slot.name)
        draining = episode is not None and episode.phase is Phase.DRAINING
        # A job on the GPUs a device taint left is not on the episode's GPUs.
        busy = slot.job is not None and not (self.gpus is not None and self.gpus.spares_job(slot))
        moving = int(draining and (busy or slot.drain_until > now))
        # Everything the projection reads: the same again gives the same object, which
        # the policy core then knows unchanged without comparing it field by field. The
        # cache is the slot's, and so is the position (the same for every machine in it).
        inputs = (
            slot.name,
            self.layers[index],
            self.reported.get(index),
            slot.tainted or bool(slot.gpus_out),  # a device taint is the reconciler's too
            slot.cordoned,
            index in self.ours,
            moving,
            busy,
            self.deep.requests.get(index),
            self.deep.answers.get(index),
            self.attribution.layer(slot, now),
        )
        known = self.observed.get(index)
        if known is not None and known[0] == inputs:
            return known[1]
        name, layers, reported, tainted, cordoned, ours, _, busy, request, answer, crash = inputs
        if crash is not None:
            layers = {**layers, crash[0]: crash[1]}
        observation = NodeObservation(
            name=name,
            pool=slot.pool,
            layers=layers,
            reported_at=reported,
            tainted=tainted,
            unschedulable=cordoned,
            cordoned_by_us=ours,
            pods_to_move=moving,
            # A deferred repair waits for the node's job (one per node in the simulator).
            pods_on_gpus=int(busy),
            verify_request=request,
            verify=answer,
            domain=self.domains[index],
            position=self.positions[index],
        )
        self.observed[index] = (inputs, observation)
        return observation

    def _layers(self, slot: Slot) -> dict[str, LayerReport]:
        """The node's layers as the reconciler read them (crash memory's included)."""
        return dict(self._observation(slot, self.engine.now).layers)

    def apply(self, plan: Plan, opened: Collection[str]) -> set[str]:
        """The simulated cluster as the reconciler's actuator: nothing fails here."""
        engine = self.engine
        for name in sorted(opened):
            engine.request_human(engine.slots[self.by_name[name]])  # on the fleet's board
        self._apply(plan)
        return set()

    def _apply(self, plan: Plan) -> None:
        engine = self.engine
        now = engine.now
        for decision in plan.decisions:
            index = self.by_name.get(decision.node)
            if index is None:
                continue
            slot = engine.slots[index]
            if slot.name != decision.node or slot.machine is None:
                continue
            kind = decision.kind
            if self.gpus is not None and self.gpus.apply(kind, slot, self._layers(slot)):
                continue
            episode = plan.episodes.get(decision.node)
            opened = episode.opened_at if episode is not None else now
            if kind is K.TAINT or kind is K.UNTAINT:
                engine.set_flags(slot, tainted=kind is K.TAINT)
            elif kind is K.CORDON:
                self.ours.add(index)
                engine.set_flags(slot, cordoned=True)
            elif kind is K.UNCORDON:
                self.ours.discard(index)
                engine.set_flags(slot, cordoned=False)
            elif kind is K.KILL_PODS:
                if self._first(decision.node, opened, "kill_job", decision.attempt):
                    engine.stats.actions["kill_job"] += 1
                engine.interrupt_job(slot, cause="platform")
            elif kind is K.EVICT_PODS:
                rung = episode.rung if episode is not None else None
                attempt = episode.attempt if episode is not None else 0
                if self._first(decision.node, opened, f"drain {rung}", attempt):
                    engine.stats.actions["drain"] += 1
                    self._count_false_drain(slot, opened)
                if slot.job is not None:
                    engine.interrupt_job(slot, cause="platform")
                    slot.drain_until = now + engine.scenario.actions.drain_min * 60.0
                    self._decide_at(slot.drain_until)
            elif kind is K.REQUEST_ACTION:
                what = "reset" if decision.action is Action.RESET_GPU else "reboot"
                if self._first(decision.node, opened, what, decision.attempt) and not slot.down:
                    self._count_false_drain(slot, opened)
                    gpus = tuple(GPU_INDEX[g] for g in decision.gpus if g in GPU_INDEX)
                    self._repair(slot, what, gpus)
            elif kind is K.REQUEST_VERIFY and decision.request is not None:
                self.deep.request_verify(slot, decision.request)
            elif kind is K.CLEAR_VERIFY:
                self.deep.clear_verify(slot)
            elif kind is K.REPLACE and self._first(
                decision.node, opened, "replace", decision.attempt
            ):
                self._count_false_drain(slot, opened)
                self.attribution.forget(slot.name)
                engine.replace(slot)

    def _repair(self, slot: Slot, what: str, gpus: tuple[int, ...]) -> None:
        if self.gpus is not None:
            self.gpus.repair(slot, what, gpus)
        else:
            self.engine.repair(slot, what, gpus=gpus)

    def _first(self, node: str, opened: float, what: str, attempt: int) -> bool:
        key = (node, opened, what, attempt)
        if key in self.started:
            return False
        self.started.add(key)
        return True

    def _count_false_drain(self, slot: Slot, opened: float) -> None:
        key = (slot.name, opened)
        if key not in self.false_counted:
            self.false_counted.add(key)
            if not self.engine.has_node_fault(slot):
                self.engine.stats.false_drains += 1
