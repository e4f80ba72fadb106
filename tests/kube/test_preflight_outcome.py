"""A failed preflight quarantines its node; a gate that failed open shows: the real
kube-apiserver and a real Controller run with ``preflight=True``.

No kubelet runs here: each test writes the pod's status through the API as the kubelet
would (the init container ``gpuguard-preflight`` terminated, its exit code and its
termination message), and no webhook runs, so a GPU pod in an opted-in namespace is
admitted without the check, as when the webhook is down (it fails open).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuguard.contract.keys import TAINT_KEY
from gpuguard.contract.preflight import (
    ENABLED,
    FAILED,
    INIT_CONTAINER,
    NAMESPACE_LABEL,
    PASSED,
    SKIP,
    SKIP_LABEL,
    PreflightResult,
)
from gpuguard.contract.times import parse_time
from gpuguard.controller.loop import Controller
from gpuguard.kube.rest import Json, KubeApi
from tests.support.cluster import make_node, scratch_namespace, stamp, wait_for
from tests.support.controllers import Running, new_controller, reconciled, remediations
from tests.support.metrics import sample

UNCHECKED = "gpuguard_preflight_pods_unchecked_total"
FAILURES = "gpuguard_preflight_failures_total"
GPU = "0000:91:00.0"


@pytest.fixture
def controller(api: KubeApi, namespace: str) -> Iterator[Controller]:
    """A controller reading the preflight gate's outcomes (the fast test policy)."""
    gpuguard = new_controller(api, namespace, preflight=True)
    running = Running(gpuguard.run)
    wait_for(gpuguard.leading.is_set, 20, "the controller leading")
    yield gpuguard
    running.halt()


@pytest.fixture
def nodes(api: KubeApi) -> Callable[[], str]:
    """New bare Nodes (deleted with the test's namespace)."""

    def new() -> str:
        name = f"pf-{uuid.uuid4().hex[:8]}"
        make_node(api, name)
        return name

    return new


def gpu_pod(
    api: KubeApi,
    namespace: str,
    node: str = "",
    *,
    checked: bool = True,
    gpus: bool = True,
    labels: dict[str, str] | None = None,
) -> Json:
    """A pod asking for a GPU, with the gate's init container when ``checked`` (as the
    webhook adds it); bound to ``node`` when given."""
    limits = {"nvidia.com/gpu": "1"} if gpus else {"cpu": "1"}
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "containers": [{"name": "train", "image": "busybox", "resources": {"limits": limits}}],
    }
    if checked:
        spec["initContainers"] = [{"name": INIT_CONTAINER, "image": "gpuguard"}]
    if node:
        spec["nodeName"] = node
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p-{uuid.uuid4().hex[:8]}", "labels": labels or {}},
        "spec": spec,
    }
    return api.create(f"/api/v1/namespaces/{namespace}/pods", body)


def check_ended(
    api: KubeApi, pod: Json, exit_code: int, message: str | None, *, restarting: bool = False
) -> None:
    """Write the status a kubelet writes when the init container ends: failed, the pod
    Failed (restartPolicy Never) or, ``restarting``, its container waiting to run again
    (CrashLoopBackOff) with the ending as its last state."""
    ended: Json = {"exitCode": exit_code, "reason": "Error" if exit_code else "Completed"}
    ended |= {"startedAt": stamp(-1), "finishedAt": stamp()}
    if message is not None:
        ended["message"] = message
    container: Json = {
        "name": INIT_CONTAINER,
        "image": "gpuguard",
        "imageID": "",
        "ready": exit_code == 0,
        "restartCount": 0,
    }
    if restarting:
        container |= {"state": {"waiting": {"reason": "CrashLoopBackOff"}}}
        container |= {"lastState": {"terminated": ended}, "restartCount": 1}
    else:
        container["state"] = {"terminated": ended}
    phase = "Failed" if exit_code and not restarting else "Pending"
    meta = pod["metadata"]
    api.patch(
        f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
        {"status": {"phase": phase, "initContainerStatuses": [container]}},
    )


def quarantined(api: KubeApi, node: str) -> bool:
    taints = api.get(f"/api/v1/nodes/{node}")["spec"].get("taints") or []
    return any(t["key"] == TAINT_KEY for t in taints)


def events_about(api: KubeApi, node: str) -> list[Json]:
    found = api.list("/apis/events.k8s.io/v1/namespaces/default/events").items
    return [e for e in found if e["regarding"].get("name") == node]


def test_a_failed_check_quarantines_its_node_and_a_passed_one_does_not(
    api: KubeApi, namespace: str, controller: Controller, nodes: Callable[[], str]
) -> None:
    bad, good = nodes(), nodes()
    failed = PreflightResult(FAILED, codes=("DEEP_SILENT_DATA_CORRUPTION",), gpus=(GPU,))
    check_ended(api, gpu_pod(api, namespace, bad), 2, failed.encode())
    check_ended(api, gpu_pod(api, namespace, good), 0, PreflightResult(PASSED).encode())

    wait_for(lambda: quarantined(api, bad), 30, "the node whose check failed tainted")
    (episode,) = wait_for(lambda: remediations(api, bad), 30, "its episode opened")
    assert episode["spec"]["nodeName"] == bad
    reconciled(controller)
    assert not quarantined(api, good) and not remediations(api, good)
    (event,) = [e for e in events_about(api, bad) if e["reason"] == "PreflightFailed"]
    assert "DEEP_SILENT_DATA_CORRUPTION" in event["note"] and GPU in event["note"]
    assert sample(controller.metrics.registry, FAILURES, result="failed", target="node") >= 1


def test_a_check_that_left_no_result_quarantines_all_the_same(
    api: KubeApi, namespace: str, controller: Controller, nodes: Callable[[], str]
) -> None:
    node = nodes()
    # Killed (out of memory) before it wrote a result, and waiting to run again.
    check_ended(api, gpu_pod(api, namespace, node), 137, None, restarting=True)

    wait_for(lambda: quarantined(api, node), 30, "the node tainted (fail closed)")
    wait_for(lambda: remediations(api, node), 30, "its episode opened")
    layer = controller.nodes.observed[node].layers["preflight"]
    assert (layer.status, layer.codes) == ("False", ("PREFLIGHT_FAILED",))
    assert sample(controller.metrics.registry, FAILURES, result="none", target="node") >= 1


def test_a_gang_check_quarantines_the_slow_node_it_names_not_the_reporter(
    api: KubeApi, namespace: str, controller: Controller, nodes: Callable[[], str]
) -> None:
    slow, reporter = nodes(), nodes()
    result = PreflightResult(FAILED, codes=("DEEP_ALL_REDUCE_SLOW",), slow_nodes=(slow,))
    check_ended(api, gpu_pod(api, namespace, reporter), 2, result.encode(), restarting=True)

    wait_for(lambda: quarantined(api, slow), 30, "the slow node named by its peer tainted")
    wait_for(lambda: remediations(api, slow), 30, "its episode opened")
    reconciled(controller)
    assert not quarantined(api, reporter) and not remediations(api, reporter)
    assert sample(controller.metrics.registry, FAILURES, result="failed", target="slow_node") >= 1


def opt_in(api: KubeApi, namespace: str) -> float:
    """Label the namespace in; when the API says the label was written."""
    labelled = api.patch(
        f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {NAMESPACE_LABEL: ENABLED}}}
    )
    times = [parse_time(entry["time"]) for entry in labelled["metadata"]["managedFields"]]
    return max(times)


def test_gpu_pods_admitted_without_the_check_are_counted_in_opted_in_namespaces_only(
    api: KubeApi, namespace: str, controller: Controller
) -> None:
    registry = controller.metrics.registry
    start = sample(registry, UNCHECKED)
    gpu_pod(api, namespace, checked=False)  # before the opt-in: never counted
    labelled_at = opt_in(api, namespace)
    # Creation times have whole seconds: the next pod is created in a later one.
    wait_for(lambda: time.time() >= labelled_at + 1.05, 5, "the next second")
    with scratch_namespace(api) as elsewhere:  # not opted in
        gpu_pod(api, elsewhere, checked=False)
        gpu_pod(api, namespace, checked=False, labels={SKIP_LABEL: SKIP})
        gpu_pod(api, namespace, checked=True)
        gpu_pod(api, namespace, checked=False, gpus=False)  # no GPUs: never checked
        # The webhook down: two pods admitted unchecked. One watch delivers every pod in
        # order, so once the last is counted every pod before it has been looked at.
        gpu_pod(api, namespace, checked=False)
        gpu_pod(api, namespace, checked=False)
        wait_for(lambda: sample(registry, UNCHECKED) >= start + 2, 20, "the unchecked pods")
        assert sample(registry, UNCHECKED) == start + 2
