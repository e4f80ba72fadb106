"""The check loops' fallbacks: a fallback named in the registry's data stands down while
its primary answers, and runs beside it when cross-checking."""

from __future__ import annotations

import threading
from typing import ClassVar

import pytest

from gpuguard.agent.check_loops import CheckLoops
from gpuguard.agent.metrics import AgentMetrics
from gpuguard.agent.node_state import NodeState
from gpuguard.checks.base import CheckContext, Fallback
from gpuguard.config import Config
from gpuguard.model import CheckResult, Finding, Layer, Outcome
from gpuguard.sources import BundleSources
from tests.support.cluster import wait_for


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
