"""What the preflight gate left on a pod and on a namespace, as the watches keep them.

The slim pod (``pods.py``) keeps, of the gate, only the failed endings of its init
container (exit code, the termination message cut to the kubelet's 4096 bytes, when it
ended; from its state, or its last state while it waits to restart), and for a GPU pod
admitted without the check, when it was created. A namespace is kept as the moment it
was labelled ``NAMESPACE_LABEL=ENABLED`` (from its managed fields), so a pod created
before the label is never counted as one the webhook let through.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuguard.contract.preflight import (
    ENABLED,
    FAILED,
    INIT_CONTAINER,
    MESSAGE_LIMIT,
    NAMESPACE_LABEL,
    NOT_EQUIPPED,
    PREFLIGHT_FAILED,
    SKIP,
    SKIP_LABEL,
    read_result,
)
from gpuguard.contract.times import parse_time
from gpuguard.controller.pod_failures import condition_true
from gpuguard.kube.drain import DISRUPTION_TARGET, requests_gpus
from gpuguard.kube.rest import Json
from gpuguard.remediation.preflight_memory import PreflightFailure

ENDINGS = "preflightEndings"  # in the slim pod's status
UNCHECKED = "uncheckedSince"  # in the slim pod's metadata: its creationTimestamp
_LABEL_FIELD = f"f:{NAMESPACE_LABEL}"


def preflight_parts(pod: Json) -> tuple[Json, Json]:
    """What the slim pod keeps of the gate: (metadata, status) entries to merge in."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    names = {c.get("name") for c in spec.get("initContainers") or [] if isinstance(c, dict)}
    kept_metadata: Json = {}
    labels = metadata.get("labels") or {}
    wants_gpus = requests_gpus(pod)
    if wants_gpus and INIT_CONTAINER not in names and labels.get(SKIP_LABEL) != SKIP:
        kept_metadata[UNCHECKED] = str(metadata.get("creationTimestamp", ""))
    endings = failed_endings(pod.get("status") or {})
    return kept_metadata, ({ENDINGS: endings} if endings else {})


def failed_endings(status: Json) -> list[Json]:
    """The init container's endings with a non-zero exit code: its current state's and
    its last state's (a container waiting to restart, CrashLoopBackOff, keeps it there)."""
    for container in status.get("initContainerStatuses") or []:
        if not isinstance(container, dict) or container.get("name") != INIT_CONTAINER:
            continue
        endings = []
        for state in (container.get("state"), container.get("lastState")):
            ended = state.get("terminated") if isinstance(state, dict) else None
            if not isinstance(ended, dict) or ended.get("exitCode") in (0, None):
                continue
            message = ended.get("message")
            text = message if isinstance(message, str) else ""
            endings.append(
                {
                    "exitCode": ended.get("exitCode"),
                    "reason": str(ended.get("reason", ""))[:128],
                    "message": text.encode()[:MESSAGE_LIMIT].decode(errors="ignore"),
                    "finishedAt": str(ended.get("finishedAt", "")),
                }
            )
        return endings
    return []


@dataclass(frozen=True)
class Read:
    """One failure as read off a pod, and what its result said: ``failed`` (a Failed
    result), ``passed`` (a Passed one with a non-zero exit) or ``none`` (no result)."""

    failure: PreflightFailure
    result: str
    exit_code: object
    reason: str  # the kubelet's: Error, OOMKilled, ...
    message: str


def failures_of(pod: Json, seen_at: float) -> list[Read]:
    """The failures a slim pod's endings tell of: on the pod's node, or on each node a
    gang result names slow. No readable result is a failure all the same (fail closed);
    a check ended by its pod's deletion or eviction, or run from an image without what it
    needs (``NOT_EQUIPPED``), is no verdict on the node."""
    metadata, node = pod["metadata"], str(pod["spec"].get("nodeName") or "")
    if metadata.get("deletionTimestamp") or condition_true(pod, DISRUPTION_TARGET):
        return []
    name = f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
    found = []
    for ending in pod["status"].get(ENDINGS) or []:
        finished = str(ending.get("finishedAt", ""))
        ended = _time(finished, None)
        at = seen_at if ended is None else ended
        key = f"{metadata.get('uid', '')}@{finished or at}"
        result = read_result(ending.get("message"))
        if result is not None and set(result.codes) == {NOT_EQUIPPED}:
            continue  # the image cannot check anything, on any node: the pod says so
        kind = "none" if result is None else ("failed" if result.status == FAILED else "passed")
        codes = (result.codes if result is not None else ()) or (PREFLIGHT_FAILED,)
        gpus = result.gpus if result is not None else ()
        message = result.message if result is not None else ""
        targets = (result.slow_nodes if result is not None else ()) or ((node,) if node else ())
        slow = result is not None and bool(result.slow_nodes)
        for target in targets:
            failure = PreflightFailure(
                target, name, key, at, codes, gpus if target == node else (), slow_link=slow
            )
            reason = str(ending.get("reason", ""))
            found.append(Read(failure, kind, ending.get("exitCode"), reason, message))
    return found


def unchecked_since(pod: Json) -> float | None:
    """When a GPU pod admitted without the check was created (None: checked, skipped,
    without GPUs, or its creation unreadable)."""
    created = pod["metadata"].get(UNCHECKED)
    return _time(created, None) if isinstance(created, str) else None


def slim_namespace(namespace: Json) -> Json:
    """A Namespace as the preflight watch keeps it: its name, and since when it has been
    opted in (``enabledAt``, absent when it is not)."""
    metadata = namespace.get("metadata") or {}
    kept: Json = {
        "metadata": {
            "name": metadata.get("name", ""),
            "resourceVersion": metadata.get("resourceVersion", ""),
        }
    }
    if (metadata.get("labels") or {}).get(NAMESPACE_LABEL) == ENABLED:
        kept["enabledAt"] = labelled_at(metadata)
    return kept


def labelled_at(metadata: Json) -> float | None:
    """When the opt-in label was last written: the latest managed-fields entry owning it
    (None: the API kept no managed fields)."""
    times = []
    for entry in metadata.get("managedFields") or []:
        if not isinstance(entry, dict):
            continue
        owned = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:labels") or {}
        if _LABEL_FIELD in owned:
            at = _time(entry.get("time"), None)
            if at is not None:
                times.append(at)
    return max(times, default=None)


def _time(text: object, default: float | None) -> float | None:
    try:
        return parse_time(text) if isinstance(text, str) else default
    except ValueError:
        return default
