"""The fleet's positions as the controller sees them: which live Nodes claim each one, and
which Nodes have none the policy can use (docs/remediation.md, "Where a fault lives").

The policy reads a node's position from its observation; what no single Node shows is
here: a position claimed by two live Nodes (a mislabelled one, or a replacement labelled
before its predecessor left) fills each one's ``position_shared_with``. What cannot be
read is said, never fatal: a gauge by reason, an Event per Node and per shared position,
once per controller run. A fleet none of whose Nodes carries the policy's position labels
(an EKS fleet, say) uses the nodes' names, as configured: the gauge says so, and no Node
gets an Event for it (100,000 of them at every start would be noise that holds up the
first pass). At most :data:`MOST_NOTICES` Events go out per pass; the rest follow.
"""

from __future__ import annotations

import heapq
from collections import Counter
from typing import NamedTuple

from gpuguard.controller.metrics import ControllerMetrics
from gpuguard.controller.observe import INCOMPLETE, TOO_LONG, UNLABELLED, PositionReading

POSITION_UNKNOWN = "PositionUnknown"
POSITION_SHARED = "PositionShared"
MOST_NOTICES = 50  # Events per pass: a pass must not wait on thousands of writes


class Notice(NamedTuple):
    """An Event to give about ``node``."""

    node: str
    reason: str
    note: str


class Positions:
    """Not thread-safe: the controller calls it under its Node cache's lock. Kept as the
    Nodes change, so that a pass's :meth:`untold` costs what it tells, not the fleet."""

    def __init__(self) -> None:
        self._at: dict[str, str] = {}  # live node -> its position (known ones only)
        self._claims: dict[str, set[str]] = {}  # position -> the live nodes claiming it
        self._shared: set[str] = set()  # positions claimed by more than one live node
        self._unknown: dict[str, PositionReading] = {}  # reporting node -> why unknown
        self._by_problem: Counter[str] = Counter()  # the readings in _unknown, by problem
        self._untold: dict[bool, set[str]] = {True: set(), False: set()}  # by "unlabelled"
        self._told_unknown: set[str] = set()
        self._told_shared: set[tuple[str, frozenset[str]]] = set()

    def put(self, name: str, reading: PositionReading, *, reporting: bool) -> set[str]:
        """The node's latest reading; returns the other nodes whose sharing changed.
        ``reporting``: gpuguard's agent reports on it (only such nodes are told about: a
        CPU node has no rack slot to label). A Node being deleted still claims its
        position: until it is gone its episode is open, and what happened there is not yet
        history the policy can read."""
        if reading.problem and reporting:
            if self._unknown.get(name) != reading:
                self._forget_unknown(name)
                self._unknown[name] = reading
                self._by_problem[reading.problem] += 1
                self._untold[reading.problem == UNLABELLED].add(name)
        else:
            self._forget_unknown(name)
        position = reading.position
        old = self._at.get(name, "")
        if position == old:
            return set()
        affected = self._leave(name, old)
        if position:
            claims = self._claims.setdefault(position, set())
            affected |= claims
            claims.add(name)
            if len(claims) > 1:
                self._shared.add(position)
            self._at[name] = position
        return affected

    def drop(self, name: str) -> set[str]:
        """The Node is gone: the nodes that shared its position no longer do."""
        self._forget_unknown(name)
        return self._leave(name, self._at.get(name, ""))

    def clear(self) -> None:
        """Before a fresh list: every node is put again (and told again if still unknown:
        its reading is new to this cache)."""
        self._at.clear()
        self._claims.clear()
        self._shared.clear()
        self._unknown.clear()
        self._by_problem.clear()
        for untold in self._untold.values():
            untold.clear()

    def shared_with(self, name: str) -> tuple[str, ...]:
        position = self._at.get(name, "")
        return tuple(sorted(self._claims.get(position, set()) - {name}))

    def untold(self, metrics: ControllerMetrics) -> list[Notice]:
        """Set the gauges; the Events not given yet in this run, each given once (an Event
        is best effort), for the caller to send outside the cache's lock."""
        for reason in (UNLABELLED, INCOMPLETE, TOO_LONG):
            metrics.nodes_without_position.labels(reason).set(self._by_problem[reason])
        # A fleet with no position labels at all uses names, as configured: not told.
        fleet_has_positions = bool(self._at)
        waiting = self._untold[False] | (self._untold[True] if fleet_has_positions else set())
        untold = heapq.nsmallest(MOST_NOTICES, waiting)
        notices = [
            Notice(name, POSITION_UNKNOWN, f"Node {name} {self._unknown[name].describe()}")
            for name in untold
        ]
        for name in untold:
            self._untold[self._unknown[name].problem == UNLABELLED].discard(name)
        self._told_unknown.update(untold)
        shared = {p: frozenset(self._claims[p]) for p in self._shared}
        metrics.shared_positions.set(len(shared))
        self._told_shared &= set(shared.items())  # shared again later: told again
        for position, names in sorted(shared.items()):
            if (position, names) in self._told_shared:
                continue
            note = (
                f"position {position} is claimed by {len(names)} live Nodes: "
                f"{', '.join(sorted(names))}; no reboot or replace on any of them until all "
                "but one are gone or relabelled"
            )
            notices.append(Notice(min(names), POSITION_SHARED, note))
            self._told_shared.add((position, names))
        return notices

    def _forget_unknown(self, name: str) -> None:
        reading = self._unknown.pop(name, None)
        if reading is not None:
            self._by_problem[reading.problem] -= 1
            self._untold[reading.problem == UNLABELLED].discard(name)
        self._told_unknown.discard(name)

    def _leave(self, name: str, position: str) -> set[str]:
        self._at.pop(name, None)
        if not position:
            return set()
        claims = self._claims[position]
        claims.discard(name)
        if len(claims) < 2:
            self._shared.discard(position)
        if not claims:
            del self._claims[position]
        return set(claims)
