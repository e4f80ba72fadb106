"""The preflight webhook's decision: an AdmissionReview (v1) in, its answer out. Pure.

Only a Pod's CREATE that wants GPUs (``nvidia.com/gpu`` in a container's limits or
requests, or any resource claim) is mutated: the init container
``contract.preflight.INIT_CONTAINER`` is put first, so the check runs before anything of
the user's. Never twice (a pod that has it is left alone), never on a pod labelled
``SKIP_LABEL=SKIP``. Whatever arrives, the answer allows the pod: a review that cannot be
read is answered ``allowed`` without a patch and reported as an error, never a 500.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass

from gpuguard.contract.preflight import GANG_ANNOTATION, INIT_CONTAINER, SKIP, SKIP_LABEL

GPU_RESOURCE = "nvidia.com/gpu"
# A pod with one of these labels is part of a gang (JobSet, Kubeflow training job, indexed Job).
GANG_LABELS = (
    "jobset.sigs.k8s.io/jobset-name",
    "training.kubeflow.org/job-name",
    "batch.kubernetes.io/job-completion-index",
)
DOWNWARD_ENV = (
    ("NODE_NAME", "spec.nodeName"),
    ("POD_NAME", "metadata.name"),
    ("POD_NAMESPACE", "metadata.namespace"),
)
MUTATED, SKIPPED, ERROR = "mutated", "skipped", "error"

Obj = Mapping[str, object]


@dataclass(frozen=True)
class Settings:
    """What the added container runs: the controller's preflight image, the check's budget."""

    image: str
    budget_s: float = 60.0


@dataclass(frozen=True)
class Answer:
    """The AdmissionReview to send back, and how the request ended (MUTATED, SKIPPED,
    ERROR) with a reason for the log."""

    body: bytes
    result: str
    reason: str = ""


def review(raw: bytes, settings: Settings) -> Answer:
    """The answer to one AdmissionReview (the HTTP body as received)."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return _answer("", ERROR, "the body is not JSON")
    request = doc.get("request") if isinstance(doc, dict) else None
    uid = request.get("uid") if isinstance(request, Mapping) else None
    if not isinstance(request, Mapping) or not isinstance(uid, str) or not uid:
        return _answer("", ERROR, "no request.uid")
    try:
        patch, why = decide(request, settings)
    except (TypeError, ValueError, AttributeError) as exc:
        return _answer(uid, ERROR, f"unreadable pod: {exc}")
    if patch is None:
        return _answer(uid, SKIPPED, why)
    return _answer(uid, MUTATED, why, patch)


def decide(request: Obj, settings: Settings) -> tuple[list[dict[str, object]] | None, str]:
    """The JSON patch for one admission request, or None and why not."""
    if request.get("operation") != "CREATE" or request.get("subResource"):
        return None, "not a create"
    if _obj(request.get("kind")).get("kind") != "Pod":
        return None, "not a pod"
    pod = _obj(request.get("object"))
    spec = _obj(pod.get("spec"))
    labels = _obj(_obj(pod.get("metadata")).get("labels"))
    if labels.get(SKIP_LABEL) == SKIP:
        return None, "labelled to skip"
    inits = _list(spec.get("initContainers"))
    if any(_obj(c).get("name") == INIT_CONTAINER for c in inits):
        return None, "already checked"
    gpus = max((_gpus(c) for c in _containers(spec)), default=0)
    claims = _claims(spec)
    if gpus == 0 and not claims:
        return None, "no GPUs"
    container = init_container(pod, settings, gpus, claims)
    if inits:
        return [{"op": "add", "path": "/spec/initContainers/0", "value": container}], "added"
    return [{"op": "add", "path": "/spec/initContainers", "value": [container]}], "added"


def init_container(
    pod: Obj, settings: Settings, gpus: int, claims: list[dict[str, object]]
) -> dict[str, object]:
    """The check: the most GPUs any container asks for (the kubelet hands the init
    container's devices on to the app containers, so it checks the same GPUs), or the
    pod's claims mirrored."""
    args = ["preflight", "--budget", _seconds(settings.budget_s)]
    env: list[object] = [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
        for name, path in DOWNWARD_ENV
    ]
    container: dict[str, object] = {"name": INIT_CONTAINER, "image": settings.image}
    gang = _gang_source(pod)
    if gang is not None:
        args.append("--gang")
        ours = {name for name, _ in DOWNWARD_ENV}
        env += [e for e in _list(gang.get("env")) if _obj(e).get("name") not in ours]
        if gang.get("envFrom"):
            container["envFrom"] = gang["envFrom"]
    resources: dict[str, object] = {}
    if gpus:
        resources["limits"] = {GPU_RESOURCE: str(gpus)}
    if claims:
        resources["claims"] = claims
    container.update(
        command=["gpuguard"],  # the image has no entrypoint: the chart names it too
        args=args,
        env=env,
        resources=resources,
        terminationMessagePolicy="FallbackToLogsOnError",
        imagePullPolicy="IfNotPresent",
    )
    return container


def _gang_source(pod: Obj) -> Obj | None:
    """The first GPU container of a pod that asked for the gang check and is in a gang."""
    metadata = _obj(pod.get("metadata"))
    if _obj(metadata.get("annotations")).get(GANG_ANNOTATION) != "true":
        return None
    labels = _obj(metadata.get("labels"))
    if not any(label in labels for label in GANG_LABELS):
        return None
    containers = [_obj(c) for c in _list(_obj(pod.get("spec")).get("containers"))]
    wanting = [c for c in containers if _gpus(c) or _obj(c.get("resources")).get("claims")]
    return wanting[0] if wanting else (containers[0] if containers else {})


def _containers(spec: Obj) -> list[Obj]:
    return [_obj(c) for key in ("containers", "initContainers") for c in _list(spec.get(key))]


def _gpus(container: Obj) -> int:
    resources = _obj(container.get("resources"))
    asked = [_obj(resources.get(kind)).get(GPU_RESOURCE) for kind in ("limits", "requests")]
    return max((int(str(n)) for n in asked if n is not None), default=0)


def _claims(spec: Obj) -> list[dict[str, object]]:
    """The claims the containers use (each once), or every claim of the pod when none
    names one."""
    pod_claims = [str(_obj(c).get("name")) for c in _list(spec.get("resourceClaims"))]
    used: list[dict[str, object]] = []
    for container in _containers(spec):
        for claim in _list(_obj(container.get("resources")).get("claims")):
            entry = dict(_obj(claim))
            if entry not in used:
                used.append(entry)
    return used or [{"name": name} for name in pod_claims]


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _obj(value: object) -> Obj:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return value


def _list(value: object) -> list[object]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return value


def _answer(
    uid: str, result: str, reason: str, patch: list[dict[str, object]] | None = None
) -> Answer:
    response: dict[str, object] = {"uid": uid, "allowed": True}
    if patch is not None:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
    return Answer(json.dumps(body).encode(), result, reason)
