"""Reading a failed training pod: which job it served, how it ended, what judged it.

Everything here reads the slim pod the watch keeps (controller/pods.py), so a failed
pod costs its few container endings, never its whole status. A termination message is
cut to the kubelet's own limit (4096 bytes a container): a status written by hand can
carry anything, and one pod must not fill the controller's memory.
"""

from __future__ import annotations

from gpuguard.contract.keys import GPU_IDS_ANNOTATION, INFRASTRUCTURE_FAILURE_CONDITION
from gpuguard.contract.times import parse_time
from gpuguard.kube.drain import DISRUPTION_TARGET
from gpuguard.kube.rest import Json
from gpuguard.remediation.attribution import PodFailure
from gpuguard.remediation.signatures import classify

# The label naming the job a pod belongs to, most encompassing first: a JobSet's pods
# are also its child Job's, and the gang (the JobSet) is what restarts together.
JOB_LABELS = (
    "jobset.sigs.k8s.io/jobset-name",
    "training.kubeflow.org/job-name",
    "batch.kubernetes.io/job-name",
    "job-name",
)
MESSAGE_LIMIT = 4096  # the kubelet's per-container cap on a termination message
_JUDGING = (DISRUPTION_TARGET, INFRASTRUCTURE_FAILURE_CONDITION)


def training_job(pod: Json) -> str:
    """``namespace/name`` of the job the pod serves ("" when it serves none we know)."""
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    for label in JOB_LABELS:
        name = labels.get(label)
        if isinstance(name, str) and name:
            return f"{metadata.get('namespace', '')}/{name}"
    for owner in metadata.get("ownerReferences") or []:
        if owner.get("kind") == "Job" and owner.get("name"):
            return f"{metadata.get('namespace', '')}/{owner['name']}"
    return ""


def judged_conditions(status: Json) -> list[Json]:
    """The pod's conditions that say whose fault an ending is (type, status, reason)."""
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        return []
    return [
        {key: str(c.get(key, "")) for key in ("type", "status", "reason")}
        for c in conditions
        if isinstance(c, dict) and c.get("type") in _JUDGING
    ]


def terminations(status: Json) -> list[Json]:
    """Each container's ending: exit code, reason, message (cut), finish time."""
    endings = []
    for container in status.get("containerStatuses") or []:
        if not isinstance(container, dict):
            continue
        ended = (container.get("state") or {}).get("terminated")
        if not isinstance(ended, dict):
            continue
        message = ended.get("message")
        endings.append(
            {
                "name": str(container.get("name", "")),
                "exitCode": ended.get("exitCode"),
                "reason": str(ended.get("reason", ""))[:128],
                "message": message[-MESSAGE_LIMIT:] if isinstance(message, str) else "",
                "finishedAt": str(ended.get("finishedAt", "")),
            }
        )
    return endings


def condition_true(pod: Json, kind: str) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def failure_of(pod: Json, seen_at: float) -> PodFailure:
    """The failure as attribution judges it, from a slim failed pod."""
    metadata = pod["metadata"]
    endings = pod["status"].get("containerStatuses") or []
    failed = [e for e in endings if e.get("exitCode") not in (0, None)] or endings
    text = "\n".join(f"{e['reason']}\n{e['message']}" for e in failed)
    signature = classify(text)
    finished = [_time(e["finishedAt"]) for e in failed]
    at = min((t for t in finished if t is not None), default=seen_at)
    gpus = (metadata.get("annotations") or {}).get(GPU_IDS_ANNOTATION) or ""
    return PodFailure(
        pod=f"{metadata['namespace']}/{metadata['name']}",
        job=training_job(pod),
        node=str(pod["spec"].get("nodeName", "")),
        at=at,
        disrupted=condition_true(pod, DISRUPTION_TARGET),
        gpus=tuple(gpu.strip() for gpu in gpus.split(",") if gpu.strip()),
        signature=f"{signature.code}: {signature.detail}" if signature is not None else "",
        infrastructure_signature=signature.infrastructure if signature is not None else None,
    )


def _time(text: str) -> float | None:
    try:
        return parse_time(text)
    except ValueError:
        return None
