"""The controller's service-level books: node time in service, Jobs counted once."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpuguard.controller.slis import (
    DEFAULT_GPU_NODES,
    ServiceLevels,
    gpu_node_in_service,
    matches,
    parse_selector,
)
from gpuguard.kube.jobs import slim_job
from gpuguard.kube.rest import WatchEvent
from gpuguard.sli import TimeShare
from tests.support.clock import FakeClock

GPU = {"nvidia.com/gpu.present": "true"}


def node(
    name: str,
    *,
    ready: str = "True",
    labels: dict[str, str] | None = None,
    unschedulable: bool = False,
    taints: tuple[str, ...] = (),
    layers: dict[str, str] | None = None,
) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": ready}]
    conditions += [{"type": kind, "status": status} for kind, status in (layers or {}).items()]
    spec: dict[str, Any] = {"taints": [{"key": key, "effect": "NoSchedule"} for key in taints]}
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "metadata": {"name": name, "labels": GPU if labels is None else labels},
        "spec": spec,
        "status": {"conditions": conditions},
    }


def job(uid: str, condition: str = "", *, gpus: str = "1", where: str = "limits") -> dict[str, Any]:
    container = {"name": "main", "resources": {where: {"nvidia.com/gpu": gpus}}}
    conditions = [{"type": condition, "status": "True"}] if condition else []
    return {
        "metadata": {
            "uid": uid,
            "namespace": "ml",
            "name": f"job-{uid}",
            "resourceVersion": "7",
            "managedFields": [{"manager": "kube-controller-manager"}],
        },
        "spec": {"template": {"spec": {"containers": [container]}}},
        "status": {"conditions": conditions},
    }


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


@pytest.fixture
def levels(clock: FakeClock) -> ServiceLevels:
    books = ServiceLevels(clock=clock)
    books.leading = True
    return books


def read(levels: ServiceLevels) -> dict[str, float]:
    """Every exported sample, as ``name{label}``."""
    registry = CollectorRegistry()
    registry.register(levels)
    return {
        f"{s.name}{{{','.join(s.labels.values())}}}": s.value
        for family in registry.collect()
        for s in family.samples
    }


# --- selectors -----------------------------------------------------------------------
def test_selector_terms():
    assert DEFAULT_GPU_NODES == (("nvidia.com/gpu.present", "true"),)
    assert parse_selector("a=b, c, d==e") == (("a", "b"), ("c", None), ("d", "e"))
    assert parse_selector("  ") == ()
    assert parse_selector("a=") == (("a", ""),)


@pytest.mark.parametrize("text", ["a!=b", "a in (b,c)", "!a", "=b", "a=b,", "a=b c"])
def test_selector_refuses_what_it_cannot_match_naming_the_term(text):
    with pytest.raises(ValueError, match="is not key=value or key"):
        parse_selector(text)


def test_selector_matches_equality_and_existence():
    selector = parse_selector("pool=h100,gpu")
    assert matches(selector, {"pool": "h100", "gpu": "", "other": "x"})
    assert not matches(selector, {"pool": "a100", "gpu": ""})
    assert not matches(selector, {"pool": "h100"})
    assert matches((), {})


# --- one node ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("settings", "up"),
    [
        ({}, True),
        ({"ready": "False"}, False),
        ({"ready": "Unknown"}, False),
        ({"unschedulable": True}, False),
        ({"taints": ("gpuguard.io/unhealthy",)}, False),
        ({"taints": ("nvidia.com/gpu",)}, True),  # a dedicated-node taint is no quarantine
        ({"layers": {"GpuguardGPUHealthy": "False"}}, False),
        ({"layers": {"AcceleratedHardwareReady": "False"}}, False),  # the EKS names too
        ({"layers": {"GpuguardKernelHealthy": "Unknown"}}, True),  # no evidence of a fault
        ({"layers": {"GpuguardGPUHealthy": "True", "NetworkingReady": "True"}}, True),
    ],
)
def test_a_node_is_in_service_only_ready_schedulable_unquarantined_and_fault_free(settings, up):
    assert gpu_node_in_service(node("n", **settings)) is up


def test_a_node_without_a_ready_condition_is_not_in_service():
    assert not gpu_node_in_service({"metadata": {"name": "n"}, "spec": {}, "status": {}})


# --- node time -----------------------------------------------------------------------
def test_node_seconds_integrate_the_gpu_nodes_in_service(levels, clock):
    levels.nodes_listed([node("a"), node("b"), node("cpu", labels={})])
    clock.step(10)
    levels.node_seen(node("b", taints=("gpuguard.io/unhealthy",)))
    clock.step(5)
    samples = read(levels)  # a scrape brings the books up to date
    assert samples["gpuguard_gpu_node_seconds_total{in_service}"] == 2 * 10 + 1 * 5
    assert samples["gpuguard_gpu_node_seconds_total{out_of_service}"] == 5
    assert samples["gpuguard_gpu_nodes{in_service}"] == 1
    assert samples["gpuguard_gpu_nodes{out_of_service}"] == 1

    levels.node_gone("a")
    levels.node_seen(node("b", labels={}))  # no longer a GPU node: out of the fleet
    clock.step(100)
    samples = read(levels)
    assert samples["gpuguard_gpu_node_seconds_total{in_service}"] == 25
    assert samples["gpuguard_gpu_node_seconds_total{out_of_service}"] == 5
    assert samples["gpuguard_gpu_nodes{in_service}"] == 0


def test_a_relist_replaces_the_nodes_known(levels, clock):
    levels.nodes_listed([node("a"), node("b")])
    clock.step(1)
    levels.nodes_listed([node("a", ready="False")])  # b was deleted while the watch was down
    clock.step(1)
    samples = read(levels)
    assert samples["gpuguard_gpu_node_seconds_total{in_service}"] == 2
    assert samples["gpuguard_gpu_node_seconds_total{out_of_service}"] == 1
    assert samples["gpuguard_gpu_nodes{out_of_service}"] == 1


def test_the_gpu_node_selector_is_the_one_given(clock):
    levels = ServiceLevels(parse_selector("pool=h100"), clock=clock)
    levels.leading = True
    levels.nodes_listed([node("a", labels={"pool": "h100"}), node("b")])
    assert read(levels)["gpuguard_gpu_nodes{in_service}"] == 1


def test_only_the_leader_exports(levels, clock):
    levels.leading = False
    levels.nodes_listed([node("a")])
    assert read(levels) == {}
    clock.step(3)
    levels.leading = True  # the books ran all along
    assert read(levels)["gpuguard_gpu_node_seconds_total{in_service}"] == 3


def test_time_share_keeps_down_time_on_its_own():
    share = TimeShare(0.0)
    share.set(0.0, up=3, total=4)
    share.advance(2.0)
    assert (share.up_seconds, share.down_seconds, share.total_seconds) == (6.0, 2.0, 8.0)
    assert share.share == 0.75


# --- jobs ----------------------------------------------------------------------------
def test_slim_job_keeps_who_whether_gpu_how_it_ended_and_whether_it_has_a_failure_policy():
    assert slim_job(job("u1", "Complete")) == {
        "metadata": {"uid": "u1", "namespace": "ml", "name": "job-u1", "resourceVersion": "7"},
        "gpu": True,
        "outcome": "succeeded",
        "podFailurePolicy": False,
    }
    with_rules = job("u1")
    with_rules["spec"]["podFailurePolicy"] = {"rules": [{"action": "Ignore"}]}
    assert slim_job(with_rules)["podFailurePolicy"] is True
    # A broken watch resumes from the last event's version, read off the projection.
    assert WatchEvent("MODIFIED", slim_job(job("u1"))).resource_version == "7"
    assert slim_job(job("u", "Failed"))["outcome"] == "failed"
    assert slim_job(job("u", "SuccessCriteriaMet"))["outcome"] == ""  # not the end yet
    assert slim_job(job("u", "FailureTarget"))["outcome"] == ""
    assert slim_job(job("u", where="requests"))["gpu"] is True
    assert slim_job(job("u", gpus="0"))["gpu"] is False
    assert slim_job({"metadata": {"uid": "u"}}) == {
        "metadata": {"uid": "u"},
        "gpu": False,
        "outcome": "",
        "podFailurePolicy": False,
    }
    init = job("u")
    pod = init["spec"]["template"]["spec"]
    pod["initContainers"], pod["containers"] = pod["containers"], [{"name": "cpu"}]
    assert slim_job(init)["gpu"] is True


def finished(levels: ServiceLevels) -> tuple[float, float]:
    samples = read(levels)
    return (
        samples["gpuguard_jobs_finished_total{succeeded}"],
        samples["gpuguard_jobs_finished_total{failed}"],
    )


def test_each_gpu_job_is_counted_once_when_it_finishes(levels):
    levels.jobs_listed([slim_job(job("done", "Complete")), slim_job(job("running"))])
    assert finished(levels) == (1, 0)  # already finished at the first list: counted once
    levels.job_seen(slim_job(job("running", "Failed")))
    levels.job_seen(slim_job(job("running", "Failed")))  # a later update of a finished Job
    levels.job_seen(slim_job(job("cpu-only", "Complete", gpus="0")))
    assert finished(levels) == (1, 1)
    # A relist after a broken watch: the same Jobs again, and one that finished meanwhile.
    levels.jobs_listed(
        [slim_job(job(uid, c)) for uid, c in (("done", "Complete"), ("running", "Failed"))]
        + [slim_job(job("new", "Complete"))]
    )
    assert finished(levels) == (2, 1)


def test_deleted_jobs_are_forgotten_without_uncounting(levels):
    levels.job_seen(slim_job(job("a", "Complete")))
    levels.job_gone(slim_job(job("a", "Complete")))
    levels.jobs_listed([])
    assert finished(levels) == (1, 0)
    assert levels._counted == set()  # the memory of counted Jobs does not grow forever
