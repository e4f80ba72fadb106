"""The agent's publisher on a fake API and a stepped clock, and the check loops' fallbacks:
stamps come from the injected clock, the heartbeat rewrites only when due, and a fallback
named in the registry's data stands down while its primary answers."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import pytest

from gpuguard.agent.check_loops import CheckLoops
from gpuguard.agent.metrics import AgentMetrics
from gpuguard.agent.node_state import NodeState
from gpuguard.agent.publisher import Publisher
from gpuguard.checks.base import CheckContext, Fallback
from gpuguard.config import Config
from gpuguard.contract.keys import REPORT_ANNOTATION
from gpuguard.kube.errors import NodeView
from gpuguard.model import CheckResult, Finding, Layer, NodeReport, Outcome
from gpuguard.sources import BundleSources
from tests.support.clock import FakeClock
from tests.support.cluster import wait_for
from tests.support.metrics import sample

START = 1_700_000_000.25  # 2023-11-14T22:13:20.25Z


class FakeNodeApi:
    def __init__(self) -> None:
        self.conditions: list[list[dict[str, Any]]] = []
        self.annotations: list[dict[str, str | None]] = []
        self.events: list[str] = []

    def get_node(self, name: str) -> NodeView:
        return NodeView(name=name, uid="uid-1", conditions={}, annotations={})

    def patch_conditions(self, name: str, conditions: list[dict[str, Any]], remove: list[str]):
        self.conditions.append(conditions)

    def patch_annotations(self, name: str, annotations: dict[str, str | None]) -> None:
        self.annotations.append(annotations)

    def create_event(self, node: NodeView, **fields: Any) -> None:
        self.events.append(fields["note"])


class NoMemory:
    def recall(self, annotation: str, node: str) -> None:
        pass

    def memory(self, report: NodeReport) -> str:
        return ""


def publisher_on(clock: FakeClock) -> tuple[Publisher, FakeNodeApi, AgentMetrics]:
    state = NodeState(["nvml"])
    state.put_result("nvml", CheckResult("nvml", Layer.GPU, Outcome.OK, [], 0.1))
    state.put_kernel_status(CheckResult("kernel-log", Layer.KERNEL, Outcome.OK, [], 0.0))
    api, metrics = FakeNodeApi(), AgentMetrics()
    publisher = Publisher(
        api,  # type: ignore[arg-type]
        "gpu-1",
        Config(heartbeat_interval_s=60),
        state,
        report=lambda: state.report(list, fail_closed=True),
        memory=NoMemory(),
        on_node=lambda annotations: None,
        metrics=metrics,
        clock=clock,
    )
    return publisher, api, metrics


def test_stamps_come_from_the_clock_and_the_heartbeat_waits_its_interval():
    clock = FakeClock(START)
    publisher, api, metrics = publisher_on(clock)
    assert publisher.publish_once()
    (written,) = api.conditions
    assert {c["lastHeartbeatTime"] for c in written} == {"2023-11-14T22:13:20Z"}
    assert '"reportedAt":"2023-11-14T22:13:20.250000Z"' in str(
        api.annotations[0][REPORT_ANNOTATION]
    )
    assert sample(metrics.registry, "gpuguard_last_publish_timestamp_seconds") == START
    assert len(api.events) == len(written)  # each condition appeared: one Event each

    clock.step(59)  # nothing changed, no heartbeat due: nothing written
    publisher.publish_once()
    assert len(api.conditions) == 1

    clock.step(1)
    publisher.publish_once()
    beat = api.conditions[-1]
    assert {c["lastHeartbeatTime"] for c in beat} == {"2023-11-14T22:14:20Z"}
    assert {c["lastTransitionTime"] for c in beat} == {"2023-11-14T22:13:20Z"}
    assert len(api.events) == len(written)  # a heartbeat is no transition


class Answers:
    """A check that answers at once, counting its runs."""

    layer: ClassVar[Layer] = Layer.GPU

    def __init__(self, name: str) -> None:
        self.name = name  # type: ignore[misc]
        self.runs = 0

    def run(self, ctx: CheckContext) -> list[Finding]:
        self.runs += 1
        return []


@pytest.mark.parametrize("cross_check", [False, True])
def test_a_fallback_in_the_data_stands_down_while_its_primary_answers(tmp_path, cross_check):
    state = NodeState(["stand-in"])
    state.put_kernel_status(CheckResult("kernel-log", Layer.KERNEL, Outcome.OK, [], 0.0))
    state.put_result("primary", CheckResult("primary", Layer.GPU, Outcome.OK, [], 0.1))
    stand_in = Answers("stand-in")
    loops = CheckLoops(
        [stand_in],
        Config(check_interval_s=0.02, cross_check=cross_check),
        BundleSources(tmp_path),
        state,
        AgentMetrics(),
        fallbacks=[Fallback(check="stand-in", primary="primary")],
    )
    stop = threading.Event()
    loops.start(stop)
    try:
        wait_for(lambda: state.report(list, fail_closed=True), 5, "the first round")
        if cross_check:
            wait_for(lambda: state.result("stand-in"), 5, "the cross-check")
        else:
            assert (stand_in.runs, state.result("stand-in")) == (0, None)
    finally:
        stop.set()
        loops.kick()
