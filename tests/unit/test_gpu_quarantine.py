"""Per-GPU quarantine's pure parts: which findings a device taint can hold, with which
effect, when it stops standing for the node's taint, and the DeviceTaintRules it writes."""

from __future__ import annotations

import dataclasses

import pytest

from gpuguard.contract.report import LayerReport
from gpuguard.controller.gpu_quarantine import Confined, GpuQuarantine, confined, window_s
from gpuguard.kube import dra
from gpuguard.model import Action
from gpuguard.remediation.model import Episode, NodeObservation
from gpuguard.remediation.policy import Policy
from tests.support.clock import FakeClock

GPU = "0000:1b:00.0"
OK = LayerReport("True", "Healthy", 0.0)


def node(**gpu: object) -> NodeObservation:
    layer = LayerReport(**{"status": "False", "reason": "Test", "since": 0.0, **gpu})  # type: ignore[arg-type]
    return NodeObservation("n1", "", {"gpu": layer, "network": OK}, reported_at=0.0)


def test_a_fatal_gpu_fault_the_policy_resets_evicts_its_pods():
    found = confined(node(action=Action.RESET_GPU, codes=("XID_48",), gpus=(GPU,)))
    assert found == Confined(frozenset({GPU}), "NoExecute", "XID_48")


@pytest.mark.parametrize(
    "layer",
    [
        {"action": Action.RESET_GPU, "degraded": True},  # usable, flagged
        {"action": Action.RESET_GPU, "deferred": True},  # the repair waits for the work
        {"action": Action.KILL_JOB},  # a job's fault: nothing to reset
    ],
)
def test_a_gpu_that_keeps_its_running_work_only_takes_no_new_claims(layer):
    found = confined(node(codes=("X",), gpus=(GPU,), **layer))
    assert found is not None and found.effect == "NoSchedule"


@pytest.mark.parametrize(
    "layer",
    [
        {"action": Action.REBOOT, "gpus": (GPU,)},  # more than a reset
        {"action": Action.RESET_GPU},  # no GPU named
        {"action": Action.RESET_GPU, "gpus": (GPU,), "status": "Unknown"},  # not known
    ],
)
def test_a_fault_a_device_taint_cannot_hold_is_the_nodes(layer):
    assert confined(node(codes=("X",), **layer)) is None


def test_a_healthy_node_names_nothing():
    assert confined(NodeObservation("n1", "", {"gpu": OK}, reported_at=0.0)) is None


def held(clock: FakeClock, episode: Episode | None = None) -> GpuQuarantine:
    """A quarantine holding ``GPU`` of n1 by its rule since 0, as ``attach`` would wire it."""
    quarantine = GpuQuarantine()
    quarantine.policy, quarantine.clock = Policy(), clock
    quarantine.episodes = lambda: {} if episode is None else {"n1": episode}
    wanted = confined(node(action=Action.RESET_GPU, codes=("XID_48",), gpus=(GPU,)))
    assert wanted is not None
    quarantine._held["n1"] = (wanted, frozenset({"gpuguard-n1-gpu-3"}), 0.0)
    return quarantine


def test_the_device_rule_stands_for_the_taint_while_the_fault_is_the_same():
    quarantine = held(FakeClock(10.0))
    same = node(action=Action.RESET_GPU, codes=("XID_48",), gpus=(GPU,))
    assert quarantine.pass_view(same).tainted
    healthy = NodeObservation("n1", "", {"gpu": OK}, reported_at=0.0)
    assert quarantine.pass_view(healthy).tainted  # so the close takes the rule off
    other = node(action=Action.RESET_GPU, codes=("XID_48",), gpus=("0000:1c:00.0",))
    assert not quarantine.pass_view(other).tainted  # re-targeted by the next taint


def test_the_node_is_tainted_once_the_rung_or_the_time_outgrows_a_reset():
    same = node(action=Action.RESET_GPU, codes=("XID_48",), gpus=(GPU,))
    clock = FakeClock(10.0)
    climbed = Episode("n1", opened_at=0.0, rung=Action.REBOOT)
    assert not held(clock, climbed).pass_view(same).tainted
    exhausted = Episode("n1", opened_at=0.0, rung=Action.RESET_GPU, exhausted=True)
    assert not held(clock, exhausted).pass_view(same).tainted
    clock.set(window_s(Policy()) + 1)
    assert not held(clock).pass_view(same).tainted


def test_rules_are_named_per_node_and_device_within_the_name_limit():
    assert dra.rule_name("Node.A", "gpu-3") == "gpuguard-node.a-gpu-3"
    long = dra.rule_name("n" * 250, "gpu-3")
    assert len(long) <= dra.MAX_NAME and long != dra.rule_name("n" * 250, "gpu-4")


def test_a_rule_selects_one_device_and_refuses_what_its_version_does_not_take():
    taints = dra.DeviceTaints("v1alpha3", dra.effects_of("v1alpha3"))
    device = dra.Device("gpu.nvidia.com", "pool-1", "gpu-3")
    body = dra.rule(taints, "n1", device, "NoExecute", "XID 48!")
    assert body["apiVersion"] == "resource.k8s.io/v1alpha3"
    assert body["spec"]["deviceSelector"] == {
        "driver": "gpu.nvidia.com",
        "pool": "pool-1",
        "device": "gpu-3",
    }
    assert body["spec"]["taint"] == {
        "key": "gpuguard.io/unhealthy",
        "effect": "NoExecute",
        "value": "XID_48",
    }
    assert body["metadata"]["annotations"] == {dra.NODE_ANNOTATION: "n1"}
    with pytest.raises(ValueError, match="effect None"):
        dra.rule(taints, "n1", device, "None", "")
    assert "None" in dra.effects_of("v1beta2") and not dra.effects_of("")


def test_gpus_resolve_by_either_spelling_of_the_bus_id_or_the_uuid():
    gpu3 = dra.Device("d", "p", "gpu-3", uuid="GPU-abc", pci="0000:1b:00.0")
    gpu4 = dataclasses.replace(gpu3, name="gpu-4", uuid="GPU-def", pci="0000:1c:00.0")
    found = dra.resolve([gpu3, gpu4], ["00000000:1B:00.0", "gpu-def"])
    assert found == {"00000000:1B:00.0": gpu3, "gpu-def": gpu4}
    assert dra.resolve([gpu3], [GPU, "0000:99:00.0"]) is None
