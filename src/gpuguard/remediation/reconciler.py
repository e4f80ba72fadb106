"""The state around ``decide``: one copy for the controller, the simulator and the tests.

``decide`` is pure; calling it again and again needs memory: the open episodes, the
closed ones the policy still reads (lemons, the breaker's window), the breaker, the nodes
that can need a decision (the attention set), the fleet's size per pool, and the answers
to requested actions that arrived since the last pass. ``Reconciler`` keeps that memory,
hands each plan to an ``Actuator`` (the Kubernetes applier, the simulated cluster) and
says when the next decision can change without any new observation (``Pass.deadline``),
so its driver sleeps until then instead of polling.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from gpuguard.contract.conditions import TRUE
from gpuguard.remediation.budget import holds_slot
from gpuguard.remediation.decide import decide
from gpuguard.remediation.history import History
from gpuguard.remediation.model import (
    ActionResult,
    BreakerState,
    Decision,
    DecisionKind,
    Episode,
    NodeObservation,
    Phase,
    Plan,
    Settled,
)
from gpuguard.remediation.policy import Policy
from gpuguard.remediation.timers import next_timer, node_timers

# A repair slot freed while others were turned away: decide again right after.
SLOT_FREED_S = 1e-3


class Actuator(Protocol):
    """Carries out a plan's decisions; returns the nodes where something failed (their
    remaining decisions wait for the next pass, and the episodes are read again)."""

    def apply(self, plan: Plan, opened: Collection[str]) -> set[str]: ...


@dataclass(frozen=True)
class Pass:
    """One reconcile: the plan, the episodes it opened, where applying it failed, and the
    earliest time a decision can change with nothing new observed (``math.inf``: never)."""

    plan: Plan
    opened: frozenset[str]
    failed: frozenset[str]
    deadline: float


@dataclass(frozen=True, eq=False)
class _Timers:
    node: NodeObservation
    episode: Episode
    policy: Policy
    times: list[float]


def needs_attention(observed: NodeObservation) -> bool:
    """Not plainly healthy, or carrying our taint, cordon, verify request, or a position mark."""
    return (
        observed.tainted
        or observed.cordoned_by_us
        or observed.verify_request is not None
        or bool(observed.position_fixed)
        or any(layer.status != TRUE for layer in observed.layers.values())
    )


class Reconciler:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.episodes: dict[str, Episode] = {}  # open, by node
        self.history = History()  # closed, trimmed to what the policy still reads
        self.breaker = BreakerState()
        self.attention: set[str] = set()
        self.population: Counter[str] = Counter()  # nodes per pool
        self.stale = True  # the episodes must be (re)loaded before the next pass
        # Nodes whose stored episode cannot be read, and why: no decision but quarantine.
        self.held: dict[str, str] = {}
        self._pools: dict[str, str] = {}
        self._results: dict[tuple[str, float], ActionResult] = {}  # by episode
        self._settled: dict[str, Settled] = {}  # the last plan's (decide skips them)
        # Each watched node's timers, sorted, with the node, episode and policy they are of.
        self._timers: dict[str, _Timers] = {}
        # When this replica first saw each stamp an episode's clocks run from (a phase's
        # start, its last action), on the clock ``reconcile`` is given: another replica's
        # stamps are on its clock, which may be hours off this one's.
        self._first_seen: dict[tuple[str, float, str, float], float] = {}

    # --- what the driver tells it -------------------------------------------------
    def load(
        self,
        episodes: Mapping[str, Episode],
        closed: Iterable[Episode],
        breaker: BreakerState,
        *,
        held: Mapping[str, str] | None = None,
    ) -> None:
        """Start from what the cluster holds (a new leader, or after a failed write).

        ``held``: nodes whose episode is stored but unreadable. Treating it as absent would
        start the ladder over (a second reboot); such a node gets no decision but our
        taint while it is unhealthy, until its object is mended or deleted."""
        self.held = dict(held or {})
        self.episodes = {n: e for n, e in episodes.items() if n not in self.held}
        self.history = History(closed)
        self.breaker = breaker
        self._settled = {}
        self.stale = False

    def track(self, name: str, observed: NodeObservation | None) -> bool:
        """A node's latest projection (``None``: the Node is gone), for the attention set
        and the population that sizes budgets and the breaker; True when it needs
        attention."""
        old = self._pools.pop(name, None)
        if old is not None:
            self.population[old] -= 1
        if observed is not None:
            self._pools[name] = observed.pool
            self.population[observed.pool] += 1
        return self.attend(name, observed)

    def attend(self, name: str, observed: NodeObservation | None) -> bool:
        """Keep ``name`` in the attention set while its projection needs a decision."""
        if observed is not None and needs_attention(observed):
            self.attention.add(name)
            return True
        self.attention.discard(name)
        return False

    def forget_nodes(self) -> None:
        """Every node is about to be tracked again (a fresh list of the fleet)."""
        self._pools.clear()
        self.population.clear()
        self.attention.clear()

    def wanted(self) -> set[str]:
        """The nodes a pass must see: those needing attention and those with an episode."""
        return self.attention | self.episodes.keys() | self.held.keys()

    def take_result(self, node: str, opened_at: float, result: ActionResult) -> bool:
        """The agent's (or provider's) answer to a requested action of the episode of
        ``node`` opened at ``opened_at``; True when it is news."""
        known = self._results.get((node, opened_at))
        self._results[node, opened_at] = result
        return known != result

    # --- one pass -------------------------------------------------------------------
    def reconcile(
        self,
        observations: Mapping[str, NodeObservation],
        now: float,
        actuator: Actuator,
        *,
        breaker_reset: bool = False,
        population: Mapping[str, int] | None = None,
    ) -> Pass:
        """``population``: a snapshot of the nodes per pool, for a driver whose node
        watch tracks nodes on another thread; by default the tracked population."""
        before = {name: self._localised(e, now) for name, e in self._with_results().items()}
        if population is None:
            population = {pool: count for pool, count in self.population.items() if count}
        held = {n: o for n, o in observations.items() if n in self.held}
        observations = {n: o for n, o in observations.items() if n not in self.held}
        plan = decide(
            observations,
            before,
            self.history,
            self.breaker,
            self.policy,
            now,
            breaker_reset=breaker_reset,
            population=population,
            settled=self._settled,
        )
        plan.decisions[:0] = [
            Decision(DecisionKind.TAINT, name, f"held: {self.held[name]}")
            for name, node in held.items()
            if not node.tainted and any(layer.status != TRUE for layer in node.layers.values())
        ]
        opened = frozenset(plan.episodes.keys() - before.keys())
        failed = frozenset(actuator.apply(plan, opened))
        self._remember(plan, failed, now)
        deadline = self.next_deadline(observations, plan, now)
        holders = {n for n, e in before.items() if holds_slot(e)}
        freed = holders - {n for n, e in self.episodes.items() if holds_slot(e)}
        if freed and any(" waits: budget" in note for note in plan.notes):
            deadline = min(deadline, now + SLOT_FREED_S)
        return Pass(plan, opened, failed, deadline)

    def next_deadline(
        self, observations: Mapping[str, NodeObservation], plan: Plan, now: float
    ) -> float:
        """The next time one of the policy's own clocks can change a decision: a node's
        timers (``timers.node_timers``) or the breaker's window."""
        soonest = math.inf
        kept = self._timers
        self._timers = {}
        for name, node in observations.items():
            episode = self.episodes.get(name)
            if episode is None:  # its tolerances count from now
                soonest = min(soonest, next_timer(self.policy, node, None, now))
                continue
            timers = self._timers_of(name, node, episode, now, kept.get(name))
            later = bisect.bisect_right(timers, now)
            if later < len(timers):
                soonest = min(soonest, timers[later])
        if plan.breaker.open:  # it closes as the wave leaves its window
            window = self.policy.breaker.window_s
            starts = [e.opened_at + window for e in [*self.episodes.values(), *self.history]]
            soonest = min([soonest, *(t for t in starts if t > now)])
        return soonest

    def _timers_of(
        self, name: str, node: NodeObservation, episode: Episode, now: float, known: _Timers | None
    ) -> list[float]:
        """The node's timers, sorted; those of the last pass when node, episode and policy
        are the very same objects."""
        policy = self.policy
        if known is None or (known.node, known.episode, known.policy) != (node, episode, policy):
            known = _Timers(node, episode, policy, sorted(node_timers(policy, node, episode, now)))
        self._timers[name] = known
        return known.times

    def _localised(self, episode: Episode, now: float) -> Episode:
        """The episode with its phase's start and its last action counted from when this
        replica first saw them, on its own clock: a new leader whose clock runs ahead of
        the one that stamped them sees a whole timeout (and the minimum action interval)
        from the moment it took over, never an hour already gone, and one whose clock runs
        behind does not wait an hour more. The leader that stamped them sees them at once,
        so for it nothing changes."""
        phase_since = self._seen(episode, "phase", episode.phase_since, now)
        last = episode.last_action_at
        last_action_at = None if last is None else self._seen(episode, "action", last, now)
        if (phase_since, last_action_at) == (episode.phase_since, last):
            return episode
        return dataclasses.replace(episode, phase_since=phase_since, last_action_at=last_action_at)

    def _seen(self, episode: Episode, what: str, stamp: float, now: float) -> float:
        key = (episode.node, episode.opened_at, what, stamp)
        return self._first_seen.setdefault(key, now)

    def _with_results(self) -> dict[str, Episode]:
        """Episodes waiting for an answer get the one that answers their rung and attempt."""
        episodes = dict(self.episodes)
        for name, episode in self.episodes.items():
            result = self._results.get((name, episode.opened_at))
            if (
                result is not None
                and episode.phase is Phase.ACTING
                and episode.action_result is None
                and (result.attempt, result.action) == (episode.attempt, episode.rung)
            ):
                episodes[name] = dataclasses.replace(episode, action_result=result)
        return episodes

    def _remember(self, plan: Plan, failed: Collection[str], now: float) -> None:
        self.breaker = plan.breaker
        if failed:
            self.stale = True  # what the cluster holds is now the truth
            self._settled = {}
            return
        self._settled = plan.settled
        closed = [e for e in plan.episodes.values() if e.phase is Phase.CLOSED]
        self.episodes = {n: e for n, e in plan.episodes.items() if e.phase is not Phase.CLOSED}
        for episode in self.episodes.values():  # this replica's own stamps: seen as made
            for what, stamp in (("phase", episode.phase_since), ("action", episode.last_action_at)):
                if stamp is not None:
                    self._seen(episode, what, stamp, min(stamp, now))
        live = {(e.node, e.opened_at) for e in self.episodes.values()}
        self._first_seen = {k: t for k, t in self._first_seen.items() if k[:2] in live}
        for episode in closed:
            self._results.pop((episode.node, episode.opened_at), None)
        self.history.add(closed)
        self.history.forget_before(now - self.policy.history_s)
