"""Carrying out the policy's decisions, in order, through the Kubernetes API.

Decisions for one node are applied in the order the policy gave them: the RECORD that
writes a phase change comes before the action it leads to. If a write fails, the node's
remaining decisions wait for the next reconcile, so nothing acts on an unrecorded phase.
In dry-run the RECORDs and Events are written and nothing else.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from gpuguard import logs
from gpuguard.contract.keys import POSITION_FIXED_ANNOTATION, VERIFY_REQUEST_ANNOTATION
from gpuguard.controller.events import EventRecorder
from gpuguard.controller.evidence_gate import EvidenceGate
from gpuguard.controller.metrics import ControllerMetrics
from gpuguard.controller.providers import Provider
from gpuguard.kube import drain, fleet
from gpuguard.kube.errors import KubeError, KubeFenced
from gpuguard.kube.remediations import object_name, save_episode, set_request
from gpuguard.kube.rest import NODES, Json, KubeApi
from gpuguard.remediation.model import Decision, DecisionKind, Episode, Plan
from gpuguard.remediation.reconciler import Actuator

log = logging.getLogger("gpuguard.controller")
# Concurrent API writes per reconcile: nodes in parallel, each node's steps in order.
PARALLELISM = 16
Kind = DecisionKind
# Re-sent on every pass until done (idempotent): logged at DEBUG, or a pass would log them
# all again; the step and Event of the phase change that began them say it once.
RESENT = frozenset({Kind.EVICT_PODS, Kind.REQUEST_ACTION, Kind.REQUEST_VERIFY, Kind.REPLACE})
# The decisions that write the Node itself (taint, cordon and their undoing).
_NODE_WRITES: dict[Kind, Callable[[KubeApi, Json], object]] = {
    Kind.TAINT: fleet.taint,
    Kind.UNTAINT: fleet.untaint,
    Kind.CORDON: fleet.cordon,
    Kind.UNCORDON: fleet.uncordon,
}


def counted_write(
    metrics: ControllerMetrics, kind: str, node: str, write: Callable[[], object]
) -> bool:
    """One write of ``kind`` on ``node``, counted by result; False when it was not done:
    fenced (a replica that lost the Lease, said quietly) or failed (the next pass
    decides it again)."""
    try:
        write()
    except KubeFenced as exc:
        metrics.actions.labels(kind, "fenced").inc()
        log.debug("%s on %s not done: %s", kind, node, exc)
        return False
    except KubeError as exc:
        metrics.actions.labels(kind, "error").inc()
        log.warning("%s on %s failed, the next pass retries: %s", kind, node, exc)
        return False
    metrics.actions.labels(kind, "ok").inc()
    return True


class Applier:
    def __init__(
        self,
        api: KubeApi,
        provider: Provider,
        events: EventRecorder,
        metrics: ControllerMetrics,
        *,
        dry_run: bool = False,
    ) -> None:
        self.api = api
        self.provider = provider
        self.events = events
        self.metrics = metrics
        self.dry_run = dry_run
        # How TAINT and the other node writes are done (per-GPU quarantine replaces two).
        self.node_writes: dict[Kind, Callable[[KubeApi, Json], object]] = dict(_NODE_WRITES)
        # NodeRemediation name -> the resourceVersion last seen (watch, list, own writes):
        # each episode write is conditional on it.
        self.versions: dict[str, str] = {}
        self.evictions_blocked = False  # set by a pass whose evictions a budget refused
        # Nodes whose last round of evictions a budget refused, every one (no other failure).
        self.drains_blocked: set[str] = set()
        self.evidence: EvidenceGate | None = None  # RMA evidence before REPLACE: off

    def note_version(self, name: str, version: str) -> None:
        """Remember ``version`` unless an answer seen earlier was already newer (a watch
        event may arrive after the response to the write that caused it)."""
        known = self.versions.get(name, "")
        if known.isdigit() and version.isdigit() and int(version) < int(known):
            return
        self.versions[name] = version

    def note_object(self, obj: Json) -> None:
        metadata = obj.get("metadata") or {}
        if metadata.get("name") and metadata.get("resourceVersion"):
            self.note_version(str(metadata["name"]), str(metadata["resourceVersion"]))

    def forget_version(self, obj: Json) -> None:
        self.versions.pop(str((obj.get("metadata") or {}).get("name", "")), None)

    def for_pass(self, nodes: Mapping[str, Json], now: float) -> Actuator:
        """The reconciler's actuator for one pass: ``nodes`` are the slim Nodes it may
        write to (their resourceVersions guard the writes), ``now`` the pass's time."""
        return _Pass(self, nodes, now)

    def apply(
        self, plan: Plan, nodes: Mapping[str, Json], now: float, opened: Collection[str] = ()
    ) -> set[str]:
        """Apply every decision; returns the nodes where a write failed.

        ``opened``: nodes whose episode this plan opens (their object is created outright).
        Taints go first, all at once: quarantine is the latency that matters, and a taint
        ahead of its record is safe (a new leader finds the node unhealthy and tainted, and
        opens the episode). Then each node's decisions run in order, nodes in parallel.
        """
        by_node: dict[str, list[Decision]] = defaultdict(list)
        taints: list[Decision] = []
        for decision in plan.decisions:
            (taints if decision.kind is Kind.TAINT else by_node[decision.node]).append(decision)

        def one(decision: Decision) -> bool:
            return self._try(decision, plan, nodes, now, decision.node in opened)

        def in_order(decisions: list[Decision]) -> bool:
            return all(one(d) for d in decisions)  # stops at the first failure

        with ThreadPoolExecutor(max_workers=PARALLELISM) as pool:
            failed = {d.node for d, ok in zip(taints, pool.map(one, taints), strict=True) if not ok}
            done = pool.map(in_order, by_node.values())
            failed |= {n for n, ok in zip(by_node, done, strict=True) if not ok}
        return failed

    def _try(
        self, decision: Decision, plan: Plan, nodes: Mapping[str, Json], now: float, new: bool
    ) -> bool:
        episode = plan.episodes.get(decision.node)
        done = counted_write(
            self.metrics,
            str(decision.kind),
            decision.node,
            lambda: self._apply(decision, episode, nodes, now, new),
        )
        if done and decision.kind is not Kind.RECORD:
            name = None if episode is None else object_name(episode.node, episode.opened_at)
            log.log(
                logging.DEBUG if decision.kind in RESENT else logging.INFO,
                "%s%s %s: %s",
                "dry-run: " if self.dry_run else "",
                decision.kind,
                decision.node,
                decision.reason,
                extra=logs.about(decision.node, name),
            )
        return done

    def _evict(self, decision: Decision) -> None:
        pods = drain.evictable_pods(drain.pods_on_node(self.api, decision.node), decision.gpus)
        counts = drain.evict_pods(self.api, pods)
        self._count_evictions(counts)
        if counts.blocked and not counts.failed:
            self.drains_blocked.add(decision.node)
        else:
            self.drains_blocked.discard(decision.node)

    def _apply(
        self,
        decision: Decision,
        episode: Episode | None,
        nodes: Mapping[str, Json],
        now: float,
        new: bool,
    ) -> None:
        if decision.kind is Kind.RECORD:
            if episode is not None:
                self._save(episode, new)
                self.events.record(episode, decision, now)
            return
        if self.dry_run:
            return  # logged as done, "dry-run: " first
        node = nodes.get(decision.node)
        write = self.node_writes.get(decision.kind)
        if write is not None:
            if node is not None:
                write(self.api, node)
            return
        match decision.kind:
            case Kind.EVICT_PODS:
                self._evict(decision)
            case Kind.KILL_PODS:
                on_node = drain.pods_on_node(self.api, decision.node)
                pods = drain.evictable_pods(on_node, decision.gpus)
                gpu_pods = [p for p in pods if drain.requests_gpus(p)]
                drain.kill_pods(self.api, gpu_pods, decision.reason, now=now)
            case Kind.REQUEST_ACTION:
                if episode is not None and decision.action is not None:
                    version = set_request(
                        self.api, episode, decision.action, decision.attempt, decision.gpus, now
                    )
                    if version:
                        self.note_version(object_name(episode.node, episode.opened_at), version)
            case Kind.REPLACE:
                if self.evidence is None or self.evidence.ready(decision.node, now):
                    self.provider.replace(decision.node)
            case Kind.REQUEST_VERIFY:
                if decision.request is not None:
                    self._annotate(decision.node, VERIFY_REQUEST_ANNOTATION, decision.request)
            case Kind.CLEAR_VERIFY:
                self._annotate(decision.node, VERIFY_REQUEST_ANNOTATION, None)
            case Kind.CLEAR_POSITION_FIXED:
                self._annotate(decision.node, POSITION_FIXED_ANNOTATION, None)

    def save(self, episode: Episode) -> bool:
        """Write a change to an episode outside a pass's decisions; False if it failed
        (fenced, a conflict, the API down): the caller tries again later."""
        try:
            self._save(episode, new=False)
        except KubeError as exc:
            log.warning("saving the episode of %s failed: %s", episode.node, exc)
            return False
        return True

    def _save(self, episode: Episode, new: bool) -> None:
        name = object_name(episode.node, episode.opened_at)
        known = "" if new else self.versions.get(name, "")
        version = save_episode(self.api, episode, new=new, resource_version=known)
        self.note_version(name, version)

    def _annotate(self, node: str, key: str, value: str | None) -> None:
        """Set (or remove) one annotation of ours: a merge patch of that one key, so a
        repeated decision writes the same value and nothing of the agent's is touched."""
        patch = {"metadata": {"annotations": {key: value}}}
        self.api.patch(NODES.path(node), patch)

    def _count_evictions(self, counts: drain.DrainCounts) -> None:
        self.evictions_blocked |= counts.blocked > 0
        self.metrics.evictions.labels("evicted").inc(counts.evicted)
        self.metrics.evictions.labels("blocked").inc(counts.blocked)
        self.metrics.evictions.labels("failed").inc(counts.failed)
        for problem in counts.problems:
            log.info("eviction: %s", problem)


@dataclass(frozen=True)
class _Pass:
    applier: Applier
    nodes: Mapping[str, Json]
    now: float

    def apply(self, plan: Plan, opened: Collection[str]) -> set[str]:
        return self.applier.apply(plan, self.nodes, self.now, opened)
