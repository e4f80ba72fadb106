"""Moving work off a node (or off some of its GPUs): pick the pods, evict or kill them.

Eviction goes through the ``policy/v1`` Eviction API so PodDisruptionBudgets hold; a 429
is reported as *blocked* and left to the caller's backoff (a drain is a loop of short
calls, never a long sleep in here). The API server marks evicted pods with the
``DisruptionTarget`` condition itself. ``kill_pods`` (the KILL_JOB rung) deletes without
asking the budget, so it writes that condition first: a Job's ``podFailurePolicy`` matches
it and does not count our repair against the job's ``backoffLimit``.

Pods are picked as ``kubectl drain`` does: DaemonSet pods (recreated on the spot) and
mirror pods (static, owned by the kubelet) are skipped, and so are pods already terminating
or finished. Every delete carries the pod's UID as a precondition, so a StatefulSet pod
recreated under the same name (perhaps on a healthy node) is never hit by a call meant for
its predecessor.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum

from gpuguard.contract.gpu_ids import gpus_in_common
from gpuguard.contract.keys import GPU_IDS_ANNOTATION
from gpuguard.contract.times import format_time
from gpuguard.kube.rest import (
    PODS,
    Json,
    KubeApi,
    KubeConflict,
    KubeNotFound,
    KubeStatusError,
    KubeThrottled,
)

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
DISRUPTION_TARGET = "DisruptionTarget"
KILL_REASON = "DeletionByGpuguard"
# The API server retries an eviction's UID conflict for about ten seconds before it answers.
EVICTION_TIMEOUT_S = 30.0
_GPU_RESOURCE = re.compile(r"^nvidia\.com/(gpu|mig-.+)$")
EVICTION_PARALLELISM = 8


class EvictionOutcome(StrEnum):
    EVICTED = "Evicted"  # deletion started (the pod may take its grace period to go)
    GONE = "Gone"  # the pod (with that UID) no longer exists: nothing left to do
    BLOCKED = "Blocked"  # 429: a PodDisruptionBudget does not allow it now; retry later
    FAILED = "Failed"  # refused for another reason (forbidden, several budgets, ...)


@dataclass(frozen=True)
class DrainCounts:
    """What one pass over some pods achieved; ``problems`` says why for blocked/failed."""

    evicted: int = 0  # evicted, deleted, or already gone
    blocked: int = 0
    failed: int = 0
    problems: tuple[str, ...] = field(default=())


def pods_on_node(api: KubeApi, node: str) -> list[Json]:
    """Every pod bound to ``node``, in all namespaces."""
    return api.list(PODS.path(), field_selector=f"spec.nodeName={node}").items


def is_daemonset_pod(pod: Json) -> bool:
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(owner.get("kind") == "DaemonSet" for owner in owners)


def is_mirror_pod(pod: Json) -> bool:
    return MIRROR_ANNOTATION in ((pod.get("metadata") or {}).get("annotations") or {})


def is_terminating(pod: Json) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def is_finished(pod: Json) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def requests_gpus(pod: Json) -> bool:
    """Some container asks for ``nvidia.com/gpu`` (or a MIG slice) in requests or limits,
    or the pod holds resource claims (DRA): which devices a claim was given is not on the
    pod, so a claim counts as GPUs, the safe side (a reset waits for it)."""
    spec = pod.get("spec") or {}
    if spec.get("resourceClaims"):
        return True
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = container.get("resources") or {}
        for amounts in (resources.get("requests") or {}, resources.get("limits") or {}):
            if any(_GPU_RESOURCE.match(name) and str(n) != "0" for name, n in amounts.items()):
                return True
    return False


def is_on_gpus(pod: Json, gpus: Collection[str]) -> bool:
    """Whether the pod may be using one of ``gpus`` (PCI bus ids or UUIDs).

    With the ``gpuguard.io/gpu-ids`` annotation: when its ids intersect ``gpus``. Without
    it, or when its ids are of a kind ``gpus`` does not name (UUIDs against bus ids), we
    cannot tell, so any pod requesting GPUs counts: moving one pod too many costs a restart,
    one too few resets a GPU under a running job.
    """
    annotation = ((pod.get("metadata") or {}).get("annotations") or {}).get(GPU_IDS_ANNOTATION)
    if annotation is not None:
        common = gpus_in_common(annotation.split(","), gpus)
        if common is not None:
            return bool(common)
    return requests_gpus(pod)


def evictable_pods(pods: Iterable[Json], gpus: Collection[str] = ()) -> list[Json]:
    """The pods a drain must move: all evictable ones, or those on ``gpus`` if given."""
    return [
        pod
        for pod in pods
        if is_movable(pod) and not is_terminating(pod) and (not gpus or is_on_gpus(pod, gpus))
    ]


def pods_still_to_move(pods: Iterable[Json], gpus: Collection[str] = ()) -> list[Json]:
    """Like :func:`evictable_pods`, plus those already terminating: their containers may
    still hold the GPU, so the drain is not finished until they are gone."""
    return [pod for pod in pods if is_movable(pod) and (not gpus or is_on_gpus(pod, gpus))]


def evictable_count(api: KubeApi, node: str, gpus: Collection[str] = ()) -> int:
    """The policy's ``pods_to_move``: pods on ``node`` (or its ``gpus``) not gone yet."""
    return len(pods_still_to_move(pods_on_node(api, node), gpus))


def gpu_pods_on(pods: Iterable[Json], gpus: Collection[str] = ()) -> int:
    """The policy's ``pods_on_gpus``: of ``pods``, those that may use ``gpus`` (every pod
    requesting a GPU when none is named), terminating ones included: a deferred repair
    waits for them to end."""
    return sum(1 for pod in pods if is_movable(pod) and is_on_gpus(pod, gpus))


def evict(api: KubeApi, pod: Json, *, grace_period_s: int | None = None) -> EvictionOutcome:
    """One Eviction. Connection failures raise :class:`KubeUnavailable` (stop the pass);
    answers from the server become an outcome.

    The pod is read first: the API server counts an eviction against the budget before it
    checks the delete's preconditions, so evicting a stale pod (replaced under the same
    name) would spend a disruption the budget then lacks for a real one."""
    current = _same_pod_now(api, pod)
    if current is None:
        return EvictionOutcome.GONE
    if is_terminating(current) and grace_period_s is None:
        return EvictionOutcome.EVICTED  # its deletion is already under way
    try:
        api.create(
            _eviction_path(current),
            _eviction(current, grace_period_s),
            timeout_s=EVICTION_TIMEOUT_S,
        )
    except KubeThrottled:
        return EvictionOutcome.BLOCKED
    except (KubeNotFound, KubeConflict):
        return EvictionOutcome.GONE  # replaced in the instant since the read
    except KubeStatusError:
        return EvictionOutcome.FAILED
    return EvictionOutcome.EVICTED


def evict_pods(
    api: KubeApi,
    pods: Iterable[Json],
    *,
    grace_period_s: int | None = None,
    parallelism: int = EVICTION_PARALLELISM,
) -> DrainCounts:
    """Evict each pod once; call again (with backoff) while anything is blocked.

    Several at once: each eviction waits on the API server's consistent read of the
    namespace's PodDisruptionBudgets (tens of ms), so one at a time caps a drain near
    ten pods a second."""
    evicted = blocked = failed = 0
    problems: list[str] = []
    pods = list(pods)
    with ThreadPoolExecutor(max_workers=max(1, min(parallelism, len(pods) or 1))) as pool:
        outcomes = list(pool.map(lambda p: evict(api, p, grace_period_s=grace_period_s), pods))
    for pod, outcome in zip(pods, outcomes, strict=True):
        if outcome in (EvictionOutcome.EVICTED, EvictionOutcome.GONE):
            evicted += 1
            continue
        blocked += outcome is EvictionOutcome.BLOCKED
        failed += outcome is EvictionOutcome.FAILED
        problems.append(f"{_pod_ref(pod)}: {outcome}")
    return DrainCounts(evicted, blocked, failed, tuple(problems))


def kill_pods(
    api: KubeApi,
    pods: Iterable[Json],
    reason: str,
    *,
    now: float,
    grace_period_s: int | None = None,
) -> DrainCounts:
    """Delete each pod, budgets notwithstanding, after marking it ``DisruptionTarget``
    as of ``now`` (the caller's clock, epoch seconds)."""
    stamp = format_time(float(int(now)))
    condition = {
        "type": DISRUPTION_TARGET,
        "status": "True",
        "reason": KILL_REASON,
        "message": reason[:1024],
        "lastTransitionTime": stamp,
    }
    deleted = failed = 0
    problems: list[str] = []
    for pod in pods:
        metadata = pod["metadata"]
        name, namespace = metadata["name"], metadata["namespace"]
        options: Json = {"preconditions": {"uid": metadata["uid"]}}
        if grace_period_s is not None:
            options["gracePeriodSeconds"] = grace_period_s
        # The UID in the patch makes it fail (422) on a new pod that took the name.
        patch = {"metadata": {"uid": metadata["uid"]}, "status": {"conditions": [condition]}}
        try:
            api.patch(PODS.path(name, namespace=namespace, sub="status"), patch, "strategic")
            api.delete(PODS.path(name, namespace=namespace), options)
        except (KubeNotFound, KubeConflict):
            pass  # gone already (or replaced by a new pod of that name): nothing to kill
        except KubeStatusError as exc:
            if not _is_gone(api, pod):
                failed += 1
                problems.append(f"{_pod_ref(pod)}: {exc}")
                continue
        deleted += 1
    return DrainCounts(evicted=deleted, failed=failed, problems=tuple(problems))


def is_movable(pod: Json) -> bool:
    """Not a DaemonSet's or a mirror pod, and not finished: a drain has to move it."""
    return not (is_daemonset_pod(pod) or is_mirror_pod(pod) or is_finished(pod))


def _eviction_path(pod: Json) -> str:
    metadata = pod["metadata"]
    return PODS.path(metadata["name"], namespace=metadata["namespace"], sub="eviction")


def _eviction(pod: Json, grace_period_s: int | None) -> Json:
    metadata = pod["metadata"]
    options: Json = {"preconditions": {"uid": metadata["uid"]}}
    if grace_period_s is not None:
        options["gracePeriodSeconds"] = grace_period_s
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": metadata["name"], "namespace": metadata["namespace"]},
        "deleteOptions": options,
    }


def _same_pod_now(api: KubeApi, pod: Json) -> Json | None:
    """The pod as it is now, or None when it is gone or another pod took its name."""
    metadata = pod["metadata"]
    try:
        now = api.get(PODS.path(metadata["name"], namespace=metadata["namespace"]))
    except KubeNotFound:
        return None
    return now if now["metadata"].get("uid") == metadata["uid"] else None


def _is_gone(api: KubeApi, pod: Json) -> bool:
    return _same_pod_now(api, pod) is None


def _pod_ref(pod: Json) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
