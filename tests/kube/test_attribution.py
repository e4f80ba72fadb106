"""Jobs never pay for the infrastructure, end to end: the real Job controller, scheduler
and gpuguard controller, KWOK as the kubelet (tests/support/jobsystem.py).

The Job is examples/jobs/job.yaml with its podFailurePolicy as written. It runs six
completions one pod at a time with ``backoffLimit: 1``: five pods ended by faults gpuguard
attributes (each followed by a pod that succeeds, which resets the Job controller's
failure backoff), then one that fails on the job's own bug. A crash with no cause on
one node from three different Jobs quarantines that node. The condition written after a
pod failed loses its race with the Job controller; the in-pod exit code wins it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuguard.contract.keys import (
    INFRASTRUCTURE_FAILURE_CONDITION,
    TAINT_KEY,
    VERIFY_REQUEST_ANNOTATION,
)
from gpuguard.controller.loop import Controller
from gpuguard.kube.rest import Json, KubeApi
from gpuguard.training.contract import EXIT_INFRASTRUCTURE
from tests.support.cluster import set_health, wait_for
from tests.support.controllers import POOL, Running, new_controller
from tests.support.jobsystem import (
    KWOK_ANNOTATION,
    create_job,
    end_pod,
    finished_as,
    job_status,
    make_kwok_node,
    running_pod,
    training_job,
)
from tests.support.metrics import sample

NCCL_LOST_PEER = (
    "RuntimeError: NCCL communicator was aborted on rank 3. Original reason for failure was: "
    "NCCL error: remote process exited or there was a network error, NCCL version 2.21.5\n"
    "ncclRemoteError: A call failed possibly due to a network error or a remote process "
    "exiting prematurely."
)
TRACEBACK = (
    'Traceback (most recent call last):\n  File "/app/train.py", line 88, in <module>\n'
    "    loss = model(batch)\nValueError: shapes (4,) and (5,) not aligned"
)
FAILURES = "gpuguard_controller_pod_failures_total"
GPU0 = "0000:91:00.0"


@pytest.fixture
def gpuguard(api: KubeApi, jobs: str) -> Iterator[Callable[..., Controller]]:
    running: list[Running] = []

    def start(**policy: Any) -> Controller:
        controller = new_controller(api, jobs, **policy)
        running.append(Running(controller.run))
        return controller

    yield start
    for item in running:
        item.halt()


class Pool:
    """Nodes of one pool only this test uses; each fault's node is cordoned after it so
    the next pod lands on a fresh one."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.name = f"kwok-{uuid.uuid4().hex[:6]}"
        self.nodes: list[str] = []

    def add(self) -> str:
        node = f"{self.name}-{len(self.nodes)}"
        make_kwok_node(self.api, node, {POOL: self.name, "test.gpuguard.io/node": node})
        self.nodes.append(node)
        return node

    def retire(self, node: str) -> None:
        self.api.patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}})


def condition(api: KubeApi, pod: Json) -> Json | None:
    meta = pod["metadata"]
    current = api.get(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")
    for item in current["status"].get("conditions") or []:
        if item["type"] == INFRASTRUCTURE_FAILURE_CONDITION:
            return dict(item)
    return None


def next_pod(api: KubeApi, namespace: str, job: str, seen: set[str]) -> Json:
    def fresh() -> Json | tuple[str, str] | None:
        pod = running_pod(api, namespace, job)
        if pod is not None and pod["metadata"]["uid"] not in seen:
            return pod
        return finished_as(api, namespace, job)

    found = wait_for(fresh, 60, "the job's next pod running")
    assert isinstance(found, dict), f"the job ended: {job_status(api, namespace, job)}"
    seen.add(found["metadata"]["uid"])
    return found


def crash_one_job(api: KubeApi, namespace: str, node: str) -> None:
    """A Job whose pod crashes on ``node`` with no message and no finding."""
    name = create_job(api, namespace, pinned_job(node))
    pod = wait_for(lambda: running_pod(api, namespace, name), 30, "the job's pod running")
    end_pod(api, pod, 2)
    wait_for(lambda: finished_as(api, namespace, name), 30, "the job failed")


def quarantined(api: KubeApi, node: str) -> Json | None:
    current = api.get(f"/api/v1/nodes/{node}")
    taints = current["spec"].get("taints") or []
    return current if any(t["key"] == TAINT_KEY for t in taints) else None


def pinned_job(node: str, completions: int = 1, backoff_limit: int = 0) -> Json:
    job = training_job()
    job["spec"]["backoffLimit"] = backoff_limit
    job["spec"]["completions"] = completions
    job["spec"]["parallelism"] = 1
    job["spec"]["template"]["spec"]["nodeSelector"] = {"test.gpuguard.io/node": node}
    return job


def evict(api: KubeApi, node: str, pod: Json) -> None:
    """A drain's eviction (gpuguard's, or a person's): the API server sets DisruptionTarget."""
    meta = pod["metadata"]
    api.create(
        f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/eviction",
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": meta},
    )


def not_ready(api: KubeApi, node: str, pod: Json) -> None:
    """The kubelet stops (KWOK lets go of the node) and the node lifecycle controller's
    verdict follows: Ready Unknown."""
    api.patch(f"/api/v1/nodes/{node}", {"metadata": {"annotations": {KWOK_ANNOTATION: None}}})
    ready = {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}
    api.patch(f"/api/v1/nodes/{node}/status", {"status": {"conditions": [ready]}}, "strategic")


def back_online(api: KubeApi, node: str) -> None:
    """The kubelet returns (after a reboot) and reports how the pod's container ended."""
    api.patch(f"/api/v1/nodes/{node}", {"metadata": {"annotations": {KWOK_ANNOTATION: "fake"}}})


def xid_on_its_gpu(api: KubeApi, node: str, pod: Json) -> None:
    set_health(api, node, gpu="False", action="REBOOT", codes=("XID_79",), gpus=(GPU0,))


def link_down(api: KubeApi, node: str, pod: Json) -> None:
    set_health(api, node, network="False", network_action="REBOOT", network_codes=("IB_LINK_DOWN",))


def nothing(api: KubeApi, node: str, pod: Json) -> None:
    """No node signal: the pod's own last words say it all."""


# The fault, how the pod then ends (exit code, termination message), and whether gpuguard
# marks it while it still runs (otherwise it judges the failure afterwards).
FAULTS = (
    (evict, None, "", False),  # ended by the eviction itself (KWOK: exit 137)
    (not_ready, 137, "", True),  # the node lost: its pods end with it
    (xid_on_its_gpu, 1, "CUDA error: unspecified launch failure", True),
    (nothing, EXIT_INFRASTRUCTURE, NCCL_LOST_PEER, False),  # gpuguard run's translation
    (link_down, 137, "", True),
)


def test_a_job_survives_five_attributed_faults_and_still_fails_on_its_own_bug(api, jobs, gpuguard):
    pool = Pool(api)
    pool.add()
    job = pinned_job("", completions=6, backoff_limit=1)
    job["spec"]["template"]["spec"]["nodeSelector"] = {POOL: pool.name}
    name = create_job(api, jobs, job)
    # A long tolerance: each episode stays quarantined (tainted, no drain), so every pod
    # below ends by the fault itself, not by gpuguard's eviction.
    controller = gpuguard(tolerance_s=3600)
    seen: set[str] = set()

    for cause, exit_code, message, marked_ahead in FAULTS:
        pod = next_pod(api, jobs, name, seen)
        node = pod["spec"]["nodeName"]
        cause(api, node, pod)
        if marked_ahead:
            marked = wait_for(lambda p=pod: condition(api, p), 20, "the pod marked while it runs")
            assert marked["status"] == "True", marked
        if cause is not_ready:
            back_online(api, node)
        if exit_code is not None:
            end_pod(api, pod, exit_code, message)
        pool.retire(node)
        pool.add()
        end_pod(api, next_pod(api, jobs, name, seen), 0)  # a completion: the backoff resets
    assert not job_status(api, jobs, name).get("failed")

    last = next_pod(api, jobs, name, seen)
    end_pod(api, last, 1, TRACEBACK)  # the job's own bug, on a healthy node
    assert wait_for(lambda: finished_as(api, jobs, name), 30, "the job failed") == (
        "Failed",
        "PodFailurePolicy",
    )
    status = job_status(api, jobs, name)
    assert status["succeeded"] == 5 and status["failed"] == 1
    registry = controller.metrics.registry
    wait_for(
        lambda: sample(registry, FAILURES, attributed="false", cause="NotAttributed") >= 1,
        20,
        "the job's own failure judged",
    )
    assert condition(api, last) is None
    assert sample(registry, FAILURES, attributed="true", cause="InfrastructureSignature") >= 1


def test_pods_of_three_jobs_crashing_unexplained_on_one_node_quarantine_it(api, jobs, gpuguard):
    pool = Pool(api)
    node = pool.add()
    controller = gpuguard()
    for _ in range(3):
        crash_one_job(api, jobs, node)
    node_object = wait_for(lambda: quarantined(api, node), 30, "the node quarantined")
    # Deep-checked before anything is destroyed: the verify request, no reboot asked.
    wait_for(
        lambda: (
            VERIFY_REQUEST_ANNOTATION
            in (api.get(f"/api/v1/nodes/{node}")["metadata"].get("annotations") or {})
        ),
        30,
        "the deep suite asked for",
    )
    assert not node_object["spec"].get("unschedulable")  # quarantined, not drained
    assert sample(controller.metrics.registry, "gpuguard_controller_crash_suspect", node=node) == 3
    events = api.list(
        "/apis/events.k8s.io/v1/namespaces/default/events",
        field_selector=f"regarding.name={node}",
    ).items
    assert any(e["reason"] == "CrashesAcrossJobs" for e in events)


def test_a_condition_written_after_the_failure_loses_the_race_the_exit_code_wins_it(
    api, jobs, gpuguard
):
    pool = Pool(api)
    node = pool.add()
    late = create_job(api, jobs, pinned_job(node))
    pod = wait_for(lambda: running_pod(api, jobs, late), 30, "the job's pod running")
    end_pod(api, pod, 1, NCCL_LOST_PEER)  # the script's exit code, no launcher to translate
    assert wait_for(lambda: finished_as(api, jobs, late), 30, "the job failed") == (
        "Failed",
        "PodFailurePolicy",
    )
    # The controller judges it after the Job controller did (here: it starts only now, as
    # after a leader change; in general it may simply be slower): recorded, too late.
    controller = gpuguard()
    marked = wait_for(lambda: condition(api, pod), 30, "the failure attributed")
    assert marked["reason"] == "InfrastructureSignature" and "NCCL" in marked["message"]
    assert (
        sample(
            controller.metrics.registry,
            FAILURES,
            attributed="true",
            cause="InfrastructureSignature",
        )
        >= 1
    )

    timely = create_job(api, jobs, pinned_job(node))
    pod = wait_for(lambda: running_pod(api, jobs, timely), 30, "the job's pod running")
    end_pod(api, pod, EXIT_INFRASTRUCTURE, NCCL_LOST_PEER)  # gpuguard run's translation
    replacement = wait_for(
        lambda: running_pod(api, jobs, timely, not_uid=pod["metadata"]["uid"]), 60, "resumed"
    )
    assert not job_status(api, jobs, timely).get("failed")
    end_pod(api, replacement, 0)


def test_a_job_without_a_failure_policy_is_warned_that_it_pays(api, jobs, gpuguard):
    pool = Pool(api)
    node = pool.add()
    gpuguard()
    job = pinned_job(node)
    del job["spec"]["podFailurePolicy"]
    name = create_job(api, jobs, job)
    pod = wait_for(lambda: running_pod(api, jobs, name), 30, "the job's pod running")
    end_pod(api, pod, 1, NCCL_LOST_PEER)
    wait_for(lambda: finished_as(api, jobs, name), 30, "the job failed")

    def warned() -> list[Json]:
        events = api.list(
            f"/apis/events.k8s.io/v1/namespaces/{jobs}/events",
            field_selector=f"regarding.name={pod['metadata']['name']}",
        ).items
        return [e for e in events if e["reason"] == "JobCharged"]

    (event,) = wait_for(warned, 30, "the warning Event")
    assert "no podFailurePolicy" in event["note"] and event["type"] == "Warning"


def test_a_megabyte_termination_message_is_judged_on_its_tail(api, jobs, gpuguard):
    """A status written by hand can carry far more than a kubelet's 4 KiB: the controller
    reads the tail, judges it, and goes on."""
    pool = Pool(api)
    node = pool.add()
    controller = gpuguard()
    name = create_job(api, jobs, pinned_job(node))
    pod = wait_for(lambda: running_pod(api, jobs, name), 30, "the job's pod running")
    meta = pod["metadata"]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ended = {
        "name": "trainer",
        "image": "registry.example.com/ml/train-llm:1.0",
        "ready": False,
        "restartCount": 0,
        "state": {
            "terminated": {
                "exitCode": 1,
                "reason": "Error",
                "message": "x" * (1 << 20) + "\n" + NCCL_LOST_PEER,
                "startedAt": now,
                "finishedAt": now,
            }
        },
    }
    api.patch(
        f"/api/v1/namespaces/{jobs}/pods/{meta['name']}/status",
        {"status": {"phase": "Failed", "containerStatuses": [ended]}},
        "strategic",
    )
    marked = wait_for(lambda: condition(api, pod), 30, "the failure judged")
    assert marked["reason"] == "InfrastructureSignature"
    assert controller.failed == ""
