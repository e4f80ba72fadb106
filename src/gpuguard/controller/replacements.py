"""Naming, on each episode closed Replaced, the Node that took over from the old one
(``remediation.replacement`` says how it is recognised), once that Node has registered."""

from __future__ import annotations

from collections.abc import Iterable

from gpuguard.controller.apply import Applier
from gpuguard.remediation.model import Episode, NodeObservation, Phase, Plan, Step
from gpuguard.remediation.replacement import awaiting_replacement, pair_replacements


class Replacements:
    def __init__(self, applier: Applier) -> None:
        self.applier = applier
        self.awaiting: list[Episode] = []  # closed Replaced, no replacement named yet

    def reload(self, closed: Iterable[Episode], now: float) -> None:
        self.awaiting = [e for e in closed if awaiting_replacement(e, now)]

    def take(self, plan: Plan, now: float) -> None:
        self.awaiting += [e for e in plan.episodes.values() if awaiting_replacement(e, now)]

    def name(self, closed: Iterable[Episode], nodes: Iterable[NodeObservation], now: float) -> None:
        """Pair what waits with the Nodes now registered; a failed write is tried again."""
        for episode, node in pair_replacements(closed, nodes, now):
            episode.replacement = node
            episode.steps.append(Step(now, Phase.CLOSED, f"replaced by Node {node}"))
            if not self.applier.save(episode):
                episode.replacement = ""
                episode.steps.pop()
        self.awaiting = [e for e in self.awaiting if awaiting_replacement(e, now)]
