"""The preflight gate's outcomes, on the controller's side (``--preflight``).

A pod whose ``gpuguard-preflight`` init container failed is a failed preflight on the
node it was placed on, or on each node a gang result names slow: remembered once per
ending (``remediation/preflight_memory.py``), told by an Event on the Node, counted, and
raised as the node's ``preflight`` layer, which quarantines it through the usual policy,
so the scheduler places the job elsewhere.

The webhook fails open, so a GPU pod in an opted-in namespace admitted without the check
is counted: a gate that is down shows. The opt-in is read from a Namespace watch (only
with ``--preflight``; a cluster has few namespaces): it tells when each namespace was
labelled, so pods created before their namespace opted in never count.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuguard.contract.report import LayerReport
from gpuguard.controller.events import EventRecorder
from gpuguard.controller.preflight_pods import Read, failures_of, slim_namespace, unchecked_since
from gpuguard.controller.watches import Watched
from gpuguard.kube.rest import Json, WatchEvent
from gpuguard.kube.watch import Snapshot
from gpuguard.remediation.history import History
from gpuguard.remediation.model import Episode, NodeObservation
from gpuguard.remediation.policy import Policy
from gpuguard.remediation.preflight_memory import (
    REASON,
    PreflightMemory,
    preflight_layer,
    spent_after,
)

log = logging.getLogger("gpuguard.controller")
NAMESPACES = "/api/v1/namespaces"
Now = Callable[[], float]


class PreflightMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        # Bounded labels: the node is named in the Event and the episode, not here.
        self.failures = Counter(
            "gpuguard_preflight_failures_total",
            "Failed preflight checks read off pods, each counted once per node it names: by"
            " result (failed; passed: a Passed result with a non-zero exit; none: no result)"
            " and target (node: the pod's own; slow_node: a node the gang check found slow)",
            ["result", "target"],
            registry=registry,
        )
        self.unchecked = Counter(
            "gpuguard_preflight_pods_unchecked_total",
            "GPU pods created in a namespace after it opted in to the preflight gate and"
            " admitted without the check: the webhook was down or failed open",
            registry=registry,
        )
        self.failed_nodes = Gauge(
            "gpuguard_preflight_failed_nodes",
            "Nodes whose preflight layer stands (a failed preflight keeps them quarantined)",
            registry=registry,
        )


class PreflightOutcomes:
    def __init__(
        self, events: EventRecorder, registry: CollectorRegistry, policy: Policy, clock_now: Now
    ) -> None:
        self.events = events
        self.metrics = PreflightMetrics(registry)
        self.memory = PreflightMemory(policy)
        self._now = clock_now
        self._lock = threading.Lock()  # the pod and namespace watches feed, the pass judges
        self._pending: dict[tuple[str, str], Read] = {}  # (node, key) -> failure to judge
        self._opted_in: dict[str, float | None] = {}  # namespace -> since (None: not in)
        # namespace -> uid -> (created, name): GPU pods admitted without the check
        self._unchecked: dict[str, dict[str, tuple[float, str]]] = {}
        self._counted: set[str] = set()  # uids counted unchecked

    def watched(self) -> list[Watched]:
        return [Watched("namespaces", NAMESPACES, self.take_namespaces, slim_namespace)]

    # --- fed by the watches -----------------------------------------------------------
    def take_pods(self, item: Snapshot | WatchEvent) -> bool:
        """Fold a pod watch item in; True when a failure now waits to be judged."""
        pods = item.items if isinstance(item, Snapshot) else [item.object]
        now, waiting = self._now(), False
        with self._lock:
            if isinstance(item, Snapshot):
                self._unchecked.clear()
                self._counted &= {pod["metadata"]["uid"] for pod in pods}
            elif item.type == "DELETED":
                self._forget_pod(item.object)
                return False
            for pod in pods:
                waiting |= self._take_pod(pod, now)
        return waiting

    def _take_pod(self, pod: Json, now: float) -> bool:
        waiting = False
        for read in failures_of(pod, now):
            seen = (read.failure.node, read.failure.key)
            fresh = self.memory.may_stand(read.failure.at, now)  # else long over: no pass
            if fresh and seen not in self._pending and not self.memory.knows(*seen):
                self._pending[seen] = read
                waiting = True
        created = unchecked_since(pod)
        metadata = pod["metadata"]
        if created is not None and metadata["uid"] not in self._counted:
            kept = (created, str(metadata.get("name", "")))
            self._unchecked.setdefault(metadata["namespace"], {})[metadata["uid"]] = kept
            self._count_unchecked(metadata["namespace"])
        return waiting

    def _forget_pod(self, pod: Json) -> None:
        metadata = pod["metadata"]
        self._counted.discard(metadata["uid"])
        waiting = self._unchecked.get(metadata["namespace"])
        if waiting is not None:
            waiting.pop(metadata["uid"], None)
            if not waiting:
                del self._unchecked[metadata["namespace"]]

    def take_namespaces(self, item: Snapshot | WatchEvent) -> str:
        now = self._now()
        with self._lock:
            if isinstance(item, Snapshot):
                self._opted_in = {}
                changed = [self._take_namespace(ns, now) for ns in item.items]
            elif item.type == "DELETED":
                self._opted_in.pop(item.object["metadata"]["name"], None)
                changed = []
            else:
                changed = [self._take_namespace(item.object, now)]
            for name in changed:
                self._count_unchecked(name)
        return item.resource_version

    def _take_namespace(self, namespace: Json, now: float) -> str:
        name = str(namespace["metadata"]["name"])
        before = self._opted_in.get(name)
        if "enabledAt" not in namespace:
            self._opted_in[name] = None
        else:  # labelled: when, else when first seen so (no managed fields kept)
            self._opted_in[name] = namespace["enabledAt"] or before or now
        return name

    def _count_unchecked(self, namespace: str) -> None:
        """Count the namespace's unchecked GPU pods created after it opted in."""
        since = self._opted_in.get(namespace)
        waiting = self._unchecked.get(namespace) or {}
        if since is None:
            return
        for uid, (created, name) in list(waiting.items()):
            if created > since:
                self._counted.add(uid)
                self.metrics.unchecked.inc()
                log.info("pod %s/%s was admitted without the preflight check", namespace, name)
            del waiting[uid]  # created before the opt-in: never counted

    # --- in the leader's pass ---------------------------------------------------------
    def judge(self, now: float) -> set[str]:
        """Remember every failure waiting, tell of it; the nodes whose layer it raised."""
        with self._lock:
            waiting = list(self._pending.values())
            self._pending.clear()
            fresh, told = [], set()  # a pod failing in a loop is told of once
            for read in waiting:
                failure = read.failure
                standing = self.memory.standing(failure.node, now)
                if any(f.pod == failure.pod for f in standing):
                    told.add((failure.node, failure.key))
                if self.memory.record(failure, now):
                    fresh.append(read)
            self.memory.forget_before(now)
        for read in fresh:
            failure = read.failure
            target = "slow_node" if failure.slow_link else "node"
            self.metrics.failures.labels(read.result, target).inc()
            if (failure.node, failure.key) not in told:
                self.events.about_node(failure.node, REASON, _note(read), now)
                log.warning("node %s: %s", failure.node, _note(read))
        return {read.failure.node for read in fresh}

    def spend(
        self,
        observed: Mapping[str, NodeObservation],
        episodes: Mapping[str, Episode],
        history: History,
    ) -> set[str]:
        """Forget the failures a repair or a passing deep verify came after; the nodes
        whose layer that changed."""
        changed = set()
        with self._lock:
            for node in self.memory.nodes():
                seen = observed.get(node)
                verify = seen.verify if seen is not None else None
                mine = [episodes[node]] if node in episodes else []
                after = spent_after(node, verify, [*mine, *history.of(node)])
                if after is not None and self.memory.spend(node, after):
                    changed.add(node)
        return changed

    def layer(self, node: str, now: float) -> tuple[str, LayerReport] | None:
        """The node's ``preflight`` layer while a failure stands."""
        with self._lock:
            return preflight_layer(self.memory.standing(node, now))

    def publish(self, now: float) -> None:
        with self._lock:
            standing = [node for node in self.memory.nodes() if self.memory.standing(node, now)]
        self.metrics.failed_nodes.set(len(standing))

    def forget_node(self, node: str) -> None:
        with self._lock:
            self.memory.clear(node)


def _note(read: Read) -> str:
    failure = read.failure
    codes = ", ".join(failure.codes)
    if failure.slow_link:
        found = f"the gang check of pod {failure.pod} found this node slow ({codes})"
    else:
        result = {"none": "no result", "passed": "a Passed result"}.get(read.result, codes)
        ended = f"exit {read.exit_code}" + (f", {read.reason}" if read.reason else "")
        found = f"the preflight check of pod {failure.pod} failed ({ended}: {result})"
        if failure.gpus:
            found += f" on {', '.join(failure.gpus)}"
    detail = f": {read.message}" if read.message else ""
    return f"{found}{detail}; the node is quarantined through the remediation policy"
