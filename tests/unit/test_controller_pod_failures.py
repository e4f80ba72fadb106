"""Reading a failed training pod from the slim copy the watch keeps
(controller/pod_failures.py, controller/pods.py)."""

from __future__ import annotations

from typing import Any

from gpuguard.contract.keys import GPU_IDS_ANNOTATION, INFRASTRUCTURE_FAILURE_CONDITION
from gpuguard.controller.attribution import node_at, with_crash_layer
from gpuguard.controller.pod_failures import MESSAGE_LIMIT, failure_of, training_job
from gpuguard.controller.pods import slim_pod
from gpuguard.remediation.crash_memory import CRASH_LAYER, Suspicion, crash_layer
from gpuguard.remediation.model import NodeObservation

NCCL = "ncclRemoteError: remote process exited or there was a network error"


def failed_pod(message: str = "", exit_code: int = 1, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "train-0",
            "namespace": "ml",
            "uid": "u1",
            "labels": {"batch.kubernetes.io/job-name": "train", "team": "x"},
            "ownerReferences": [{"kind": "Job", "name": "train", "uid": "j1"}],
            "annotations": {GPU_IDS_ANNOTATION: "0000:91:00.0, 0000:92:00.0"},
            **meta,
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "trainer"}]},
        "status": {
            "phase": "Failed",
            "conditions": [
                {"type": "Ready", "status": "False", "message": "long" * 100},
                {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"},
            ],
            "containerStatuses": [
                {
                    "name": "trainer",
                    "image": "big-image",
                    "state": {
                        "terminated": {
                            "exitCode": exit_code,
                            "reason": "Error",
                            "message": message,
                            "finishedAt": "2026-12-01T10:00:00Z",
                        }
                    },
                }
            ],
        },
    }


def test_the_slim_failed_pod_keeps_the_job_the_judging_conditions_and_the_endings():
    slim = slim_pod(failed_pod(NCCL))
    assert slim["metadata"]["labels"] == {"batch.kubernetes.io/job-name": "train"}
    assert [c["type"] for c in slim["status"]["conditions"]] == ["DisruptionTarget"]
    (ending,) = slim["status"]["containerStatuses"]
    assert ending["exitCode"] == 1 and ending["message"] == NCCL and "image" not in ending


def test_a_megabyte_message_is_kept_by_its_tail_only():
    slim = slim_pod(failed_pod("x" * (1 << 20) + NCCL))
    message = slim["status"]["containerStatuses"][0]["message"]
    assert len(message) == MESSAGE_LIMIT and message.endswith(NCCL)


def test_a_running_pod_keeps_no_endings():
    pod = failed_pod()
    pod["status"]["phase"] = "Running"
    assert "containerStatuses" not in slim_pod(pod)["status"]


def test_the_job_is_the_gangs_and_a_pod_of_no_job_serves_none():
    pod = failed_pod()
    pod["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] = "gang"
    assert training_job(slim_pod(pod)) == "ml/gang"
    assert training_job(slim_pod(failed_pod(labels={}))) == "ml/train"  # by its owner
    assert training_job(slim_pod(failed_pod(labels={}, ownerReferences=[]))) == ""


def test_the_failure_carries_its_time_gpus_signature_and_disruption():
    failure = failure_of(slim_pod(failed_pod(NCCL)), seen_at=0.0)
    assert failure.pod == "ml/train-0" and failure.job == "ml/train" and failure.node == "n1"
    assert failure.at == 1_796_119_200.0
    assert failure.gpus == ("0000:91:00.0", "0000:92:00.0")
    assert failure.disrupted and failure.infrastructure_signature is True


def test_garbage_endings_read_as_nothing_recognised():
    pod = failed_pod()
    pod["status"]["containerStatuses"] = [None, {"state": {"terminated": {"message": 7}}}]
    failure = failure_of(slim_pod(pod), seen_at=5.0)
    assert failure.at == 5.0 and failure.infrastructure_signature is None


def test_our_own_condition_is_kept_so_a_pod_is_never_judged_twice():
    pod = failed_pod()
    pod["status"]["conditions"].append(
        {"type": INFRASTRUCTURE_FAILURE_CONDITION, "status": "True", "reason": "NodeLost"}
    )
    kept = [c["type"] for c in slim_pod(pod)["status"]["conditions"]]
    assert INFRASTRUCTURE_FAILURE_CONDITION in kept


def test_a_node_read_for_attribution():
    assert not node_at(None, None).exists
    node = {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
    read = node_at(node, None)
    assert not read.ready and read.not_ready_since is None


def test_the_crash_layer_comes_and_goes_with_the_suspicion():
    observed = NodeObservation("n1", "pool", {}, None)
    name, layer = crash_layer(Suspicion("n1", ("a", "b", "c"), 0.0, 1))
    with_layer = with_crash_layer(observed, (name, layer))
    assert with_layer.layers[CRASH_LAYER] == layer
    assert CRASH_LAYER not in with_crash_layer(with_layer, None).layers
    assert with_crash_layer(observed, None) is observed
