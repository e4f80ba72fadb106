"""batch/v1 Jobs as the controller holds them: who they are, whether they use GPUs, and
how they ended; never the pod template or the status counts."""

from __future__ import annotations

from gpuguard.kube.rest import Json, Resource

JOBS = Resource("/apis/batch/v1", "jobs", namespaced=True)
GPU_RESOURCE = "nvidia.com/gpu"
# The Job controller's terminal conditions (SuccessCriteriaMet and FailureTarget come
# first and may still be followed by pods terminating; these two are the end).
OUTCOME_OF_CONDITION = {"Complete": "succeeded", "Failed": "failed"}


_KEPT_METADATA = ("uid", "namespace", "name", "resourceVersion")


def slim_job(job: Json) -> Json:
    """``metadata`` (uid, namespace, name, and the resourceVersion a broken watch resumes
    from), ``gpu`` (some container asks for a GPU), ``outcome`` ("succeeded", "failed",
    or "" while it runs) and ``podFailurePolicy`` (whether it has one: without, a pod the
    infrastructure ended is charged to it all the same)."""
    metadata = job.get("metadata") or {}
    return {
        "metadata": {key: metadata[key] for key in _KEPT_METADATA if key in metadata},
        "gpu": _requests_gpu(job),
        "outcome": job_outcome(job),
        "podFailurePolicy": bool((job.get("spec") or {}).get("podFailurePolicy")),
    }


def job_outcome(job: Json) -> str:
    for condition in (job.get("status") or {}).get("conditions") or []:
        outcome = OUTCOME_OF_CONDITION.get(str(condition.get("type")))
        if outcome is not None and condition.get("status") == "True":
            return outcome
    return ""


def _requests_gpu(job: Json) -> bool:
    pod = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]
    for container in containers:
        resources = container.get("resources") or {}
        for amounts in (resources.get("limits") or {}, resources.get("requests") or {}):
            if str(amounts.get(GPU_RESOURCE, "0")) not in ("0", ""):
                return True
    return False
