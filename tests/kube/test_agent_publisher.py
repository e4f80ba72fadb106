"""The agent's publisher against a real kube-apiserver on a stepped clock: stamps come from
the injected clock, and the heartbeat rewrites only when due."""

from __future__ import annotations

from typing import Any

from gpuguard.agent.metrics import AgentMetrics
from gpuguard.agent.node_state import NodeState
from gpuguard.agent.publisher import Publisher
from gpuguard.config import Config
from gpuguard.contract.conditions import OWNED_TYPES
from gpuguard.contract.keys import REPORT_ANNOTATION
from gpuguard.kube.client import NodeApi
from gpuguard.kube.rest import load_api
from gpuguard.model import CheckResult, Layer, NodeReport, Outcome
from tests.support.clock import FakeClock
from tests.support.controlplane import ControlPlane
from tests.support.metrics import sample

START = 1_700_000_000.25  # 2023-11-14T22:13:20.25Z


class NoMemory:
    def recall(self, annotation: str, node: str) -> None:
        pass

    def memory(self, report: NodeReport) -> str:
        return ""


def publisher_on(
    plane: ControlPlane, node: str, clock: FakeClock
) -> tuple[Publisher, AgentMetrics]:
    state = NodeState(["nvml"])
    state.put_result("nvml", CheckResult("nvml", Layer.GPU, Outcome.OK, [], 0.1))
    state.put_kernel_status(CheckResult("kernel-log", Layer.KERNEL, Outcome.OK, [], 0.0))
    metrics = AgentMetrics()
    publisher = Publisher(
        NodeApi(load_api(plane.admin_kubeconfig), clock),
        node,
        Config(heartbeat_interval_s=60),
        state,
        report=lambda: state.report(list, fail_closed=True),
        memory=NoMemory(),
        on_node=lambda annotations: None,
        metrics=metrics,
        clock=clock,
    )
    return publisher, metrics


def ours(plane: ControlPlane, node: str) -> list[dict[str, Any]]:
    conditions = plane.request("GET", f"/api/v1/nodes/{node}")["status"].get("conditions") or []
    return [c for c in conditions if c["type"] in OWNED_TYPES]


def report_of(plane: ControlPlane, node: str) -> str:
    return str(
        plane.request("GET", f"/api/v1/nodes/{node}")["metadata"]["annotations"][REPORT_ANNOTATION]
    )


def events_for(plane: ControlPlane, node: str) -> list[dict[str, Any]]:
    answer = plane.request("GET", "/apis/events.k8s.io/v1/namespaces/default/events")
    return [e for e in answer["items"] if e["regarding"]["name"] == node]


def test_stamps_come_from_the_clock_and_the_heartbeat_waits_its_interval(control_plane, node):
    clock = FakeClock(START)
    publisher, metrics = publisher_on(control_plane, node, clock)
    assert publisher.publish_once()
    written = ours(control_plane, node)
    assert len(written) == 3  # one per layer
    assert {c["lastHeartbeatTime"] for c in written} == {"2023-11-14T22:13:20Z"}
    assert '"reportedAt":"2023-11-14T22:13:20.250000Z"' in report_of(control_plane, node)
    assert sample(metrics.registry, "gpuguard_last_publish_timestamp_seconds") == START
    assert len(events_for(control_plane, node)) == 3  # each condition appeared: one Event each

    clock.step(59)  # nothing changed, no heartbeat due: nothing written
    publisher.publish_once()
    assert ours(control_plane, node) == written

    clock.step(1)
    publisher.publish_once()
    beat = ours(control_plane, node)
    assert {c["lastHeartbeatTime"] for c in beat} == {"2023-11-14T22:14:20Z"}
    assert {c["lastTransitionTime"] for c in beat} == {"2023-11-14T22:13:20Z"}
    assert len(events_for(control_plane, node)) == 3  # a heartbeat is no transition
