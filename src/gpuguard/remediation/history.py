"""Closed episodes, indexed for the questions ``decide`` asks of them.

The lemon count asks for one node's recent episodes, the position rules for one position's
(``positions.py``), and the breaker for the episodes opened within its window. On a plain
list each is a walk over every closed episode, once per call and again per node trying a
rung: at 10,000 nodes a week of history is thousands of episodes. A caller that keeps a
``History`` across calls (adding what closes, forgetting what ages out) makes each
independent of the history's length; a plain sequence still works and gives the same
answers.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

from gpuguard.remediation.model import Episode


def age(episode: Episode) -> float:
    """What ages an episode out: when it closed (when it opened, if it never did)."""
    return episode.closed_at if episode.closed_at is not None else episode.opened_at


class History(Sequence[Episode]):
    """Closed episodes by node and by opening time; a ``Sequence`` of them in age order."""

    def __init__(self, episodes: Iterable[Episode] = ()) -> None:
        self._episodes: list[Episode] = []  # by age
        self._by_node: dict[str, list[Episode]] = defaultdict(list)
        self._by_position: dict[str, list[Episode]] = defaultdict(list)
        self._opened: list[float] = []  # sorted
        self.add(episodes)

    def add(self, episodes: Iterable[Episode]) -> None:
        for episode in episodes:
            insort(self._episodes, episode, key=age)
            self._by_node[episode.node].append(episode)
            if episode.position:
                self._by_position[episode.position].append(episode)
            insort(self._opened, episode.opened_at)

    def forget_before(self, horizon: float) -> None:
        """Drop the episodes that closed (or opened, if never closed) before ``horizon``."""
        cut = bisect_left(self._episodes, horizon, key=age)
        for episode in self._episodes[:cut]:
            mine = self._by_node[episode.node]
            mine.remove(episode)
            if not mine:
                del self._by_node[episode.node]
            if episode.position:
                there = self._by_position[episode.position]
                there.remove(episode)
                if not there:
                    del self._by_position[episode.position]
            del self._opened[bisect_left(self._opened, episode.opened_at)]
        del self._episodes[:cut]

    def of(self, node: str) -> Sequence[Episode]:
        """The closed episodes of one node."""
        return self._by_node.get(node, ())

    def at(self, position: str) -> Sequence[Episode]:
        """The closed episodes of the machines that sat at one position."""
        return self._by_position.get(position, ())

    def opened_from(self, start: float) -> list[float]:
        """The opening times at or after ``start`` (ascending)."""
        return self._opened[bisect_left(self._opened, start) :]

    def __len__(self) -> int:
        return len(self._episodes)

    def __iter__(self) -> Iterator[Episode]:
        return iter(self._episodes)

    @overload
    def __getitem__(self, index: int) -> Episode: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Episode]: ...

    def __getitem__(self, index: int | slice) -> Episode | Sequence[Episode]:
        return self._episodes[index]
