"""Raw Node JSON to the policy's projection."""

from __future__ import annotations

import json

from gpuguard.contract.report import ReportDocument, reported_at
from gpuguard.contract.times import format_time, parse_time
from gpuguard.controller.observe import project_node
from gpuguard.model import Action


def node(**overrides):
    base = {
        "metadata": {
            "name": "gpu-1",
            "labels": {"karpenter.sh/nodepool": "h100"},
            "annotations": {
                "gpuguard.io/report": json.dumps(
                    {
                        "reportedAt": "2026-11-29T19:00:05Z",
                        "layers": {
                            "gpu": {
                                "status": "Unhealthy",
                                "action": "REBOOT",
                                "codes": ["XID_79"],
                                "gpus": ["0000:91:00.0"],
                            }
                        },
                    }
                )
            },
        },
        "spec": {"taints": [{"key": "other", "effect": "NoSchedule"}]},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {
                    "type": "GpuguardGPUHealthy",
                    "status": "False",
                    "reason": "Xid79",
                    "lastTransitionTime": "2026-11-29T19:00:00Z",
                },
                {
                    "type": "NetworkingReady",
                    "status": "True",
                    "reason": "Healthy",
                    "lastTransitionTime": "2026-11-29T18:00:00Z",
                },
            ]
        },
    }
    base.update(overrides)
    return base


def test_projection_reads_conditions_report_and_markers():
    observed = project_node(node(), "karpenter.sh/nodepool")
    assert observed.name == "gpu-1" and observed.pool == "h100"
    gpu = observed.layers["gpu"]
    assert (gpu.status, gpu.reason, gpu.action) == ("False", "Xid79", Action.REBOOT)
    assert gpu.gpus == ("0000:91:00.0",) and gpu.codes == ("XID_79",)
    assert gpu.since == parse_time("2026-11-29T19:00:00Z")
    assert observed.layers["network"].status == "True"  # EKS names map to the same layers
    assert "Ready" not in observed.layers
    assert observed.reported_at == parse_time("2026-11-29T19:00:05Z")
    assert not observed.tainted and not observed.excluded and not observed.cordoned_by_us


def test_markers_and_our_taint():
    raw = node()
    raw["metadata"]["labels"]["gpuguard.io/exclude"] = "true"
    raw["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] = "true"
    raw["metadata"]["annotations"]["gpuguard.io/cordoned"] = "2026-11-29T19:01:00Z"
    raw["spec"] = {
        "unschedulable": True,
        "taints": [{"key": "gpuguard.io/unhealthy", "effect": "NoSchedule"}],
    }
    observed = project_node(raw, "karpenter.sh/nodepool")
    assert observed.excluded and observed.do_not_disrupt
    assert observed.tainted and observed.unschedulable and observed.cordoned_by_us


def test_a_garbled_report_recommends_nothing():
    raw = node()
    raw["metadata"]["annotations"]["gpuguard.io/report"] = "{not json"
    observed = project_node(raw, "pool")
    assert observed.layers["gpu"].action is Action.NONE
    assert observed.reported_at is None
    assert observed.pool == ""


def test_times_round_trip():
    assert format_time(parse_time("2026-11-29T19:00:00Z")) == "2026-11-29T19:00:00Z"
    assert reported_at(ReportDocument("yesterday")) is None and reported_at(None) is None


def test_degraded_layer_that_asks_for_a_repair_counts_as_unhealthy():
    raw = node()
    raw["status"]["conditions"][1].update(status="True", reason="DegradedXid13")
    raw["metadata"]["annotations"]["gpuguard.io/report"] = json.dumps(
        {
            "reportedAt": "2026-11-29T19:00:05Z",
            "layers": {
                "gpu": {
                    "status": "Degraded",
                    "action": "KILL_JOB",
                    "codes": ["XID_13"],
                    "gpus": ["0000:38:00.0"],
                }
            },
        }
    )
    gpu = project_node(raw, "pool").layers["gpu"]
    assert (gpu.status, gpu.action) == ("False", Action.KILL_JOB)
    raw["metadata"]["annotations"]["gpuguard.io/report"] = json.dumps(
        {"layers": {"gpu": {"status": "Degraded", "action": "NONE"}}}
    )
    assert project_node(raw, "pool").layers["gpu"].status == "True"  # throttling: no repair


def with_verify(request: str | None, answer: object) -> dict:
    raw = node()
    annotations = raw["metadata"]["annotations"]
    report = json.loads(annotations["gpuguard.io/report"])
    report["verify"] = answer
    annotations["gpuguard.io/report"] = json.dumps(report)
    if request is not None:
        annotations["gpuguard.io/verify-requested"] = request
    return raw


def test_verify_request_and_answer_are_projected_exactly():
    stamp = "2026-11-29T19:00:05.123456789Z"  # the policy's float, written without loss
    answer = {"requestedAt": stamp, "at": "2026-11-29T19:01:00Z", "passed": True, "codes": []}
    observed = project_node(with_verify(stamp, answer), "karpenter.sh/nodepool")
    assert observed.verify_request == stamp
    assert observed.verify is not None and observed.verify.request == stamp
    assert observed.verify.passed and observed.verify.codes == ()
    failed = {**answer, "passed": False, "codes": ["DEEP_MATMUL_SLOW"]}
    observed = project_node(with_verify(stamp, failed), "karpenter.sh/nodepool")
    assert observed.verify is not None and observed.verify.codes == ("DEEP_MATMUL_SLOW",)


def test_garbled_verify_answers_are_no_answer_and_never_a_pass():
    for garbled in (
        "passed",
        {"requestedAt": "yesterday", "passed": True, "codes": []},
        {"requestedAt": "2026-11-29T19:00:05Z", "passed": True},
    ):
        observed = project_node(with_verify("not a time", garbled), "karpenter.sh/nodepool")
        assert observed.verify is None and observed.verify_request is None
    truthy = {"requestedAt": "2026-11-29T19:00:05Z", "passed": "yes", "codes": []}
    observed = project_node(with_verify(None, truthy), "karpenter.sh/nodepool")
    assert observed.verify is not None and not observed.verify.passed
