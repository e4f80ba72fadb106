"""The gpuguard run: the controller's real policy core (``remediation.decide``) in
simulated time.

This plays the controller and the agent around ``decide``, as ``controller/loop.py`` does
against a cluster: the agent's verdicts (``agent_view``) become the Node projections, only
nodes that can need a decision are passed (with the fleet's population for budgets and
the breaker), the plan's decisions are carried out by the engine, episodes and the trimmed
history are kept for the next call. ``decide`` is called whenever a node's report changes
or an action ends, and again when one of the policy's own clocks (tolerance, flap damping,
timeouts, minimum action interval) next runs out.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

from gpuguard.contract.report import LayerReport
from gpuguard.model import Action
from gpuguard.remediation.budget import holds_slot
from gpuguard.remediation.decide import decide
from gpuguard.remediation.history import History
from gpuguard.remediation.model import (
    ActionResult,
    BreakerState,
    DecisionKind,
    Episode,
    NodeObservation,
    Phase,
    Plan,
)
from gpuguard.remediation.policy import Policy
from gpuguard.sim.deep_suite import DeepSuite
from gpuguard.sim.engine import Engine, Slot
from gpuguard.sim.faults import GPU_BUS

K = DecisionKind
_GPU_INDEX = {f"0000:{bus}:00.0": index for index, bus in enumerate(GPU_BUS)}


class GpuguardPolicy:
    name = "gpuguard"
    job_aware = True  # DisruptionTarget + podFailurePolicy: our kills cost no retry

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def attach(self, engine: Engine) -> None:
        self.engine = engine
        self.episodes: dict[str, Episode] = {}
        self.history = History()
        self.breaker = BreakerState()
        healthy = engine.view.verdict(engine.signals(engine.slots[0])).layers
        self.layers = {slot.index: dict(healthy) for slot in engine.slots}
        self.reported: dict[int, float] = {}
        self.attention: set[int] = set()
        self.by_name = {slot.name: slot.index for slot in engine.slots}
        self.ours: set[int] = set()  # cordoned by us
        self.results: dict[str, ActionResult] = {}
        self.started: set[tuple[str, float, str, int]] = set()  # (node, episode, what, attempt)
        self.false_counted: set[tuple[str, float]] = set()
        self.population = dict(Counter(slot.pool for slot in engine.slots))
        self.pending: set[float] = set()
        self.deep = DeepSuite(engine, self.signals_changed)

    # -- what the agent reports -------------------------------------------------------

    def signals_changed(self, slot: Slot) -> None:
        engine = self.engine
        now = engine.now
        verdict = engine.view.verdict(engine.signals(slot))
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
        self.reported[slot.index] = now
        if not verdict.healthy:
            engine.detected(slot)
        if changed or slot.index in self.attention:
            self._mark(slot)
            self._decide_at(now)

    def action_done(self, slot: Slot, what: str, succeeded: bool) -> None:
        engine = self.engine
        episode = self.episodes.get(slot.name)
        if episode is not None and episode.phase is Phase.ACTING and episode.rung is not None:
            self.results[slot.name] = ActionResult(
                episode.attempt, episode.rung, succeeded, engine.now
            )
        # After a reset or a boot the agent runs every check and reports at once.
        engine.at(engine.now + 1.0, self.signals_changed, slot)
        self._decide_at(engine.now)

    def node_replaced(self, slot: Slot) -> None:
        now = self.engine.now
        self.by_name[slot.name] = slot.index
        self.layers[slot.index] = {
            name: dataclasses.replace(layer, since=now)
            for name, layer in self.engine.view.verdict(self.engine.signals(slot)).layers.items()
        }
        self.reported[slot.index] = now
        self.ours.discard(slot.index)
        self.deep.node_replaced(slot)
        self._mark(slot)
        self._decide_at(now)

    def _mark(self, slot: Slot) -> None:
        needs = (
            slot.tainted
            or slot.index in self.ours
            or slot.name in self.episodes
            or any(layer.status != "True" for layer in self.layers[slot.index].values())
        )
        if needs:
            self.attention.add(slot.index)
        else:
            self.attention.discard(slot.index)

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
        episodes = self._with_results()
        plan = decide(
            observations,
            episodes,
            self.history,
            self.breaker,
            self.policy,
            now,
            population=self.population,
        )
        for name in plan.episodes.keys() - episodes.keys():
            engine.request_human(engine.slots[self.by_name[name]])  # on the fleet's board
        self._apply(plan)
        self._remember(plan, now)
        for name in observations:
            self._mark(engine.slots[self.by_name[name]])
        holders = {n for n, e in episodes.items() if holds_slot(e)}
        freed = holders - {n for n, e in self.episodes.items() if holds_slot(e)}
        if freed and any(" waits: budget" in note for note in plan.notes):
            self._decide_at(now + 1e-3)  # a repair slot came free after others were turned away
        deadline = self._next_deadline(observations, plan, now)
        if deadline < math.inf:
            self._decide_at(deadline)

    def _observe(self, now: float) -> dict[str, NodeObservation]:
        slots = self.engine.slots
        names = {slots[index].name for index in self.attention} | self.episodes.keys()
        observations = {}
        for name in names:
            index = self.by_name.get(name)
            if index is None:
                continue
            slot = slots[index]
            if slot.machine is None or slot.name != name:
                continue  # the Node is gone
            episode = self.episodes.get(name)
            draining = episode is not None and episode.phase is Phase.DRAINING
            moving = int(draining and (slot.job is not None or slot.drain_until > now))
            # A deferred repair waits for the node's job (one per node in the simulator).
            running = int(slot.job is not None)
            observations[name] = NodeObservation(
                name=name,
                pool=slot.pool,
                layers=self.layers[index],
                reported_at=self.reported.get(index),
                tainted=slot.tainted,
                unschedulable=slot.cordoned,
                cordoned_by_us=index in self.ours,
                pods_to_move=moving,
                pods_on_gpus=running,
                verify_request=self.deep.requests.get(index),
                verify=self.deep.answers.get(index),
                domain=f"rack-{index // self.engine.scenario.fleet.nodes_per_rack}",
            )
        return observations

    def _with_results(self) -> dict[str, Episode]:
        """Episodes waiting for the agent get its answer (the controller's refresh)."""
        episodes = dict(self.episodes)
        for name, episode in self.episodes.items():
            result = self.results.get(name)
            if (
                result is not None
                and episode.phase is Phase.ACTING
                and episode.action_result is None
                and (result.attempt, result.action) == (episode.attempt, episode.rung)
            ):
                episodes[name] = dataclasses.replace(episode, action_result=result)
        return episodes

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
                    gpus = tuple(_GPU_INDEX[g] for g in decision.gpus if g in _GPU_INDEX)
                    engine.repair(slot, what, gpus=gpus)
            elif kind is K.REQUEST_VERIFY and decision.request is not None:
                self.deep.request_verify(slot, decision.request)
            elif kind is K.CLEAR_VERIFY:
                self.deep.clear_verify(slot)
            elif kind is K.REPLACE and self._first(
                decision.node, opened, "replace", decision.attempt
            ):
                self._count_false_drain(slot, opened)
                engine.replace(slot)

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

    def _remember(self, plan: Plan, now: float) -> None:
        closed = [e for e in plan.episodes.values() if e.phase is Phase.CLOSED]
        self.episodes = {n: e for n, e in plan.episodes.items() if e.phase is not Phase.CLOSED}
        for episode in closed:
            self.results.pop(episode.node, None)
        horizon = now - self.policy.history_s
        self.history.add(closed)
        self.history.forget_before(horizon)
        if plan.breaker.open and not self.breaker.open:
            self.engine.stats.breaker_trips += 1
        self.breaker = plan.breaker

    def _next_deadline(
        self, observations: dict[str, NodeObservation], plan: Plan, now: float
    ) -> float:
        """The next time one of the policy's clocks can change a decision."""
        policy = self.policy
        candidates: list[float] = []
        for name, node in observations.items():
            episode = self.episodes.get(name)
            opened = episode.opened_at if episode is not None else now
            for layer in node.layers.values():
                if layer.status == "True":
                    candidates.append(layer.since + policy.clear_after_s)
                else:
                    tolerance = policy.tolerance_for(layer.codes)
                    candidates.append(layer.since + policy.unknown_grace_s)
                    candidates.append(max(layer.since, opened) + tolerance)
                    if layer.deferred:
                        wait = policy.drain_and_reset.max_wait_s
                        candidates.append(max(layer.since, opened) + wait)
            if episode is None:
                continue
            timeout = {
                Phase.DRAINING: policy.drain_timeout_s,
                Phase.ACTING: policy.action_timeout_s,
                Phase.VERIFYING: policy.verify_timeout_s,
            }.get(episode.phase)
            if timeout is not None:
                candidates.append(episode.phase_since + timeout + 1e-6)
            if episode.phase is Phase.VERIFYING and policy.verify.applies_to(episode.rung):
                candidates.append(episode.phase_since + policy.verify.timeout_s + 1e-6)
            if episode.last_action_at is not None:
                candidates.append(episode.last_action_at + policy.min_action_interval_s)
        if plan.breaker.open:  # it closes as the wave leaves its window
            window = policy.breaker.window_s
            starts = [e.opened_at for e in [*self.episodes.values(), *self.history]]
            candidates += [t + window for t in starts]
        return min((c for c in candidates if c > now), default=math.inf)
