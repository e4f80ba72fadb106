"""The verify gate on the real API server: the controller asks through the Node, the real
agent runs its deep check (a fake suite the test holds and releases) and answers in its
report, and the node returns to service only after that pass."""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gpuguard.agent.daemon import Agent
from gpuguard.agent.deep import Activity, Idleness
from gpuguard.agent.repair import BundleRepair, RepairExecutor
from gpuguard.checks.base import CheckContext
from gpuguard.checks.registry import default_checks
from gpuguard.config import Config
from gpuguard.contract.keys import REPORT_ANNOTATION, VERIFY_REQUEST_ANNOTATION
from gpuguard.controller.loop import Controller
from gpuguard.kernel_log.followers import FileFollower
from gpuguard.kube.client import NodeApi
from gpuguard.kube.rest import KubeApi, load_api
from gpuguard.model import NODE, Action, Finding, Layer, Severity
from gpuguard.sources import BundleSources
from tests.support.cluster import make_node, set_health, stamp, wait_for
from tests.support.controllers import (
    FAST_POLICY,
    POOL,
    Running,
    append,
    node,
    node_name,
    reconciled,
    repairs,
    status_of,
    tainted,
)
from tests.support.controlplane import ControlPlane

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GATE = {"verify": {"enabled": True, "timeout_s": 60, "rungs": ["RESET_GPU"]}}
DBE = "An uncorrectable double bit error (DBE) has been detected on GPU"


class HeldDeepCheck:
    """The deep suite as the test drives it: it starts, waits for ``release``, then answers
    with ``findings`` (none: a pass)."""

    name: ClassVar[str] = "deep-gpu"
    layer: ClassVar[Layer] = Layer.GPU

    def __init__(self, findings: list[Finding] | None = None) -> None:
        self.findings = findings or []
        self.started = threading.Event()
        self.release = threading.Event()
        self.runs = 0

    def run(self, ctx: CheckContext) -> list[Finding]:
        self.runs += 1
        self.started.set()
        self.release.wait(30)
        return list(self.findings)


@pytest.fixture
def start_agent(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Callable[..., Path]]:
    running: list[Running] = []

    def start(name: str, deep: HeldDeepCheck, heartbeat_interval_s: float = 1) -> Path:
        bundle = tmp_path / name
        shutil.copytree(EXAMPLES / "healthy-h100", bundle)
        (bundle / "boot_id").write_text(f"boot-{uuid.uuid4()}\n")
        config = Config(
            check_interval_s=0.5,
            heartbeat_interval_s=heartbeat_interval_s,
            metrics_port=0,
            expected_gpus=1,
        )
        agent = Agent(
            config,
            BundleSources(bundle),
            default_checks(),
            FileFollower(bundle / "kmsg.log", 0.05),
            name,
            NodeApi(load_api(control_plane.admin_kubeconfig)),
            deep_check=deep,
            idleness=lambda: Idleness(Activity.BUSY, "never scheduled here"),
        )
        rest = load_api(control_plane.admin_kubeconfig)
        executor = RepairExecutor(
            rest, name, BundleRepair(bundle / "repairs.log"), agent.after_repair
        )
        running.extend([Running(agent.run), Running(executor.run)])
        return bundle

    yield start
    for item in running:
        item.halt()


def annotations(api: KubeApi, name: str) -> dict[str, str]:
    return dict(node(api, name)["metadata"].get("annotations") or {})


def report(api: KubeApi, name: str) -> dict[str, Any]:
    return dict(json.loads(annotations(api, name).get(REPORT_ANNOTATION, "{}")))


def broken_then_reset(
    api: KubeApi, start_agent, start_controller, deep: HeldDeepCheck
) -> tuple[str, Controller, Path]:
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    bundle = start_agent(name, deep)
    controller = start_controller(**GATE)
    wait_for(lambda: node(api, name)["status"]["conditions"], what="the agent's first report")
    append(bundle, 48, DBE)
    wait_for(lambda: tainted(api, name), what="quarantine")
    wait_for(lambda: deep.started.is_set(), 40, "the agent running the requested verify")
    # The first repair; a verify that fails at once may already have escalated past it.
    assert repairs(bundle)[0] == "reset 0000:91:00.0"
    return name, controller, bundle


def test_repaired_node_returns_to_service_only_after_the_verify_passes(
    api, start_agent, start_controller
):
    deep = HeldDeepCheck()
    name, controller, bundle = broken_then_reset(api, start_agent, start_controller, deep)
    stamp = annotations(api, name)[VERIFY_REQUEST_ANNOTATION]
    assert repairs(bundle) == ["reset 0000:91:00.0"]  # held in the verify: nothing more
    # Past clear_after_s of healthy reports, reconciled: healthy, but not verified.
    wait_for(lambda: report(api, name)["layers"]["gpu"]["status"] == "Healthy", 20, "healthy")
    reconciled(controller, after=time.time() + FAST_POLICY["clear_after_s"])
    assert status_of(api, name)["phase"] == "Verifying" and tainted(api, name)

    deep.release.set()
    closed = wait_for(lambda: status_of(api, name).get("resolution"), 30, "the close")
    assert closed == "Repaired"
    assert "passed the deep verify" in status_of(api, name)["lastMessage"]
    wait_for(lambda: not tainted(api, name), what="untaint")
    answer = report(api, name)["verify"]
    assert answer["requestedAt"] == stamp and answer["passed"] is True
    assert deep.runs == 1  # one request, one run, though the agent saw it at every heartbeat
    wait_for(lambda: VERIFY_REQUEST_ANNOTATION not in annotations(api, name), what="withdrawn")


def test_failed_verify_escalates_instead_of_returning_the_node(api, start_agent, start_controller):
    slow = Finding(
        Layer.GPU, "DEEP_MATMUL_SLOW", Severity.WARNING, Action.RESET_GPU, NODE, "deep-gpu", "slow"
    )
    deep = HeldDeepCheck([slow])
    deep.release.set()
    name, _, bundle = broken_then_reset(api, start_agent, start_controller, deep)
    rung = wait_for(
        lambda: status_of(api, name).get("rung") == "REBOOT" and status_of(api, name),
        30,
        "escalation to REBOOT",
    )
    assert "deep verify after RESET_GPU attempt 1 failed: DEEP_MATMUL_SLOW" in json.dumps(rung)
    assert tainted(api, name) and not status_of(api, name).get("resolution")
    assert report(api, name)["verify"]["codes"] == ["DEEP_MATMUL_SLOW"]
    wait_for(lambda: repairs(bundle)[1:2] == ["reboot"], 30, "the reboot carried out")


def test_agent_sees_a_verify_request_at_once_not_at_its_next_heartbeat(api, start_agent):
    # An hour between heartbeats: only the agent's watch of its Node can see the request.
    deep = HeldDeepCheck()
    deep.release.set()
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    start_agent(name, deep, heartbeat_interval_s=3600)
    wait_for(lambda: node(api, name)["status"]["conditions"], what="the agent's first report")
    stamp = "2026-11-29T12:00:00Z"
    requested = time.monotonic()
    api.patch(
        f"/api/v1/nodes/{name}", {"metadata": {"annotations": {VERIFY_REQUEST_ANNOTATION: stamp}}}
    )
    wait_for(lambda: deep.started.is_set(), 10, "the requested verify to start")
    assert time.monotonic() - requested < 5
    answer = wait_for(lambda: report(api, name).get("verify"), 10, "the answer in the report")
    assert answer["requestedAt"] == stamp and answer["passed"] is True
    assert deep.runs == 1


# --- slowness confirmed by a second measurement (the test answers as the agent would) ------
SLOW: dict[str, Any] = {
    "gpu": "False",
    "action": "RESET_GPU",
    "codes": ("DEEP_MATMUL_SLOW",),
    "gpus": ("0000:91:00.0",),
    "deferred": True,
}


def slow_node_measured_again(api: KubeApi, start_controller, passed: bool, *codes: str):
    """A node whose report shows only slowness; the controller asks for a second
    measurement and gets ``passed``/``codes`` as the agent's deep suite would answer."""
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    set_health(api, name, **SLOW)
    controller = start_controller()
    request = wait_for(
        lambda: annotations(api, name).get(VERIFY_REQUEST_ANNOTATION), 30, "the verify request"
    )
    assert status_of(api, name)["phase"] == "Quarantined" and not status_of(api, name).get(
        "request"
    )
    answer = {"requestedAt": request, "at": stamp(), "passed": passed, "codes": list(codes)}
    set_health(api, name, **SLOW, verify=answer)
    return name, controller


def test_slowness_a_second_measurement_does_not_confirm_starts_no_reset(api, start_controller):
    name, controller = slow_node_measured_again(api, start_controller, True)
    wait_for(
        lambda: "not confirmed" in (status_of(api, name).get("lastMessage") or ""),
        30,
        "the episode saying the slowness was not confirmed",
    )
    reconciled(controller, times=3)  # passes on: none of them resets
    status = status_of(api, name)
    assert status["phase"] == "Quarantined" and not status.get("rung")
    assert not status.get("request") and tainted(api, name)
    assert not node(api, name)["spec"].get("unschedulable")
    assert any("the second measurement passed" in s["message"] for s in status["steps"])


def test_slowness_a_second_measurement_confirms_is_reset(api, start_controller):
    name, _ = slow_node_measured_again(api, start_controller, False, "DEEP_MATMUL_SLOW")
    asked = wait_for(lambda: status_of(api, name).get("request"), 30, "the RESET_GPU request")
    assert asked["action"] == "RESET_GPU" and asked["gpus"] == ["0000:91:00.0"]
