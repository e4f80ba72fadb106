"""Which agents have gone silent: a dead or OOM-killed agent must not leave its last
"healthy" standing.

Judged on this replica's clock, from when it first saw each node's latest report (as a
Lease's expiry is): an agent whose clock runs behind is not silent, and a new leader
gives every agent the whole ``agent_timeout_s``.
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

    def heard(self, name: str, reported_at: float | None, now: float) -> None:
        """The node's report as just read; a new stamp means the agent lives."""
        known = self._heard.get(name)
        if known is None or known[0] != reported_at:
            self._heard[name] = (reported_at, now)

    def forget(self, name: str) -> None:
        self._heard.pop(name, None)

    def keep_only(self, names: Collection[str]) -> None:
        """After a fresh list of the fleet: nodes not in it are gone."""
        self._heard = {name: heard for name, heard in self._heard.items() if name in names}

    def silent(
        self, observed: Mapping[str, NodeObservation], now: float
    ) -> tuple[dict[str, float], float]:
        """The silent nodes with when each went silent, and when the next one will. A
        pass over the cache only when one can have gone silent."""
        if not self._any_silent and now <= self._next_due:
            return {}, self._next_due
        silent: dict[str, float] = {}
        upcoming = math.inf
        for name, node in observed.items():
            reported, heard_at = self._heard.get(name, (None, now))
            if reported is None or not node.layers:
                continue  # no agent yet: nothing it stopped saying
            since = heard_at + self.timeout_s
            if since < now:
                silent[name] = since
            else:
                upcoming = min(upcoming, since)
        self._next_due, self._any_silent = upcoming, bool(silent)
        return silent, upcoming

    def newly(self, silent: Collection[str]) -> set[str]:
        """The silent nodes not said to be silent before (an Event each, once)."""
        new = set(silent) - self._told
        self._told = set(silent)
        return new
