"""Which agents have gone silent: a dead or OOM-killed agent must not leave its last
"healthy" standing.

Judged on this replica's clock, from when it first saw each node's latest report (as a
Lease's expiry is): an agent whose clock runs behind is not silent, and a new leader
gives every agent the whole ``agent_timeout_s``, except on the nodes it found with an open
episode (``presume``): those read silent from the first look until their agent shows a new
report, so a new process never releases a node it cannot yet tell from a dead agent's.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

from gpuguard.remediation.model import NodeObservation


class Silence:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        # Per node: the latest report's stamp and when (our clock) it was first seen.
        self._heard: dict[str, tuple[float | None, float]] = {}
        self._told: set[str] = set()
        # From the last scan: when the next node can go silent, and whether any was. A new
        # report only moves a node's time later, so until then there is nothing to find.
        self._next_due = -math.inf
        self._any_silent = False
        self._presumed: set[str] = set()  # held silent until a new report (``presume``)
        self._alive: set[str] = set()  # a new report seen by this process
        self._only_presumed: set[str] = set()  # of the last scan's silent: not timed out

    def presume(self, names: Collection[str]) -> None:
        """Nodes with an open episode, as a new process finds them: silent from the first
        look until their agent shows a new report (a dead agent's last report says nothing
        about the node now)."""
        self._presumed |= set(names) - self._alive

    def heard(self, name: str, reported_at: float | None, now: float) -> None:
        """The node's report as just read; a new stamp means the agent lives."""
        known = self._heard.get(name)
        if known is None or known[0] != reported_at:
            self._heard[name] = (reported_at, now)
            # A node heard of for the first time can go silent from now on: look again by
            # then, whatever the last scan found (no agent anywhere is no reason to stop).
            self._next_due = min(self._next_due, now + self.timeout_s)
        if known is not None and known[0] != reported_at:
            self._alive.add(name)
            self._presumed.discard(name)

    def forget(self, name: str) -> None:
        self._heard.pop(name, None)
        self._presumed.discard(name)

    def keep_only(self, names: Collection[str]) -> None:
        """After a fresh list of the fleet: nodes not in it are gone."""
        self._heard = {name: heard for name, heard in self._heard.items() if name in names}

    def silent(
        self, observed: Mapping[str, NodeObservation], now: float
    ) -> tuple[dict[str, float], float]:
        """The silent nodes with when each went silent, and when the next one will. A
        pass over the cache only when one can have gone silent."""
        if not self._any_silent and not self._presumed and now <= self._next_due:
            return {}, self._next_due
        silent: dict[str, float] = {}
        upcoming = math.inf
        self._only_presumed = set()
        for name, node in observed.items():
            reported, heard_at = self._heard.get(name, (None, now))
            if reported is None or not node.layers:
                continue  # no agent yet: nothing it stopped saying
            since = heard_at + self.timeout_s
            timed_out = since < now
            if not timed_out:
                upcoming = min(upcoming, since)
            if name in self._presumed:  # silent since the first look, its time up or not
                silent[name] = heard_at
                if not timed_out:
                    self._only_presumed.add(name)
            elif timed_out:
                silent[name] = since
        self._next_due, self._any_silent = upcoming, bool(silent)
        return silent, upcoming

    def newly(self, silent: Collection[str]) -> set[str]:
        """The silent nodes not said to be silent before (an Event each, once); a node
        only presumed silent is not said to be, until its agent's time is up."""
        timed_out = set(silent) - self._only_presumed
        new = timed_out - self._told
        self._told = timed_out
        return new
