"""The pods on each node, kept from a watch: how a drain and a deferred repair progress.

A draining node's episode waits for its pods to leave, and a deferred repair (drain and
reset) for the pods on its GPUs to finish; both are counted here from a slim copy of
every pod, so that a pass needs no pod LIST and a pod leaving wakes the controller.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Collection

from gpuguard.contract.keys import DO_NOT_DISRUPT, GPU_IDS_ANNOTATION
from gpuguard.controller.pod_failures import JOB_LABELS, judged_conditions, terminations
from gpuguard.controller.preflight_pods import preflight_parts
from gpuguard.kube import drain
from gpuguard.kube.do_not_disrupt import protects
from gpuguard.kube.rest import Json, WatchEvent
from gpuguard.kube.watch import Snapshot

_KEPT_ANNOTATIONS = (drain.MIRROR_ANNOTATION, GPU_IDS_ANNOTATION, DO_NOT_DISRUPT)


def slim_pod(pod: Json) -> Json:
    """What the drain rules read of a pod: owners, the kept annotations, deletion, the
    containers' GPU resources and the resource claims' names (DRA: they may hold GPUs),
    the phase and the start (a timed do-not-disrupt); and what attribution reads: the
    job's labels, the conditions that judge a failure, and a failed pod's container
    endings; and what the preflight gate left (preflight_pods.py)."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = metadata.get("annotations") or {}
    full_status = pod.get("status") or {}
    status: Json = {"phase": full_status.get("phase", "")}
    if "startTime" in full_status:
        status["startTime"] = full_status["startTime"]
    labels = metadata.get("labels") or {}
    kept: Json = {
        "name": metadata.get("name", ""),
        "namespace": metadata.get("namespace", ""),
        "uid": metadata.get("uid", ""),
        "resourceVersion": metadata.get("resourceVersion", ""),
        "ownerReferences": [
            {"kind": owner.get("kind", ""), "name": owner.get("name", "")}
            for owner in metadata.get("ownerReferences") or []
        ],
        "annotations": {k: annotations[k] for k in _KEPT_ANNOTATIONS if k in annotations},
        "labels": {k: labels[k] for k in JOB_LABELS if k in labels},
    }
    conditions = judged_conditions(full_status)
    if conditions:
        status["conditions"] = conditions
    if status["phase"] == "Failed":
        status["containerStatuses"] = terminations(full_status)
    if metadata.get("deletionTimestamp"):
        kept["deletionTimestamp"] = metadata["deletionTimestamp"]
    gate_metadata, gate_status = preflight_parts(pod)
    kept.update(gate_metadata)
    status.update(gate_status)
    slim_spec: Json = {
        "nodeName": spec.get("nodeName", ""),
        "containers": _resources(spec.get("containers")),
        "initContainers": _resources(spec.get("initContainers")),
    }
    claims = _claims(spec)
    if claims:  # most pods have none: no empty list kept for each
        slim_spec["resourceClaims"] = [{"name": c.get("name", "")} for c in claims]
    return {"metadata": kept, "spec": slim_spec, "status": status}


def _resources(containers: object) -> list[Json]:
    if not isinstance(containers, list):
        return []
    return [{"resources": c.get("resources") or {}} for c in containers if isinstance(c, dict)]


def _claims(spec: Json) -> list[Json]:
    claims = spec.get("resourceClaims")
    return [c for c in claims if isinstance(c, dict)] if isinstance(claims, list) else []


def _counted_as(pod: Json) -> tuple[bool, bool, str | None, str | None]:
    """What the counts read of a pod: whether a drain moves it, whether it asks for GPUs,
    the GPUs it names and its do-not-disrupt."""
    annotations = pod["metadata"]["annotations"]
    return (
        drain.is_movable(pod),
        drain.requests_gpus(pod),
        annotations.get(GPU_IDS_ANNOTATION),
        annotations.get(DO_NOT_DISRUPT),
    )


class PodCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_node: dict[str, dict[str, Json]] = defaultdict(dict)  # node -> uid -> pod
        self._node_of: dict[str, str] = {}  # uid -> node

    def take(self, item: Snapshot | WatchEvent) -> set[str]:
        """Fold a watch item in; returns the nodes whose counts it may have changed (a
        pod arriving, leaving, finishing, or changing the GPUs it names). A snapshot
        changes every count: the caller looks at everything again anyway."""
        with self._lock:
            if isinstance(item, Snapshot):
                self._by_node.clear()
                self._node_of.clear()
                for pod in item.items:
                    self._put(pod)
                return set(self._by_node)
            uid = item.object["metadata"]["uid"]
            node = self._node_of.get(uid)
            before = _counted_as(self._by_node[node][uid]) if node is not None else None
            self._drop(uid)
            after_node = self._put(item.object) if item.type != "DELETED" else None
            after = _counted_as(item.object) if after_node is not None else None
            if (node, before) == (after_node, after):
                return set()  # a status update, a label: nothing a count reads
            return {n for n in (node, after_node) if n is not None}

    def to_move(self, node: str, gpus: Collection[str] = ()) -> int:
        """The pods a drain of ``node`` (of ``gpus``, if named) still has to move."""
        with self._lock:
            return len(drain.pods_still_to_move(self._by_node.get(node, {}).values(), gpus))

    def on_gpus(self, node: str, gpus: Collection[str] = ()) -> int:
        """The pods still running on ``gpus`` of ``node`` (every GPU pod when none named)."""
        with self._lock:
            return drain.gpu_pods_on(self._by_node.get(node, {}).values(), gpus)

    def running_on(self, node: str, gpus: Collection[str] = ()) -> list[Json]:
        """The pods running on ``node``: on ``gpus`` if named (or when it cannot be told)."""
        with self._lock:
            pods = self._by_node.get(node, {}).values()
            return [
                pod
                for pod in pods
                if pod["status"].get("phase") == "Running"
                and (not gpus or drain.is_on_gpus(pod, gpus))
            ]

    def protected_by(self, node: str, now: float) -> str:
        """The first pod on ``node`` whose ``karpenter.sh/do-not-disrupt`` holds at ``now``,
        as namespace/name ("": none)."""
        with self._lock:
            for pod in self._by_node.get(node, {}).values():
                if protects(pod, now):
                    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        return ""

    def _put(self, pod: Json) -> str | None:
        node = pod["spec"]["nodeName"]
        if not node:
            return None
        uid = pod["metadata"]["uid"]
        self._by_node[node][uid] = pod
        self._node_of[uid] = node
        return str(node)

    def _drop(self, uid: str) -> str | None:
        node = self._node_of.pop(uid, None)
        if node is not None:
            pods = self._by_node[node]
            pods.pop(uid, None)
            if not pods:
                del self._by_node[node]
        return node
