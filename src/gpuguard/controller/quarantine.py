"""Quarantine as a Node's change arrives, ahead of the reconcile pass.

A pass writes every record of its plan before the next pass starts, so a node that turns
unhealthy while one runs would wait for all of them: 300 nodes flipping at once took
seconds. Taints are never limited or paused (the policy's ``opens_episode`` alone decides
them), and a taint ahead of its record is safe: the pass that follows opens the episode
and finds the node tainted, as a new leader would. So the Node watch hands each such node
here and a small pool of writers taints it at once; everything else stays with the pass.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from gpuguard import logs
from gpuguard.controller.metrics import ControllerMetrics
from gpuguard.kube import fleet
from gpuguard.kube.errors import KubeError, KubeFenced
from gpuguard.kube.rest import Json, KubeApi
from gpuguard.remediation.health import opens_episode
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

    def offer(self, node: Json, observed: NodeObservation, now: float) -> bool:
        """Taint ``node`` (its slim cached form) now if ``observed``, a node with no open
        episode, must be quarantined and is not yet; True when a write was started."""
        if observed.tainted or not opens_episode(observed, self.policy, now):
            return False
        with self._lock:
            if observed.name in self._writing:
                return False
            self._writing.add(observed.name)
        self._pool.submit(self._taint, node, observed.name)
        return True

    def _taint(self, node: Json, name: str) -> None:
        try:
            fleet.taint(self.writer, node)
        except KubeFenced as exc:
            self.metrics.actions.labels(TAINT, "fenced").inc()
            log.debug("taint of %s not written: %s", name, exc)
        except KubeError as exc:  # the pass decides the taint again
            self.metrics.actions.labels(TAINT, "error").inc()
            log.warning("taint of %s failed, the next pass retries: %s", name, exc)
        else:
            self.metrics.actions.labels(TAINT, "ok").inc()
            log.info("%s %s: unhealthy, ahead of the pass", TAINT, name, extra=logs.about(name))
        finally:
            with self._lock:
                self._writing.discard(name)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
