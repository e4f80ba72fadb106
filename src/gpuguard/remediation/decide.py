"""``decide``: one pass of the remediation policy over the fleet (docs/remediation.md).

Pure: observations, episodes and the time in; a ``Plan`` out; inputs are never mutated.
Every change to an episode is written ahead (a RECORD decision, then the actions it leads
to), and every action is idempotent per attempt, so a controller that crashes anywhere
continues from the last recorded phase by simply calling ``decide`` again. Nodes are
visited in sorted order, so the same input always gives the same plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuguard.remediation.breaker import next_breaker
from gpuguard.remediation.correlation import SharedCauses, shared_causes
from gpuguard.remediation.health import is_healthy, opens_episode, repairable
from gpuguard.remediation.history import History
from gpuguard.remediation.lifecycle import PlanBuilder
from gpuguard.remediation.model import (
    BreakerState,
    Episode,
    NodeObservation,
    Phase,
    Plan,
    Settled,
)
from gpuguard.remediation.policy import Policy
from gpuguard.remediation.timers import next_timer

# A timer this close to now may compare either way in floating point.
TIMER_SLACK_S = 1e-3


def decide(
    nodes: Mapping[str, NodeObservation],
    episodes: Mapping[str, Episode],
    history: Sequence[Episode],
    breaker: BreakerState,
    policy: Policy,
    now: float,
    *,
    breaker_reset: bool = False,
    population: Mapping[str, int] | None = None,
    settled: Mapping[str, Settled] | None = None,
) -> Plan:
    """Decide what to do now.

    ``episodes``: the open episodes by node; ``history``: closed ones (lemons, breaker),
    a plain sequence or, faster for a caller that keeps it across calls, a ``History``.
    The plan's episodes are every open or just-closed episode, by node.

    ``population`` (nodes per pool) lets a caller pass only the nodes that can need a
    decision (not healthy, or carrying our taint or cordon, or with an episode) and still
    size budgets and the breaker by the whole fleet; by default ``nodes`` is the fleet.

    ``settled``: the previous plan's ``settled``. An episode found there with the same
    observation and shared cause, before its ``until``, is held or left again without
    being advanced (a rack's held nodes, or nodes waiting out a tolerance, would otherwise
    be advanced on every call anywhere in the fleet); the plan carries that very episode
    object, not a copy.
    """
    shared = shared_causes(nodes, policy.correlation)
    run = PlanBuilder(nodes, episodes, history, breaker, policy, now, population, shared)
    work, kept = _working_set(nodes, episodes, settled, shared, policy, now)
    # 1. Quarantine every newly unhealthy node: taints are never limited or paused.
    opened_now = _quarantine(run, nodes, work)
    # 2. The breaker counts the episodes just opened: a storm is stopped in its first call.
    opened = [e.opened_at for e in work.values()] + _opened_in_window(history, policy, now)
    run.breaker, breaker_notes = next_breaker(
        breaker,
        opened,
        sum(population.values()) if population is not None else len(nodes),
        policy.breaker,
        now,
        reset=breaker_reset,
    )
    run.notes.extend(breaker_notes)
    # 3. Advance every open episode, in node order (budget slots go in that order).
    _advance(run, nodes, work, kept, opened_now)
    decisions = [d for name in sorted(run.decisions) for d in run.decisions[name]]
    return Plan(decisions, dict(sorted(work.items())), run.breaker, run.notes, kept)


def _working_set(
    nodes: Mapping[str, NodeObservation],
    episodes: Mapping[str, Episode],
    settled: Mapping[str, Settled] | None,
    shared: SharedCauses,
    policy: Policy,
    now: float,
) -> tuple[dict[str, Episode], dict[str, Settled]]:
    """The open episodes this call works on (copies), and those still settled as the
    previous plan left them (the very objects, not advanced)."""
    kept: dict[str, Settled] = {}
    work: dict[str, Episode] = {}
    for name, episode in sorted(episodes.items()):
        if episode.phase is Phase.CLOSED:
            continue
        last = settled.get(name) if settled else None
        if (
            last is not None
            and last.episode is episode
            and now < last.until
            and last.policy is policy
            and last.node == nodes.get(name)
            and last.shared == shared.get(name, {})
        ):
            kept[name] = last
            work[name] = episode
        else:
            work[name] = _copy(episode)
    return work, kept


def _quarantine(
    run: PlanBuilder, nodes: Mapping[str, NodeObservation], work: dict[str, Episode]
) -> set[str]:
    """Open an episode for every newly unhealthy node, clear what a healthy one kept of
    ours; the nodes whose episode opened now."""
    opened_now: set[str] = set()
    for name in sorted(nodes):
        node = nodes[name]
        if name in work or not repairable(node):
            continue
        if opens_episode(node, run.policy, run.now) or node.quarantined_for:
            work[name] = run.open(node)
            opened_now.add(name)
        elif is_healthy(node, run.policy, run.now):
            run.clear_leftovers(node)
    return opened_now


def _advance(
    run: PlanBuilder,
    nodes: Mapping[str, NodeObservation],
    work: Mapping[str, Episode],
    kept: dict[str, Settled],
    opened_now: set[str],
) -> None:
    """Advance every open episode not settled, and keep as settled each one it left
    held or untouched."""
    policy, now = run.policy, run.now
    for name, episode in sorted(work.items()):
        observed = nodes.get(name)
        if name in kept:
            if kept[name].note:
                run.note(name, kept[name].note)
            continue
        steps, notes = len(episode.steps), len(run.notes)
        run.advance(episode, observed, restore_taint=name not in opened_now)
        if observed is None or name in run.decisions:
            continue
        shared = run.shared.get(name, {})
        if name in run.held:
            kept[name] = Settled(episode, observed, shared, policy, run.held[name])
        elif len(episode.steps) == steps and len(run.notes) == notes:
            # Left untouched: only one of its own timers can change that (see ``Settled``),
            # the next one, or one due now that read the other way in floating point.
            until = next_timer(policy, observed, episode, now - TIMER_SLACK_S) - TIMER_SLACK_S
            if until > now:
                kept[name] = Settled(episode, observed, shared, policy, "", until)


def _opened_in_window(history: Sequence[Episode], policy: Policy, now: float) -> list[float]:
    """The history's opening times the breaker may count (it filters them exactly)."""
    if isinstance(history, History):
        # A second of slack: the breaker's own test decides at the window's edge.
        return history.opened_from(now - policy.breaker.window_s - 1.0)
    return [e.opened_at for e in history]


def _copy(episode: Episode) -> Episode:
    # Through __init__ with every field, at half the cost of dataclasses.replace (each
    # open episode is copied on every pass).
    fields = vars(episode) | {"attempts": dict(episode.attempts), "steps": list(episode.steps)}
    return Episode(**fields)
