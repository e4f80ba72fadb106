"""Draining on a real kube-apiserver: which pods move, evictions, budgets, and kills.

No kubelet runs, so pods bound to a node stay Pending (or whatever phase the test writes
into their status) and a graceful deletion never completes: the pod keeps its
``deletionTimestamp`` until a kubelet would confirm it, exactly what a pod on a dead node
does. No kube-controller-manager runs either, so a PodDisruptionBudget has no status
unless the test writes one; the API server then refuses to evict a running pod it covers
("still being processed"), as it would right after the budget's creation.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from gpuguard.contract.keys import GPU_IDS_ANNOTATION
from gpuguard.kube import drain
from gpuguard.kube.rest import PODS, KubeApi
from tests.support.controlplane import ControlPlane

BAD_GPU = "0000:91:00.0"
MERGE = "application/merge-patch+json"
HOLD = "gpuguard.io/test-hold"


@pytest.fixture
def namespace(control_plane: ControlPlane) -> str:
    # No namespace controller runs, so a deleted namespace would only ever be Terminating:
    # each test gets a fresh one and leaves it.
    name = f"drain-{uuid.uuid4().hex[:8]}"
    control_plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    return name


@pytest.fixture
def make_pod(control_plane: ControlPlane, namespace: str, node: str) -> Callable[..., dict]:
    def make(
        name: str,
        *,
        gpus: int = 0,
        gpu_ids: str | None = None,
        owner: dict[str, Any] | None = None,
        annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        finalizers: list[str] | None = None,
        on_node: str | None = None,
    ) -> dict:
        notes = dict(annotations or {})
        if gpu_ids is not None:
            notes[GPU_IDS_ANNOTATION] = gpu_ids
        container: dict[str, Any] = {"name": "main", "image": "registry.example/app:1"}
        if gpus:
            container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
        metadata: dict[str, Any] = {"name": name, "annotations": notes, "labels": labels or {}}
        if owner:
            metadata["ownerReferences"] = [owner]
        if finalizers:
            metadata["finalizers"] = finalizers
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": {
                "nodeName": on_node or node,
                "automountServiceAccountToken": False,  # no ServiceAccount admission here
                "containers": [container],
            },
        }
        return control_plane.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)

    return make


def set_phase(plane: ControlPlane, pod: dict, phase: str, ready: bool = False) -> None:
    status: dict[str, Any] = {"phase": phase}
    if ready:
        status["conditions"] = [{"type": "Ready", "status": "True"}]
    meta = pod["metadata"]
    plane.request(
        "PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
        {"status": status}, MERGE,
    )  # fmt: skip


def fetch(api: KubeApi, pod: dict) -> dict:
    return api.get(PODS.path(pod["metadata"]["name"], namespace=pod["metadata"]["namespace"]))


def names(pods: list[dict]) -> set[str]:
    return {pod["metadata"]["name"] for pod in pods}


def condition(pod: dict, kind: str) -> dict | None:
    return next((c for c in pod["status"].get("conditions", []) if c["type"] == kind), None)


def release(plane: ControlPlane, pod: dict) -> None:
    """Drop the test's finalizer and finish the deletion a kubelet would have confirmed."""
    meta = pod["metadata"]
    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
    plane.request("PATCH", path, {"metadata": {"finalizers": None}}, MERGE)
    plane.request("DELETE", path, {"gracePeriodSeconds": 0})


def test_selection_skips_daemonset_mirror_finished_and_terminating_pods(
    api, control_plane, namespace, node, make_pod
):
    daemonset = control_plane.request(
        "POST",
        f"/apis/apps/v1/namespaces/{namespace}/daemonsets",
        {
            "metadata": {"name": "gpu-exporter"},
            "spec": {
                "selector": {"matchLabels": {"app": "exporter"}},
                "template": {
                    "metadata": {"labels": {"app": "exporter"}},
                    "spec": {"containers": [{"name": "x", "image": "registry.example/x:1"}]},
                },
            },
        },
    )
    owner = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "name": "gpu-exporter",
        "uid": daemonset["metadata"]["uid"],
        "controller": True,
    }
    make_pod("web")
    make_pod("exporter", owner=owner, labels={"app": "exporter"}, gpus=0)
    make_pod("static", annotations={drain.MIRROR_ANNOTATION: "0123abcd"})
    set_phase(control_plane, make_pod("finished", gpus=1), "Succeeded")
    leaving = make_pod("leaving", gpus=1, finalizers=[HOLD])
    api.delete(PODS.path("leaving", namespace=namespace))
    make_pod("gpu-bad", gpus=1, gpu_ids="00000000:91:00.0")  # nvidia-smi's 8-digit domain
    make_pod("gpu-other", gpus=1, gpu_ids="0000:1a:00.0,0000:1b:00.0")
    make_pod("gpu-unlabelled", gpus=2)
    make_pod("gpu-by-uuid", gpus=1, gpu_ids="GPU-5f1e9c2a-0000-4000-8000-000000000001")
    make_pod("elsewhere", on_node=f"{node}-other")

    pods = drain.pods_on_node(api, node)

    assert "elsewhere" not in names(pods)
    assert names(drain.evictable_pods(pods)) == {
        "web", "gpu-bad", "gpu-other", "gpu-unlabelled", "gpu-by-uuid",
    }  # fmt: skip
    # On the bad GPU: the annotated match, plus GPU pods we cannot place (no annotation,
    # or UUIDs while the finding names bus ids): sparing them could reset a GPU under them.
    assert names(drain.evictable_pods(pods, [BAD_GPU])) == {
        "gpu-bad", "gpu-unlabelled", "gpu-by-uuid",
    }  # fmt: skip
    assert drain.evictable_count(api, node, [BAD_GPU]) == 4  # "leaving" still holds a GPU
    assert drain.evictable_count(api, node) == 6
    assert drain.evictable_count(api, node, ["0000:1b:00.0"]) == 4
    release(control_plane, leaving)
    assert drain.evictable_count(api, node, [BAD_GPU]) == 3


def test_eviction_starts_a_deletion_the_api_server_marks_disruption_target(
    api, control_plane, node, make_pod
):
    pods = [make_pod("a"), make_pod("b", gpus=1)]
    set_phase(control_plane, pods[0], "Running")  # changed since listed: evicted all the same

    counts = drain.evict_pods(api, pods)

    assert counts == drain.DrainCounts(evicted=2)
    for pod in pods:
        now = fetch(api, pod)
        assert now["metadata"]["deletionTimestamp"]  # no kubelet: it stays terminating
        target = condition(now, drain.DISRUPTION_TARGET)
        assert target is not None
        assert (target["status"], target["reason"]) == ("True", "EvictionByEvictionAPI")
    listed = drain.pods_on_node(api, node)
    assert drain.evictable_pods(listed) == []
    assert drain.evictable_count(api, node) == 2  # not moved until actually gone
    assert drain.evict(api, pods[0]) is drain.EvictionOutcome.EVICTED  # again: harmless

    # gracePeriodSeconds 0 finishes at once (what a kubelet's confirmation would do).
    assert drain.evict(api, pods[1], grace_period_s=0) is drain.EvictionOutcome.EVICTED
    assert drain.evict(api, pods[1]) is drain.EvictionOutcome.GONE
    assert drain.evictable_count(api, node) == 1


def test_a_budget_blocks_a_running_pod_until_it_allows_a_disruption(
    api, control_plane, namespace, make_pod
):
    running = make_pod("trainer-0", labels={"job": "trainer"})
    set_phase(control_plane, running, "Running", ready=True)
    pending = make_pod("trainer-1", labels={"job": "trainer"})
    budget = control_plane.request(
        "POST",
        f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets",
        {
            "metadata": {"name": "trainer"},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"job": "trainer"}}},
        },
    )

    counts = drain.evict_pods(api, [running])

    assert (counts.evicted, counts.blocked, counts.failed) == (0, 1, 0)
    assert counts.problems == (f"{namespace}/trainer-0: Blocked",)
    assert "deletionTimestamp" not in fetch(api, running)["metadata"]
    # A Pending pod is not protected by any budget: the API server evicts it regardless.
    assert drain.evict(api, pending) is drain.EvictionOutcome.EVICTED

    # What the disruption controller would write once it counted the healthy pods.
    control_plane.request(
        "PATCH",
        f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/trainer/status",
        {
            "status": {
                "observedGeneration": budget["metadata"]["generation"],
                "disruptionsAllowed": 1,
                "currentHealthy": 2,
                "desiredHealthy": 1,
                "expectedPods": 2,
            }
        },
        MERGE,
    )
    assert drain.evict(api, running) is drain.EvictionOutcome.EVICTED
    assert fetch(api, running)["metadata"]["deletionTimestamp"]


def test_kill_pods_marks_disruption_target_before_deleting(api, control_plane, make_pod):
    pod = make_pod("job-worker", gpus=8, finalizers=[HOLD])
    path = PODS.path("job-worker", namespace=pod["metadata"]["namespace"])
    changes = api.watch(
        path.rsplit("/", 1)[0],
        resource_version=pod["metadata"]["resourceVersion"],
        field_selector="metadata.name=job-worker",
        timeout_s=5,
    )

    counts = drain.kill_pods(api, [pod], "XID_79 on 0000:91:00.0: KILL_JOB attempt 1", now=1.8e9)

    assert counts == drain.DrainCounts(evicted=1)
    first = next(changes)
    assert first.type == "MODIFIED"
    assert "deletionTimestamp" not in first.object["metadata"]  # the condition came first
    target = condition(first.object, drain.DISRUPTION_TARGET)
    assert target == {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "DeletionByGpuguard",
        "message": "XID_79 on 0000:91:00.0: KILL_JOB attempt 1",
        "lastProbeTime": None,
        "lastTransitionTime": "2027-01-15T08:00:00Z",
    }
    second = next(changes)
    changes.close()
    assert second.object["metadata"]["deletionTimestamp"]
    assert condition(second.object, drain.DISRUPTION_TARGET) == target
    release(control_plane, pod)


def test_kill_pods_spares_a_new_pod_that_took_the_name(api, control_plane, make_pod):
    old = make_pod("worker")
    api.delete(
        PODS.path("worker", namespace=old["metadata"]["namespace"]), {"gracePeriodSeconds": 0}
    )
    new = make_pod("worker")

    counts = drain.kill_pods(api, [old], "KILL_JOB", now=time.time())

    assert counts == drain.DrainCounts(evicted=1)  # the pod meant is gone: job done
    now = fetch(api, new)
    assert "deletionTimestamp" not in now["metadata"]
    assert condition(now, drain.DISRUPTION_TARGET) is None

    started = time.monotonic()
    assert drain.evict(api, old) is drain.EvictionOutcome.GONE
    # Read first: the server would retry the UID mismatch for ~10 s before answering.
    assert time.monotonic() - started < 2
    assert "deletionTimestamp" not in fetch(api, new)["metadata"]
