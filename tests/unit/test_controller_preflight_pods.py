"""What the controller reads of the preflight gate off pods and namespaces, and the
count of GPU pods the gate let through unchecked (controller/preflight_pods.py,
controller/preflight.py)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from gpuguard.contract.preflight import (
    ENABLED,
    FAILED,
    INIT_CONTAINER,
    MESSAGE_LIMIT,
    NAMESPACE_LABEL,
    NOT_EQUIPPED,
    PASSED,
    PREFLIGHT_FAILED,
    SKIP,
    SKIP_LABEL,
    PreflightResult,
)
from gpuguard.contract.times import parse_time
from gpuguard.controller.events import EventRecorder
from gpuguard.controller.pods import slim_pod
from gpuguard.controller.preflight import PreflightOutcomes
from gpuguard.controller.preflight_pods import failures_of, slim_namespace, unchecked_since
from gpuguard.kube.rest import WatchEvent
from gpuguard.kube.watch import Snapshot
from gpuguard.remediation.policy import Policy
from tests.support.metrics import sample

GPU = "0000:91:00.0"
T = "2026-12-04T10:00:00Z"


def pod(
    *,
    uid: str = "u1",
    namespace: str = "ns",
    node: str = "a",
    checked: bool = True,
    gpus: int = 1,
    claims: bool = False,
    labels: dict[str, str] | None = None,
    created: str = T,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": node,
        "containers": [{"name": "train", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
    }
    if checked:
        spec["initContainers"] = [{"name": INIT_CONTAINER}]
    if claims:
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimName": "c"}]
    metadata = {"name": f"p-{uid}", "namespace": namespace, "uid": uid, "labels": labels or {}}
    metadata["creationTimestamp"] = created
    return {"metadata": metadata, "spec": spec, "status": status or {"phase": "Pending"}}


def ended(exit_code: int, message: str | None, *, waiting: bool = False) -> dict[str, Any]:
    terminated: dict[str, Any] = {"exitCode": exit_code, "finishedAt": T}
    if message is not None:
        terminated["message"] = message
    container: dict[str, Any] = {"name": INIT_CONTAINER}
    if waiting:
        container |= {"state": {"waiting": {"reason": "CrashLoopBackOff"}}}
        container["lastState"] = {"terminated": terminated}
    else:
        container["state"] = {"terminated": terminated}
    return {"phase": "Pending", "initContainerStatuses": [container]}


def test_a_failed_check_with_a_result_is_a_failure_on_the_pods_node():
    result = PreflightResult(FAILED, codes=("DEEP_MATMUL_SLOW",), gpus=(GPU,), message="slow")
    (read,) = failures_of(slim_pod(pod(status=ended(2, result.encode()))), 0.0)
    assert read.result == "failed" and read.exit_code == 2 and read.message == "slow"
    failure = read.failure
    assert (failure.node, failure.pod, failure.at) == ("a", "ns/p-u1", parse_time(T))
    assert (failure.codes, failure.gpus, failure.slow_link) == (
        ("DEEP_MATMUL_SLOW",),
        (GPU,),
        False,
    )
    assert failure.key == f"u1@{T}"


def test_no_result_and_a_passed_result_with_a_failed_exit_are_failures_all_the_same():
    for message, kind in (
        (None, "none"),
        ("garbled{", "none"),
        (PreflightResult(PASSED).encode(), "passed"),
    ):
        (read,) = failures_of(slim_pod(pod(status=ended(1, message, waiting=True))), 0.0)
        assert read.result == kind and read.failure.codes == (PREFLIGHT_FAILED,)


def test_an_image_that_cannot_check_is_no_verdict_on_the_node():
    """Without PyTorch in the image every node fails alike: the pod fails, no node does."""
    result = PreflightResult(FAILED, codes=(NOT_EQUIPPED,), message="PyTorch is not installed")
    assert failures_of(slim_pod(pod(status=ended(2, result.encode()))), 0.0) == []
    found = PreflightResult(FAILED, codes=(NOT_EQUIPPED, "DEEP_MATMUL_SLOW"))
    assert failures_of(slim_pod(pod(status=ended(1, found.encode()))), 0.0)


def test_a_check_ended_by_its_pods_deletion_or_eviction_is_no_verdict():
    deleted = pod(status=ended(143, None))
    deleted["metadata"]["deletionTimestamp"] = T
    assert failures_of(slim_pod(deleted), 0.0) == []
    evicted = ended(137, None)
    evicted["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": "x"}]
    assert failures_of(slim_pod(pod(status=evicted)), 0.0) == []


def test_a_passed_check_and_other_containers_are_no_failure():
    assert failures_of(slim_pod(pod(status=ended(0, PreflightResult(PASSED).encode()))), 0.0) == []
    other = ended(2, None)
    other["initContainerStatuses"][0]["name"] = "user-init"
    assert failures_of(slim_pod(pod(status=other)), 0.0) == []
    assert "preflightEndings" not in slim_pod(pod(status=other))["status"]


def test_a_gang_result_goes_to_the_slow_nodes_it_names():
    result = PreflightResult(
        FAILED, codes=("DEEP_ALL_REDUCE_SLOW",), gpus=(GPU,), slow_nodes=("c", "a")
    )
    reads = failures_of(slim_pod(pod(node="a", status=ended(2, result.encode()))), 0.0)
    assert [(r.failure.node, r.failure.gpus, r.failure.slow_link) for r in reads] == [
        ("c", (), True),
        ("a", (GPU,), True),
    ]


def test_the_message_kept_is_cut_to_the_kubelets_limit():
    slim = slim_pod(pod(status=ended(2, "é" * MESSAGE_LIMIT)))
    (kept,) = slim["status"]["preflightEndings"]
    assert len(kept["message"].encode()) <= MESSAGE_LIMIT


def test_only_gpu_pods_without_the_check_and_not_skipped_are_unchecked():
    assert unchecked_since(slim_pod(pod(checked=False))) == parse_time(T)
    assert unchecked_since(slim_pod(pod(checked=False, gpus=0, claims=True))) == parse_time(T)
    assert unchecked_since(slim_pod(pod(checked=True))) is None
    assert unchecked_since(slim_pod(pod(checked=False, gpus=0))) is None
    assert unchecked_since(slim_pod(pod(checked=False, labels={SKIP_LABEL: SKIP}))) is None


def namespace(name: str, labelled: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "resourceVersion": "1"}
    if labelled is not None:
        metadata["labels"] = {NAMESPACE_LABEL: ENABLED}
        owned = {"f:metadata": {"f:labels": {f"f:{NAMESPACE_LABEL}": {}}}}
        metadata["managedFields"] = [
            {"manager": "kubectl", "time": "2026-01-01T00:00:00Z", "fieldsV1": {"f:metadata": {}}},
            {"manager": "kubectl-label", "time": labelled, "fieldsV1": owned},
        ]
    return {"metadata": metadata}


def test_a_namespace_is_opted_in_since_its_label_was_written():
    assert slim_namespace(namespace("ns", T))["enabledAt"] == parse_time(T)
    assert "enabledAt" not in slim_namespace(namespace("ns", None))


def outcomes() -> tuple[PreflightOutcomes, CollectorRegistry]:
    recorder = EventRecorder(None, "test")  # type: ignore[arg-type]  # counting writes nothing
    registry = CollectorRegistry()
    return PreflightOutcomes(recorder, registry, Policy(), lambda: 0.0), registry


def added(obj: dict[str, Any]) -> WatchEvent:
    return WatchEvent("ADDED", obj)


def test_unchecked_pods_are_counted_once_in_opted_in_namespaces_created_after_the_label():
    gate, registry = outcomes()
    unchecked = "gpuguard_preflight_pods_unchecked_total"
    gate.take_namespaces(
        Snapshot([slim_namespace(namespace("in", T)), namespace("out", None)], "1")
    )
    before = slim_pod(pod(uid="old", namespace="in", checked=False, created="2026-12-04T09:00:00Z"))
    after = slim_pod(pod(uid="new", namespace="in", checked=False, created="2026-12-04T10:00:01Z"))
    elsewhere = slim_pod(
        pod(uid="x", namespace="out", checked=False, created="2026-12-04T11:00:00Z")
    )
    for item in (before, after, elsewhere, after):  # a status update: the same pod again
        gate.take_pods(added(item))
    assert sample(registry, unchecked) == 1
    gate.take_pods(Snapshot([before, after, elsewhere], "2"))  # a relist counts nothing again
    assert sample(registry, unchecked) == 1


def test_a_pod_seen_before_its_namespace_is_counted_once_the_namespace_arrives():
    gate, registry = outcomes()
    gate.take_pods(
        added(
            slim_pod(pod(uid="p", namespace="late", checked=False, created="2026-12-04T10:00:05Z"))
        )
    )
    gate.take_namespaces(added(slim_namespace(namespace("late", T))))
    assert sample(registry, "gpuguard_preflight_pods_unchecked_total") == 1


def test_a_failure_waits_for_the_pass_once():
    gate, _ = outcomes()
    failed = slim_pod(pod(status=ended(2, None)))
    assert gate.take_pods(added(failed))
    assert not gate.take_pods(WatchEvent("MODIFIED", failed))  # already waiting
