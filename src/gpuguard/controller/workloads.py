"""The workloads' side of the controller: the Pod and Job watches folded into the pod cache,
crash attribution and the service levels, and what a pass needs of them: the pods a drain
still waits for, the work a deferred repair waits for, the training pods marked as the
infrastructure's before a fault or a lost node fails them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from enum import Enum

from gpuguard.controller.apply import Applier
from gpuguard.controller.attribution import Attributor
from gpuguard.controller.pods import PodCache
from gpuguard.controller.preflight import PreflightOutcomes
from gpuguard.controller.slis import ServiceLevels
from gpuguard.kube.rest import WatchEvent
from gpuguard.kube.watch import Snapshot
from gpuguard.remediation.attribution import Cause
from gpuguard.remediation.health import deferred_repair, false_layers, named_gpus
from gpuguard.remediation.model import NodeObservation, Phase
from gpuguard.remediation.reconciler import Reconciler


class Wake(Enum):
    NOT = "not"
    NOW = "now"  # a failure to judge
    SOON = "soon"  # a drain or a deferred repair may have moved on: gathered into one pass


@dataclasses.dataclass
class Workloads:
    pods: PodCache
    attribution: Attributor
    slis: ServiceLevels
    applier: Applier
    reconciler: Reconciler
    preflight: PreflightOutcomes | None = None  # with --preflight

    def take_pods(self, item: Snapshot | WatchEvent) -> Wake:
        changed = self.pods.take(item)
        if isinstance(item, Snapshot):
            pods = item.items
        else:
            pods = [item.object] if item.type != "DELETED" else []
        failed = self.preflight is not None and self.preflight.take_pods(item)
        if any([self.attribution.take_pod(pod) for pod in pods]) or failed:  # every pod taken
            return Wake.NOW
        reconciler = self.reconciler
        if isinstance(item, Snapshot) or any(
            node in reconciler.episodes or node in reconciler.attention for node in changed
        ):
            return Wake.SOON
        return Wake.NOT

    def take_jobs(self, item: Snapshot | WatchEvent) -> str:
        if isinstance(item, Snapshot):
            self.slis.jobs_listed(item.items)
            for job in item.items:
                self.attribution.take_job(job)
        elif item.type == "DELETED":
            self.slis.job_gone(item.object)
            self.attribution.take_job(item.object, deleted=True)
        else:
            self.slis.job_seen(item.object)
            self.attribution.take_job(item.object)
        return item.resource_version

    def mark_ahead(
        self,
        observations: Mapping[str, NodeObservation],
        lost: list[tuple[str, bool]],
        now: float,
    ) -> None:
        """The training pods still running on a node at fault, or lost, are the
        infrastructure's should they fail: marked now, before the Job controller can
        count them."""
        for name, episode in self.reconciler.episodes.items():
            observed = observations.get(name)
            layers = false_layers(observed) if observed is not None else []
            if episode.phase is Phase.CLOSED or not layers:
                continue
            codes = ", ".join(sorted({c for layer in layers for c in layer.codes})) or "a fault"
            pods = self.pods.running_on(name, episode.gpus)
            cause = Cause.GPU_FAULT if episode.gpus else Cause.NODE_FAULT
            self.attribution.mark_ahead(pods, cause, f"node {name} at fault: {codes}", now)
        for name, there in lost:  # from NodeCache.take_lost: a gone node comes once
            why = f"node {name} is not Ready" if there else f"node {name} is gone"
            self.attribution.mark_ahead(self.pods.running_on(name), Cause.NODE_LOST, why, now)

    def with_pods(self, observed: NodeObservation, now: float) -> NodeObservation:
        """What the pod watch says of the node's drain, or, before a rung starts, of the
        work a deferred repair waits for and of a pod that asks not to be disrupted
        (counted for a node about to open its episode too, so that no rung starts under
        them)."""
        episode = self.reconciler.episodes.get(observed.name)
        if episode is not None and episode.phase is Phase.DRAINING:
            moving = self.pods.to_move(observed.name, episode.gpus)
            blocked = observed.name in self.applier.drains_blocked
            return dataclasses.replace(observed, pods_to_move=moving, drain_blocked=blocked)
        if episode is not None and episode.phase is not Phase.QUARANTINED:
            return observed
        protected_by = self.pods.protected_by(observed.name, now)
        if deferred_repair(observed):
            running = self.pods.on_gpus(observed.name, named_gpus(observed))
            return dataclasses.replace(observed, pods_on_gpus=running, protected_by=protected_by)
        return (
            dataclasses.replace(observed, protected_by=protected_by) if protected_by else observed
        )
