"""Writing one ``decide`` call's plan: decisions by node and notes, each step of an
episode written ahead of the actions it leads to; opening and closing episodes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from gpuguard.contract.remediation import MAX_MESSAGE
from gpuguard.contract.wire import cut
from gpuguard.model import Action
from gpuguard.remediation.budget import BudgetLedger
from gpuguard.remediation.correlation import SharedCauses
from gpuguard.remediation.health import describe
from gpuguard.remediation.model import (
    BreakerState,
    Decision,
    DecisionKind,
    Episode,
    NodeObservation,
    Phase,
    Resolution,
    Step,
)
from gpuguard.remediation.policy import Policy
from gpuguard.remediation.positions import position_of

Kind = DecisionKind


def attempt_label(episode: Episode) -> str:
    """How steps and decisions name the episode's current attempt."""
    return f"{episode.rung} attempt {episode.attempt}"


class PlanWriter:
    """The state of one ``decide`` call: decisions by node, notes, breaker, budget."""

    def __init__(
        self,
        nodes: Mapping[str, NodeObservation],
        episodes: Mapping[str, Episode],
        history: Sequence[Episode],
        breaker: BreakerState,
        policy: Policy,
        now: float,
        population: Mapping[str, int] | None = None,
        shared: SharedCauses | None = None,
    ) -> None:
        self.history = history
        self.shared = shared or {}  # the layers of each node whose fault has a shared cause
        self.breaker = breaker  # replaced by this call's breaker before any episode advances
        self.policy = policy
        self.now = now
        self.ledger = BudgetLedger(nodes, episodes, policy.budget, population)
        self.decisions: dict[str, list[Decision]] = defaultdict(list)
        self.notes: list[str] = []
        self.held: dict[str, str] = {}  # nodes held with no new step: the hold's note

    # -- writing ---------------------------------------------------------------------

    def emit(
        self,
        kind: DecisionKind,
        node: str,
        reason: str,
        *,
        action: Action | None = None,
        gpus: tuple[str, ...] = (),
        attempt: int = 0,
        request: str | None = None,
    ) -> None:
        self.decisions[node].append(Decision(kind, node, reason, action, gpus, attempt, request))

    def record(self, episode: Episode, message: str, phase: Phase | None = None) -> None:
        """Enter ``phase`` (its clock restarts), add a step, write it ahead of its actions."""
        if phase is not None:
            episode.phase = phase
            episode.phase_since = self.now
        # Cut as the NodeRemediation stores it, so a step read back compares equal.
        episode.steps.append(Step(self.now, episode.phase, cut(message, MAX_MESSAGE)))
        self.emit(Kind.RECORD, episode.node, message)
        self.ledger.update(episode.node, episode)

    def note(self, node: str, message: str) -> None:
        self.notes.append(f"{node}: {message}")

    # -- opening and closing -----------------------------------------------------------

    def open(self, node: NodeObservation) -> Episode:
        episode = Episode(
            node=node.name,
            opened_at=self.now,
            phase_since=self.now,
            node_uid=node.uid,
            position=position_of(node),
        )
        self.record(episode, f"quarantined: {describe(node)}")
        if not node.tainted:
            self.emit(Kind.TAINT, node.name, f"unhealthy: {describe(node)}")
        return episode

    def clear_leftovers(self, node: NodeObservation) -> None:
        """A healthy node with no episode keeps nothing of ours (a close cut short)."""
        if node.tainted:
            self.emit(Kind.UNTAINT, node.name, "healthy, no open episode: leftover taint")
        if node.cordoned_by_us:
            self.emit(Kind.UNCORDON, node.name, "healthy, no open episode: leftover cordon")
        if node.verify_request is not None:
            self.emit(Kind.CLEAR_VERIFY, node.name, "no open episode: leftover verify request")
        if node.position_fixed:
            self.emit(Kind.CLEAR_POSITION_FIXED, node.name, "no position fault held here")

    def take_position_mark(self, episode: Episode, node: NodeObservation) -> None:
        """A person marked the node's position fixed: what happened there before no longer
        counts (the mark is taken off, so it applies once)."""
        mark = f"position {episode.position} marked fixed ({node.position_fixed!r})"
        if episode.position_fault:
            episode.position_fault = ""
            episode.position_fixed_at = self.now
            self.record(episode, f"{mark}: its history no longer counts")
            self.emit(Kind.CLEAR_POSITION_FIXED, node.name, mark)
        else:
            self.emit(Kind.CLEAR_POSITION_FIXED, node.name, f"{mark}: no position fault held")

    def close(
        self, episode: Episode, resolution: Resolution, why: str, node: NodeObservation | None
    ) -> None:
        episode.closed_at = self.now
        episode.resolution = resolution
        self.record(episode, f"closed {resolution}: {why}", Phase.CLOSED)
        if node is None:
            return
        self.emit(Kind.UNTAINT, node.name, f"{resolution}: {why}")
        if episode.cordoned_by_us or node.cordoned_by_us:
            self.emit(Kind.UNCORDON, node.name, f"{resolution}: {why}")
        if node.verify_request is not None:
            self.emit(Kind.CLEAR_VERIFY, node.name, f"{resolution}: {why}")
