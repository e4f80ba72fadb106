"""The Node watch's side of the controller: every Node projected once, as it changes, into
the observation a pass reads (so that a pass never walks the whole fleet), with its
position, silence, crash and preflight layers kept up to date, and an unhealthy change
offered to the quarantine at once (``quarantine.py``), before any pass."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable

from gpuguard.clock import Clock
from gpuguard.contract.keys import REPORT_ANNOTATION
from gpuguard.contract.preflight import PREFLIGHT_LAYER
from gpuguard.controller.attribution import Attributor, node_at, with_crash_layer
from gpuguard.controller.metrics import ControllerMetrics
from gpuguard.controller.observe import project_node, read_position
from gpuguard.controller.position_faults import PositionFaults
from gpuguard.controller.positions import Positions
from gpuguard.controller.preflight import PreflightOutcomes
from gpuguard.controller.quarantine import Quarantine
from gpuguard.controller.silence import Silence
from gpuguard.controller.slis import ServiceLevels
from gpuguard.kube.rest import Json, WatchEvent
from gpuguard.kube.watch import Snapshot
from gpuguard.remediation.attribution import NodeAtFailure
from gpuguard.remediation.crash_memory import CRASH_LAYER
from gpuguard.remediation.model import NodeObservation
from gpuguard.remediation.policy import Policy
from gpuguard.remediation.reconciler import Reconciler

log = logging.getLogger("gpuguard.controller")


@dataclasses.dataclass
class NodeParts:
    """What the Node watch feeds besides the cache (each its own concern)."""

    reconciler: Reconciler
    quarantine: Quarantine
    attribution: Attributor
    position_faults: PositionFaults
    slis: ServiceLevels
    metrics: ControllerMetrics
    preflight: PreflightOutcomes | None = None  # with --preflight


class NodeCache:
    def __init__(
        self,
        policy: Policy,
        parts: NodeParts,
        clock: Clock,
        may_quarantine: Callable[[], bool],
    ) -> None:
        self.policy = policy
        self.parts = parts
        self.clock = clock
        self._may_quarantine = may_quarantine  # leading, and not a dry run
        self.nodes: dict[str, Json] = {}
        self.observed: dict[str, NodeObservation] = {}
        # Nodes lost (deleted) or not Ready: the pods still running there are marked.
        self.lost: set[str] = set()
        self._crash_layered: set[str] = set()  # nodes with crash memory's or preflight's layer
        self.lock = threading.Lock()  # the cache and the reconciler's node tracking
        self.positions = Positions()
        self.silence = Silence(policy.agent_timeout_s)

    def take(self, item: Snapshot | WatchEvent) -> bool:
        """Fold a watch item into the cache; True when it can matter to a decision (a
        list, a Node added or gone, an unhealthy change)."""
        parts, relevant = self.parts, True
        with self.lock:
            if isinstance(item, Snapshot):
                self.nodes, self.observed = {}, {}
                parts.reconciler.forget_nodes()
                self.positions.clear()
                parts.position_faults.clear()
                for node in item.items:
                    self._put(node)
                self.silence.keep_only(self.observed.keys())
                parts.slis.nodes_listed(item.items)
            elif item.type == "DELETED":
                name = item.object["metadata"]["name"]
                self._drop(name)
                parts.slis.node_gone(name)
            else:
                relevant = self._put(item.object)
                parts.slis.node_seen(item.object)
                self._quarantine_now(item.object["metadata"]["name"], item.object)
        return relevant

    def _quarantine_now(self, name: str, node: Json) -> None:
        """Taint at once a node this change makes unhealthy (``quarantine.py``)."""
        quarantine = self.parts.quarantine
        quarantine.seen(name, node)
        if not self._may_quarantine():
            return
        if self.nodes.get(name) is node:  # else unreadable: the last good reading stands
            episode = name in self.parts.reconciler.episodes
            quarantine.offer(node, self.observed[name], self.clock.now(), episode=episode)

    def _put(self, node: Json) -> bool:
        """Cache one Node; True when the change can matter to a decision (a healthy
        node's heartbeat, 5,000 of them every few minutes, does not)."""
        name = node["metadata"]["name"]
        reconciler, policy = self.parts.reconciler, self.policy
        old = self.observed.get(name)
        attended = name in reconciler.attention  # the old projection needed attention
        try:
            labels = node["metadata"].get("labels") or {}
            reading = read_position(labels, policy.positions.labels)
            observed = project_node(
                node, policy.pool_label, policy.correlation.domain_label, reading.position
            )
        except Exception:  # the last good projection stands; the rest of the list goes on
            self.parts.metrics.unreadable.labels("Node").inc()
            log.exception("Node %s could not be read, its last reading kept", name)
            return False
        observed = self._with_crashes(observed, self.clock.now())
        self.nodes[name], self.observed[name] = node, observed
        if node_at(node, None).ready:
            self.lost.discard(name)
        else:
            self.lost.add(name)
        self.parts.position_faults.seen(node)
        sharing = self.positions.put(name, reading, reporting=bool(observed.layers))
        moved = [other for other in sharing if self._share(other)]
        attended |= any(other in reconciler.episodes for other in moved)
        observed = self._share(name) or observed
        annotations = node["metadata"].get("annotations") or {}
        if observed.reported_at is None and REPORT_ANNOTATION in annotations:
            self.parts.metrics.unreadable.labels("report").inc()  # logged by project_node
        self.silence.heard(name, observed.reported_at, self.clock.now())
        attended |= reconciler.track(name, observed)  # replaces the old one's pool
        return attended or old is None or old.pool != observed.pool or name in reconciler.episodes

    def _drop(self, name: str) -> None:
        self.parts.quarantine.settled([name])
        self.parts.attribution.forget_node(name)
        if self.parts.preflight is not None:
            self.parts.preflight.forget_node(name)
        self.lost.add(name)
        self.nodes.pop(name, None)
        self.observed.pop(name, None)
        self.silence.forget(name)
        self.parts.reconciler.track(name, None)
        self.parts.position_faults.forget(name)
        for other in self.positions.drop(name):
            self._share(other)

    def _share(self, name: str) -> NodeObservation | None:
        """Give the cached node the other live Nodes now claiming its position; the new
        observation when that changed it."""
        observed = self.observed.get(name)
        shared = self.positions.shared_with(name)
        if observed is None or observed.position_shared_with == shared:
            return None
        observed = dataclasses.replace(observed, position_shared_with=shared)
        self.observed[name] = observed
        self.parts.reconciler.track(name, observed)
        return observed

    def _with_crashes(self, observed: NodeObservation, now: float) -> NodeObservation:
        observed = with_crash_layer(observed, self.parts.attribution.layer(observed.name, now))
        preflight = self.parts.preflight
        if preflight is None:
            return observed
        return with_crash_layer(observed, preflight.layer(observed.name, now), PREFLIGHT_LAYER)

    def take_lost(self) -> list[tuple[str, bool]]:
        """The nodes lost (not Ready, or gone) since the last call, each with whether its
        Node is still there; a gone one is given once, a not-Ready one until it is back."""
        with self.lock:
            lost = [(name, name in self.nodes) for name in self.lost]
            self.lost = {name for name, there in lost if there}
        return lost

    def node_at(self, name: str) -> NodeAtFailure:
        with self.lock:
            return node_at(self.nodes.get(name), self.observed.get(name))

    def attribute(self, now: float) -> None:
        """Judge the failures waiting (crashes, failed preflights); a node they made
        suspect (or whose suspicion lapsed or was repaired) is read again with its
        layers."""
        attribution, reconciler = self.parts.attribution, self.parts.reconciler
        preflight = self.parts.preflight
        raised = attribution.judge(self.node_at, now)
        if preflight is not None:
            raised |= preflight.judge(now)
        with self.lock:
            if preflight is not None:
                raised |= preflight.spend(self.observed, reconciler.episodes, reconciler.history)
            for name in raised | self._crash_layered:
                observed = self.observed.get(name)
                if observed is not None:
                    self.observed[name] = self._with_crashes(observed, now)
                    reconciler.track(name, self.observed[name])
            self._crash_layered = {
                name
                for name in raised | self._crash_layered
                if name in self.observed
                and self.observed[name].layers.keys() & {CRASH_LAYER, PREFLIGHT_LAYER}
            }
        attribution.publish(now)
        if preflight is not None:
            preflight.publish(now)
