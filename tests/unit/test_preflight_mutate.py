"""The preflight webhook's decision on AdmissionReviews, as the API server sends them."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from gpuguard.contract.preflight import GANG_ANNOTATION, INIT_CONTAINER, SKIP, SKIP_LABEL
from gpuguard.preflight.mutate import ERROR, MUTATED, SKIPPED, Settings, review

SETTINGS = Settings(image="registry.example/gpuguard:1.2", budget_s=45)


def pod(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "train-", "namespace": "team"},
        "spec": {"containers": list(containers), **spec},
    }


def gpu_container(name: str = "train", n: int | str = 2, kind: str = "limits", **extra: Any):
    return {"name": name, "image": "train:1", "resources": {kind: {"nvidia.com/gpu": n}}, **extra}


def admission(obj: Any, operation: str = "CREATE", kind: str = "Pod") -> bytes:
    request = {
        "uid": "0d5e-uid",
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "team",
        "operation": operation,
        "object": obj,
    }
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


def answered(raw: bytes) -> tuple[str, dict[str, Any], list[dict[str, Any]] | None]:
    answer = review(raw, SETTINGS)
    doc = json.loads(answer.body)
    assert doc["apiVersion"] == "admission.k8s.io/v1" and doc["kind"] == "AdmissionReview"
    response = doc["response"]
    assert response["allowed"] is True
    patch = None
    if "patch" in response:
        assert response["patchType"] == "JSONPatch"
        patch = json.loads(base64.b64decode(response["patch"]))
    return answer.result, response, patch


def added(raw: bytes) -> tuple[dict[str, Any], str]:
    result, response, patch = answered(raw)
    assert result == MUTATED and response["uid"] == "0d5e-uid"
    assert patch is not None and len(patch) == 1 and patch[0]["op"] == "add"
    value = patch[0]["value"]
    return (value[0] if isinstance(value, list) else value), patch[0]["path"]


def test_a_gpu_pod_gets_the_check_as_its_only_init_container():
    container, path = added(admission(pod(gpu_container(n=4))))
    assert path == "/spec/initContainers"
    assert container["name"] == INIT_CONTAINER
    assert container["image"] == "registry.example/gpuguard:1.2"
    assert container["command"] == ["gpuguard"]  # the image has no entrypoint
    assert container["args"] == ["preflight", "--budget", "45"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "4"}}
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {
        "NODE_NAME": "spec.nodeName",
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
    }


def test_the_check_comes_before_the_users_init_containers_with_the_most_gpus_asked():
    users = {"name": "fetch-data", "image": "busybox"}
    spec = pod(gpu_container("a", 2), gpu_container("b", "8", kind="requests"))
    spec["spec"]["initContainers"] = [users, gpu_container("warm", 1)]
    container, path = added(admission(spec))
    assert path == "/spec/initContainers/0"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}


def test_dra_claims_are_mirrored_into_the_check():
    claimed = {"name": "train", "image": "t", "resources": {"claims": [{"name": "gpus"}]}}
    spec = pod(claimed, resourceClaims=[{"name": "gpus", "resourceClaimName": "c7"}])
    container, _ = added(admission(spec))
    assert container["resources"] == {"claims": [{"name": "gpus"}]}
    # No container names one: every claim of the pod.
    bare = pod({"name": "x", "image": "t"}, resourceClaims=[{"name": "a"}, {"name": "b"}])
    container, _ = added(admission(bare))
    assert container["resources"] == {"claims": [{"name": "a"}, {"name": "b"}]}


def test_a_gang_pod_asking_for_it_gets_the_gang_check_and_its_rendezvous_env():
    env = [
        {"name": "MASTER_ADDR", "value": "train-0.train"},
        {"name": "WORLD_SIZE", "value": "4"},
        {"name": "NODE_NAME", "value": "not-ours"},
    ]
    spec = pod({"name": "sidecar", "image": "s"}, gpu_container(env=env))
    spec["metadata"]["labels"] = {"jobset.sigs.k8s.io/jobset-name": "train"}
    spec["metadata"]["annotations"] = {GANG_ANNOTATION: "true"}
    container, _ = added(admission(spec))
    assert container["args"] == ["preflight", "--budget", "45", "--gang"]
    names = [e["name"] for e in container["env"]]
    assert names == ["NODE_NAME", "POD_NAME", "POD_NAMESPACE", "MASTER_ADDR", "WORLD_SIZE"]
    # Annotated but in no gang: the single-node check only.
    del spec["metadata"]["labels"]
    container, _ = added(admission(spec))
    assert "--gang" not in container["args"]


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (admission(pod({"name": "web", "image": "nginx"})), "no GPUs"),
        (admission(pod(gpu_container(n=0))), "no GPUs"),
        (admission(pod(gpu_container()), operation="UPDATE"), "not a create"),
        (admission({"kind": "Deployment"}, kind="Deployment"), "not a pod"),
    ],
)
def test_pods_without_gpus_and_other_requests_are_skipped(raw, why):
    answer = review(raw, SETTINGS)
    assert (answer.result, answer.reason) == (SKIPPED, why)
    assert "patch" not in json.loads(answer.body)["response"]


def test_never_twice_and_never_on_a_pod_labelled_to_skip():
    checked = pod(gpu_container())
    checked["spec"]["initContainers"] = [{"name": INIT_CONTAINER, "image": "old"}]
    assert answered(admission(checked))[:1] == (SKIPPED,)
    skipped = pod(gpu_container())
    skipped["metadata"]["labels"] = {SKIP_LABEL: SKIP}
    assert answered(admission(skipped))[:1] == (SKIPPED,)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xff\xfe",
        b"[1, 2]",
        b'{"request": "x"}',
        b'{"request": {"uid": 7}}',
        admission(pod(gpu_container(n="lots"))),
        admission({"spec": {"containers": "nope"}}),
        admission({"spec": {"containers": [{"resources": []}]}}),
    ],
)
def test_garbled_reviews_are_allowed_unpatched_and_counted_as_errors(raw):
    result, response, patch = answered(raw)
    assert result == ERROR and patch is None
    assert response["uid"] in ("", "0d5e-uid")
