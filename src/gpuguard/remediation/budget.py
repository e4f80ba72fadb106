"""The per-pool disruption budget, kept current while one call's decisions unfold.

Only episodes that take GPUs or the node away hold a slot: Draining, Acting or Verifying
with a rung of RESET_GPU or above. Taints never wait for the budget, and killing a job
leaves the node's capacity where it was.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping

from gpuguard.model import Action
from gpuguard.remediation.model import ACTIVE_PHASES, Episode, NodeObservation
from gpuguard.remediation.policy_sections import Budget

BUDGETED_RUNGS = (Action.RESET_GPU, Action.REBOOT, Action.REPLACE)


def holds_slot(episode: Episode) -> bool:
    return episode.phase in ACTIVE_PHASES and episode.rung in BUDGETED_RUNGS


class BudgetLedger:
    """Which nodes of each pool hold a repair slot right now."""

    def __init__(
        self,
        nodes: Mapping[str, NodeObservation],
        episodes: Mapping[str, Episode],
        budget: Budget,
        population: Mapping[str, int] | None = None,
    ) -> None:
        self._budget = budget
        self._pool_of = {name: node.pool for name, node in nodes.items()}
        self._pool_size = Counter(population or self._pool_of.values())
        self._holders: dict[str, set[str]] = defaultdict(set)
        for name, episode in episodes.items():
            self.update(name, episode)

    def allowed(self, pool: str) -> int:
        return self._budget.allowed(self._pool_size[pool])

    def in_use(self, pool: str) -> int:
        return len(self._holders[pool])

    def has_room(self, node: str) -> bool:
        """Could ``node`` start a budgeted rung? (A slot it already holds is its own.)"""
        pool = self._pool_of[node]
        return len(self._holders[pool] - {node}) < self.allowed(pool)

    def update(self, node: str, episode: Episode) -> None:
        pool = self._pool_of.get(node)
        if pool is None:  # the Node is gone: its episode closes, it holds nothing
            return
        if holds_slot(episode):
            self._holders[pool].add(node)
        else:
            self._holders[pool].discard(node)
