"""Attribution of a failed pod: the platform's doing, a lost node, a finding on its GPU, a
known infrastructure signature or a lost peer; never a job's own bug
(remediation/attribution.py)."""

from __future__ import annotations

import pytest

from gpuguard.contract.report import LayerReport
from gpuguard.model import Action
from gpuguard.remediation.attribution import (
    Cause,
    NodeAtFailure,
    PodFailure,
    SelfReportedLimit,
    attribute,
)

T = 1_000_000.0
WINDOW = 600.0
GPU0, GPU1 = "0000:91:00.0", "0000:92:00.0"


def failure(**fields: object) -> PodFailure:
    base: dict[str, object] = {"pod": "ns/p-0", "job": "ns/train", "node": "n1", "at": T}
    return PodFailure(**{**base, **fields})  # type: ignore[arg-type]


def finding(
    codes: tuple[str, ...], gpus: tuple[str, ...] = (), since: float = T - 5
) -> LayerReport:
    return LayerReport("False", "Unhealthy", since, Action.REBOOT, codes, gpus)


def judged(pod: PodFailure, node: NodeAtFailure | None = None, **kw: object):
    return attribute(pod, node or NodeAtFailure(), WINDOW, **kw)  # type: ignore[arg-type]


def test_a_pod_the_platform_took_is_the_infrastructures_whatever_it_said():
    verdict = judged(
        failure(disrupted=True, signature="PY_TRACEBACK", infrastructure_signature=False)
    )
    assert verdict.infrastructure and verdict.cause is Cause.DISRUPTED


@pytest.mark.parametrize(
    "node",
    [NodeAtFailure(exists=False), NodeAtFailure(ready=False, not_ready_since=T - 30)],
    ids=["gone", "not-ready"],
)
def test_a_lost_node_is_the_infrastructures(node: NodeAtFailure):
    assert judged(failure(), node).cause is Cause.NODE_LOST


def test_a_node_that_turned_not_ready_long_after_the_failure_is_not_its_cause():
    node = NodeAtFailure(ready=False, not_ready_since=T + 2 * WINDOW)
    assert not judged(failure(), node).infrastructure


def test_an_xid_on_the_pods_gpu_is_the_infrastructures_and_on_another_gpu_is_not():
    node = NodeAtFailure(layers=(finding(("XID_79",), (GPU0,)),))
    mine = judged(failure(gpus=(GPU0,)), node)
    assert mine.cause is Cause.GPU_FAULT and GPU0 in mine.detail
    assert not judged(failure(gpus=(GPU1,)), node).infrastructure
    assert judged(failure(), node).cause is Cause.GPU_FAULT  # the pod's GPUs unknown


def test_an_xid_the_driver_blames_on_the_application_never_excuses_the_job():
    node = NodeAtFailure(layers=(finding(("XID_13",), (GPU0,)), finding(("XID_43",))))
    assert not judged(failure(gpus=(GPU0,)), node).infrastructure


def test_a_node_wide_finding_in_the_window_counts_and_one_that_came_later_does_not():
    near = NodeAtFailure(layers=(finding(("IB_LINK_DOWN",)),))
    assert judged(failure(), near).cause is Cause.NODE_FAULT
    later = NodeAtFailure(layers=(finding(("IB_LINK_DOWN",), since=T + WINDOW + 1),))
    assert not judged(failure(), later).infrastructure


def test_the_jobs_own_error_outweighs_a_coincident_finding():
    node = NodeAtFailure(layers=(finding(("IB_LINK_DOWN",)),))
    pod = failure(signature="CUDA_OUT_OF_MEMORY", infrastructure_signature=False)
    verdict = judged(pod, node)
    assert not verdict.infrastructure and "CUDA_OUT_OF_MEMORY" in verdict.detail


def test_an_infrastructure_signature_is_the_infrastructures():
    pod = failure(
        signature="NCCL_REMOTE_ERROR: remote process exited", infrastructure_signature=True
    )
    verdict = judged(pod)
    assert verdict.cause is Cause.SIGNATURE and "NCCL_REMOTE_ERROR" in verdict.detail


def test_a_rank_whose_peer_was_lost_is_the_infrastructures_and_a_crash_alone_is_nobodys():
    assert judged(failure(), peers_lost=["ns/p-1"]).cause is Cause.PEER_LOST
    alone = judged(failure())
    assert not alone.infrastructure and alone.reason == "NotAttributed"


def test_a_jobs_own_account_excuses_a_bounded_number_of_incidents():
    """A job that always dies with an NCCL error of its own making (a wrong setting) must
    still run out of retries; node evidence is never bounded."""
    limit = SelfReportedLimit(limit=2, window_s=86400, incident_s=WINDOW)
    words = failure(signature="NCCL_SYSTEM_ERROR: unhandled", infrastructure_signature=True)
    verdict = judged(words)
    # One incident: all ranks of one collective, within the window of the first.
    assert all(limit.judge("ns/train", verdict, T + s).infrastructure for s in (0, 5, 500))
    assert limit.judge("ns/train", verdict, T + 3600).infrastructure  # the second
    charged = limit.judge("ns/train", verdict, T + 7200)
    assert not charged.infrastructure and not charged.unexplained
    assert "excused 2 incidents" in charged.detail
    # Another job has its own allowance; a finding on the node is never bounded.
    assert limit.judge("ns/other", verdict, T + 7200).infrastructure
    node_fault = judged(failure(), NodeAtFailure(layers=(finding(("XID_79",)),)))
    assert limit.judge("ns/train", node_fault, T + 7300).infrastructure
    # A day later the allowance is back.
    limit.forget_before(T + 90000)
    assert limit.judge("ns/train", verdict, T + 90000).infrastructure
