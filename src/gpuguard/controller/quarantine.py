"""Quarantine as a Node's change arrives, ahead of the reconcile pass.

A pass writes every record of its plan before the next pass starts, so a node that turns
unhealthy while one runs would wait for all of them: 300 nodes flipping at once took
seconds. Taints are never limited or paused (the policy's ``opens_episode`` alone decides
them), and a taint ahead of its record is safe: the pass that follows opens the episode
and finds the node tainted, as a new leader would. So the Node watch hands each such node
here and a small pool of writers taints it at once; everything else stays with the pass.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from gpuguard import logs
from gpuguard.controller.apply import counted_write
from gpuguard.controller.metrics import ControllerMetrics
from gpuguard.kube import fleet
from gpuguard.kube.rest import Json, KubeApi
from gpuguard.remediation.health import describe, opens_episode
from gpuguard.remediation.model import DecisionKind, NodeObservation
from gpuguard.remediation.policy import Policy

log = logging.getLogger("gpuguard.controller")
WRITERS = 8
TAINT = str(DecisionKind.TAINT)


class Quarantine:
    """Taints the nodes it is offered that must be quarantined, each once at a time."""

    def __init__(self, writer: KubeApi, metrics: ControllerMetrics, policy: Policy) -> None:
        self.writer = writer  # fenced by leadership: a replica that lost it writes nothing
        self.metrics = metrics
        self.policy = policy
        self._pool = ThreadPoolExecutor(max_workers=WRITERS, thread_name_prefix="quarantine")
        self._lock = threading.Lock()
        self._writing: set[str] = set()
        # Node -> the resourceVersion our taint made, until the watch shows that version
        # or a later one: the changes before it (the agent's report follows its
        # condition) must not send the taint again.
        self._written: dict[str, int] = {}
        # Node -> what it showed when tainted here, until a pass has opened its episode.
        self._ahead: dict[str, str] = {}
        # How a node is tainted, and how a pass sees it first (per-GPU quarantine's hooks).
        self.taint_node: Callable[[KubeApi, Json], Json] = fleet.taint
        self.pass_view: Callable[[NodeObservation], NodeObservation] = _as_is

    def offer(self, node: Json, observed: NodeObservation, now: float, *, episode: bool) -> bool:
        """Taint ``node`` (its slim cached form) now if ``observed`` must be quarantined and
        is not yet (``episode``: it has an open one, which the pass looks after); True
        when a write was started. The caller has shown it the change first (``seen``)."""
        name = observed.name
        with self._lock:
            if name in self._written:
                return False  # a change from before our taint
            if episode:
                self._ahead.pop(name, None)
            if episode or observed.tainted or name in self._writing:
                return False
            if not opens_episode(observed, self.policy, now):
                return False
            self._writing.add(name)
        self._pool.submit(self._taint, node, name, describe(observed))
        return True

    def seen(self, name: str, node: Json) -> None:
        """A change of the node arrived (leading or not): from our taint's version on, the
        watch shows what the node carries, and the pending taint is forgotten."""
        with self._lock:
            ours = self._written.get(name)
            if ours is not None and _version(node) >= ours:
                del self._written[name]

    def forget(self) -> None:
        """Leadership changed hands: what was written before is for the cache to show."""
        with self._lock:
            self._written.clear()
            self._ahead.clear()

    def as_pass_sees(self, observed: NodeObservation, *, episode: bool) -> NodeObservation:
        """``observed`` tainted if the taint written here has not shown on the watch yet
        (so a pass does not send it again), and, while ``episode`` is not open, with what
        it showed when tainted (so the pass opens one even if the fault has cleared)."""
        observed = self.pass_view(observed)
        with self._lock:
            wrote, ahead = observed.name in self._written, self._ahead.get(observed.name, "")
        if wrote and not observed.tainted:
            observed = dataclasses.replace(observed, tainted=True)
        if ahead and not episode:
            observed = dataclasses.replace(observed, quarantined_for=ahead)
        return observed

    def waiting(self) -> set[str]:
        """The nodes tainted here whose episode no pass has opened yet."""
        with self._lock:
            return set(self._ahead)

    def settled(self, names: Iterable[str]) -> None:
        """These nodes' episodes are open (or the nodes gone): nothing waits on a pass."""
        with self._lock:
            for name in names:
                self._ahead.pop(name, None)

    def _taint(self, node: Json, name: str, why: str) -> None:
        def taint() -> None:
            tainted = self.taint_node(self.writer, node)
            with self._lock:
                self._written[name] = _version(tainted)
                self._ahead[name] = why

        try:
            if counted_write(self.metrics, TAINT, name, taint):
                log.info("%s %s: unhealthy, ahead of the pass", TAINT, name, extra=logs.about(name))
        finally:
            with self._lock:
                self._writing.discard(name)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _version(node: Json) -> int:
    """The Node's resourceVersion as a number (etcd's revision; 0 if not one)."""
    version = str((node.get("metadata") or {}).get("resourceVersion") or "")
    return int(version) if version.isdigit() else 0


def _as_is(observed: NodeObservation) -> NodeObservation:
    return observed
