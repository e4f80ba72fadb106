"""Failed training pods judged, and the pods on a node at fault marked before they fail.

A training pod's failure that the infrastructure caused gets the pod condition
``gpuguard.io/InfrastructureFailure=True`` (reason: the cause), an Event and a count, so
that its Job's ``podFailurePolicy`` (``onPodConditions``) ignores it (docs/attribution.md).
The Job controller judges a pod the moment it fails, so a condition written after the
failure only wins when the Job controller has not got to it yet; the pods still running
on a node with an open episode are therefore marked *before* they fail, and the in-pod
path (``gpuguard run``'s infrastructure exit code) covers the rest.

A failure nothing explains is remembered against its node (``CrashMemory``); a node
where pods of different jobs keep crashing becomes suspect: the ``crashes`` layer of its
observation, an Event and the ``gpuguard_controller_crash_suspect`` gauge.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable

from gpuguard.contract.keys import INFRASTRUCTURE_FAILURE_CONDITION
from gpuguard.contract.report import LayerReport
from gpuguard.contract.times import format_time, parse_time
from gpuguard.controller.events import EventRecorder
from gpuguard.controller.metrics import ControllerMetrics
from gpuguard.controller.pod_failures import condition_true, failure_of, training_job
from gpuguard.kube.errors import KubeError
from gpuguard.kube.rest import Json, KubeApi, KubeConflict, KubeNotFound
from gpuguard.remediation.attribution import (
    Attribution,
    Cause,
    NodeAtFailure,
    SelfReportedLimit,
    attribute,
)
from gpuguard.remediation.crash_memory import (
    CRASH_LAYER,
    Crash,
    CrashMemory,
    Suspicion,
    crash_layer,
)
from gpuguard.remediation.model import NodeObservation
from gpuguard.remediation.policy import Policy

log = logging.getLogger("gpuguard.controller")
PODS_PATH = "/api/v1/namespaces/{namespace}/pods/{name}/status"
# A pod judged (or marked) is remembered this long: longer than a training pod runs
# between being marked and failing, or stays listed once failed, in practice.
KEEP_S = 7 * 86400.0
MESSAGE_LIMIT = 1024
NOT_CHARGED = "InfrastructureFailure"  # the Event's reason for an attributed failure
CHARGED = "JobCharged"  # the Event's reason: attributed, but the Job has no rule for it
SUSPECT = "CrashesAcrossJobs"


class Attributor:
    def __init__(
        self,
        api: KubeApi,
        events: EventRecorder,
        metrics: ControllerMetrics,
        policy: Policy,
        *,
        dry_run: bool = False,
    ) -> None:
        self.api = api
        self.events = events
        self.metrics = metrics
        self.policy = policy
        self.dry_run = dry_run  # judged, counted and told; no condition written
        self.memory = CrashMemory(policy)
        rules = policy.attribution
        self.self_reported = SelfReportedLimit(
            rules.self_reported, rules.self_reported_window_s, rules.window_s
        )
        self._lock = threading.Lock()  # the pod and job watches feed, the pass judges
        self._pending: dict[str, Json] = {}  # uid -> slim failed pod
        self._judged: dict[str, float] = {}  # uid -> when its failure was judged
        self._marked: dict[str, float] = {}  # uid -> when marked ahead, while it ran
        self._now = 0.0  # the last pass's time
        self._lost: dict[str, list[tuple[str, float]]] = {}  # job -> (pod, failed at)
        self._no_rule: set[str] = set()  # batch Jobs (namespace/name) without podFailurePolicy
        self._warned: set[str] = set()
        self._series: set[str] = set()  # nodes with a crash_suspect series

    # --- fed by the watches -----------------------------------------------------------
    def take_pod(self, pod: Json) -> bool:
        """A pod as the watch shows it; True when a failure now waits to be judged."""
        if not self.policy.attribution.enabled or not training_job(pod):
            return False
        uid = pod["metadata"]["uid"]
        with self._lock:
            if pod["status"].get("phase") != "Failed" or uid in self._judged:
                return False
            marked = _marked_reason(pod) or ("Marked" if uid in self._marked else None)
            if marked is not None:  # marked ahead, by this leader or an earlier one
                self._judged[uid] = self._now
                self.metrics.pod_failures.labels("true", marked).inc()
                return False
            self._pending[uid] = pod
        return True

    def take_job(self, job: Json, deleted: bool = False) -> None:
        metadata = job.get("metadata") or {}
        name = f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
        with self._lock:
            if deleted or job.get("podFailurePolicy", True):
                self._no_rule.discard(name)
            else:
                self._no_rule.add(name)

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    # --- in the leader's pass ---------------------------------------------------------
    def judge(self, node_at: Callable[[str], NodeAtFailure], now: float) -> set[str]:
        """Judge every failure waiting; the nodes whose suspicion it raised."""
        with self._lock:
            self._now = now
            waiting = list(self._pending.values())
            self._pending.clear()
        raised: set[str] = set()
        # Earliest first: a rank that lost its peer is judged after the peer.
        failures = sorted(((failure_of(pod, now), pod) for pod in waiting), key=lambda f: f[0].at)
        for failure, pod in failures:
            window = self.policy.attribution.window_s
            peers = [
                peer
                for peer, at in self._lost.get(failure.job, [])
                if peer != failure.pod and failure.at - window <= at <= failure.at
            ]
            verdict = attribute(failure, node_at(failure.node), window, peers)
            verdict = self.self_reported.judge(failure.job, verdict, failure.at)
            self.metrics.pod_failures.labels(
                str(verdict.infrastructure).lower(), verdict.reason
            ).inc()
            if verdict.infrastructure:
                self._lost.setdefault(failure.job, []).append((failure.pod, failure.at))
                # Long over when first seen (a new leader lists the cluster): no Job
                # controller waits on it, and a write per old pod would stall the pass.
                if now - failure.at <= window:
                    self._excuse(pod, verdict, now)
            elif verdict.unexplained and failure.node:
                suspicion = self.memory.record(Crash(failure.node, failure.job, failure.at))
                if suspicion is not None:
                    self._suspect(suspicion, now)
                    raised.add(failure.node)
            with self._lock:
                self._judged[pod["metadata"]["uid"]] = now
        self._forget_before(now)
        return raised

    def mark_ahead(self, pods: Iterable[Json], cause: Cause, why: str, now: float) -> None:
        """Mark running training pods of a node at fault (or lost), before they fail."""
        for pod in pods:
            uid = pod["metadata"]["uid"]
            if uid in self._marked or uid in self._judged or not training_job(pod):
                continue
            if condition_true(pod, INFRASTRUCTURE_FAILURE_CONDITION) or self._write(
                pod, str(cause), why, now
            ):
                with self._lock:
                    self._marked[uid] = now

    def layer(self, node: str, now: float) -> tuple[str, LayerReport] | None:
        """The ``crashes`` layer of the node's observation while a suspicion stands."""
        suspicion = self.memory.suspicion(node, now)
        return crash_layer(suspicion) if suspicion is not None else None

    def suspects(self, now: float) -> list[Suspicion]:
        found = (self.memory.suspicion(node, now) for node in self.memory.nodes())
        return [suspicion for suspicion in found if suspicion is not None]

    def forget_node(self, node: str) -> None:
        """The machine left (replaced, deleted): its crashes say nothing of the next."""
        self.memory.clear(node)
        if node in self._series:
            self._series.discard(node)
            self.metrics.crash_suspect.remove(node)

    # --- writing ----------------------------------------------------------------------
    def _excuse(self, pod: Json, verdict: Attribution, now: float) -> None:
        """Mark the failed pod (too late for a Job that already counted it, but recorded)
        and tell: once per Job that has no rule to ignore it, on every pod otherwise."""
        metadata = pod["metadata"]
        self._write(pod, str(verdict.cause), verdict.detail, now)
        owner = _batch_job(pod)
        if owner in self._no_rule:
            note = (
                f"the infrastructure ended it ({verdict.detail}), but Job {owner} has no "
                "podFailurePolicy: the Job pays for it (examples/jobs/job.yaml)"
            )
            if owner not in self._warned:
                self._warned.add(owner)
                self.events.about_pod(pod, CHARGED, note, now, warning=True)
        else:
            note = f"the infrastructure's, not job {training_job(pod)}'s: {verdict.detail}"
            if self.dry_run:
                note = f"dry run, not marked: {note}"
            self.events.about_pod(pod, NOT_CHARGED, note, now, warning=False)
        log.info("pod %s/%s: %s", metadata["namespace"], metadata["name"], note)

    def _write(self, pod: Json, reason: str, message: str, now: float) -> bool:
        if self.dry_run:
            return True
        metadata = pod["metadata"]
        condition = {
            "type": INFRASTRUCTURE_FAILURE_CONDITION,
            "status": "True",
            "reason": reason,
            "message": message[:MESSAGE_LIMIT],
            "lastTransitionTime": format_time(now),
        }
        # The UID in the patch makes it fail on a new pod that took the name.
        patch = {"metadata": {"uid": metadata["uid"]}, "status": {"conditions": [condition]}}
        path = PODS_PATH.format(namespace=metadata["namespace"], name=metadata["name"])
        try:
            self.api.patch(path, patch, "strategic")
        except (KubeNotFound, KubeConflict):
            return True  # gone, or another pod by now: nothing left to mark
        except KubeError as exc:
            log.warning("pod %s/%s not marked: %s", metadata["namespace"], metadata["name"], exc)
            return False
        return True

    def _suspect(self, suspicion: Suspicion, now: float) -> None:
        jobs = ", ".join(suspicion.jobs)
        window = self.policy.crashes.window_s
        then = "replaced (it was suspect before)" if suspicion.repeats > 1 else "deep-checked"
        note = (
            f"pods of {len(suspicion.jobs)} different jobs ({jobs}) crashed on it within "
            f"{window:g}s with no cause found: quarantined and {then}"
        )
        log.warning("node %s: %s", suspicion.node, note)
        self.events.about_node(suspicion.node, SUSPECT, note, now)

    def publish(self, now: float) -> None:
        """The gauge: one series per node a suspicion holds."""
        standing = {s.node: len(s.jobs) for s in self.suspects(now)}
        for node in list(self._series):
            if node not in standing:
                self.metrics.crash_suspect.remove(node)
                self._series.discard(node)
        for node, jobs in standing.items():
            self.metrics.crash_suspect.labels(node).set(jobs)
            self._series.add(node)

    def _forget_before(self, now: float) -> None:
        with self._lock:
            self._judged = {uid: at for uid, at in self._judged.items() if now - at < KEEP_S}
            self._marked = {uid: at for uid, at in self._marked.items() if now - at < KEEP_S}
        self.self_reported.forget_before(now)
        window = self.policy.attribution.window_s
        self._lost = {
            job: kept
            for job, lost in self._lost.items()
            if (kept := [(pod, at) for pod, at in lost if now - at < 2 * window])
        }


def _marked_reason(pod: Json) -> str | None:
    """The reason of the pod's gpuguard.io/InfrastructureFailure=True, if it has one."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == INFRASTRUCTURE_FAILURE_CONDITION and (
            condition.get("status") == "True"
        ):
            return str(condition.get("reason") or "Marked")
    return None


def _batch_job(pod: Json) -> str:
    metadata = pod["metadata"]
    for owner in metadata.get("ownerReferences") or []:
        if owner.get("kind") == "Job":
            return f"{metadata['namespace']}/{owner.get('name', '')}"
    return ""


def node_at(node: Json | None, observed: NodeObservation | None) -> NodeAtFailure:
    """The (slim) Node as attribution reads it: there, Ready, and its layers."""
    if node is None:
        return NodeAtFailure(exists=False)
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    since = None
    if ready is not None:
        try:
            since = parse_time(str(ready.get("lastTransitionTime", "")))
        except ValueError:
            since = None  # not Ready since an unknown time: counted as lost
    return NodeAtFailure(
        ready=ready is None or ready.get("status") == "True",
        not_ready_since=since,
        layers=tuple(observed.layers.values()) if observed is not None else (),
    )


def with_crash_layer(
    observed: NodeObservation, layer: tuple[str, LayerReport] | None, own: str = CRASH_LAYER
) -> NodeObservation:
    """The observation with crash memory's layer (or the controller's ``own`` other, the
    preflight's) in place of any it had (none: removed)."""
    if layer is None and own not in observed.layers:
        return observed
    layers = {name: kept for name, kept in observed.layers.items() if name != own}
    if layer is not None:
        layers[layer[0]] = layer[1]
    return dataclasses.replace(observed, layers=layers)
