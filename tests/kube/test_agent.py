"""The agent against a real kube-apiserver: conditions, transitions, events, outages.

The GPU backend is a bundle directory of real captured outputs; the kernel log is a file
the test appends lines to, as the driver would.
"""

from __future__ import annotations

import json
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuguard.agent.daemon import Agent
from gpuguard.agent.metrics import AgentMetrics, serve
from gpuguard.checks.registry import default_checks
from gpuguard.config import Config
from gpuguard.contract.keys import MEMORY_ANNOTATION, REPORT_ANNOTATION
from gpuguard.contract.times import parse_time
from gpuguard.kernel_log.followers import FileFollower
from gpuguard.kube.client import NodeApi
from gpuguard.kube.rest import load_api
from gpuguard.sources import BundleSources, LiveSources, Sources
from tests.conftest import DATA
from tests.support.cluster import wait_for
from tests.support.controlplane import ControlPlane, free_port
from tests.support.metrics import sample

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
XID79 = (
    "[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus.\n"
)
FAST = {
    "check_interval_s": 0.5,
    "heartbeat_interval_s": 2.0,
    "expected_gpus": 1,
    "expected_nics": 3,
    "expected_link_gbps": 400,
    "metrics_port": 0,
}
GPU, NETWORK, KERNEL = "GpuguardGPUHealthy", "GpuguardNetworkHealthy", "GpuguardKernelHealthy"


class RunningAgent:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.stop = threading.Event()
        self.thread = threading.Thread(target=agent.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def halt(self) -> None:
        self.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive(), "agent did not stop"


@pytest.fixture
def start_agent(control_plane: ControlPlane) -> Iterator[Callable[..., RunningAgent]]:
    running: list[RunningAgent] = []

    def start(node: str, sources: Sources, log: Path, **settings: Any) -> RunningAgent:
        config = Config(**{**FAST, **settings})
        api = NodeApi(load_api(control_plane.admin_kubeconfig))
        agent = Agent(config, sources, default_checks(), FileFollower(log, 0.05), node, api)
        running.append(RunningAgent(agent))
        return running[-1]

    yield start
    for agent in running:
        agent.halt()


def bundle_from(example: str, tmp_path: Path) -> tuple[BundleSources, Path]:
    bundle = tmp_path / "bundle"
    shutil.copytree(EXAMPLES / example, bundle)
    (bundle / "boot_id").write_text(f"boot-{uuid.uuid4()}\n")
    return BundleSources(bundle), bundle / "kmsg.log"


def conditions(plane: ControlPlane, node: str) -> dict[str, dict[str, Any]]:
    answer = plane.request("GET", f"/api/v1/nodes/{node}")
    return {c["type"]: c for c in answer.get("status", {}).get("conditions", [])}


def condition_is(plane: ControlPlane, node: str, kind: str, status: str, reason: str | None = None):
    def check() -> dict[str, Any] | None:
        found = conditions(plane, node).get(kind)
        if found and found["status"] == status and (reason is None or found["reason"] == reason):
            return found
        return None

    return check


def reported_at(plane: ControlPlane, node: str) -> float:
    """When the agent last wrote its report annotation (0: never)."""
    annotations = plane.request("GET", f"/api/v1/nodes/{node}")["metadata"].get("annotations")
    report = (annotations or {}).get(REPORT_ANNOTATION)
    return parse_time(json.loads(report)["reportedAt"]) if report else 0.0


def events_for(plane: ControlPlane, node: str) -> list[dict[str, Any]]:
    answer = plane.request("GET", "/apis/events.k8s.io/v1/namespaces/default/events")
    return [e for e in answer["items"] if e["regarding"]["name"] == node]


def test_healthy_node_gets_three_true_conditions(control_plane, node, start_agent, tmp_path):
    sources, log = bundle_from("healthy-h100", tmp_path)
    start_agent(node, sources, log)
    for kind in (GPU, NETWORK, KERNEL):
        found = wait_for(condition_is(control_plane, node, kind, "True", "Healthy"), what=kind)
        assert found["message"].startswith("checked by")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_check_loop_stops_the_agent_rather_than_freeze_its_verdict(
    control_plane, node, start_agent, tmp_path
):
    """A loop that dies (here: storing its result raises, as a bug would) leaves its
    layer's last verdict, Healthy, standing for good: the agent stops itself instead."""
    sources, log = bundle_from("healthy-h100", tmp_path)
    running = start_agent(node, sources, log)
    wait_for(condition_is(control_plane, node, GPU, "True", "Healthy"), what="healthy first")
    state = running.agent.state
    store = state.put_result

    def broken(name: str, result: Any) -> None:
        if name == "nvidia-smi":
            raise RuntimeError("a bug in storing a result")
        store(name, result)

    state.put_result = broken  # type: ignore[method-assign]
    wait_for(lambda: not running.thread.is_alive(), 20, "the agent to stop")
    assert running.agent.failed == "thread loop-nvidia-smi died"


@pytest.mark.parametrize(
    ("example", "kind", "reason"),
    [
        ("xid79-fallen-off-bus", GPU, None),
        ("ib-link-half-rate", NETWORK, "LinkRateDegraded"),
    ],
)
def test_failure_fixtures_give_false_conditions(
    control_plane, node, start_agent, tmp_path, example, kind, reason
):
    sources, log = bundle_from(example, tmp_path)
    start_agent(node, sources, log)
    found = wait_for(condition_is(control_plane, node, kind, "False", reason), what=kind)
    if example.startswith("xid79"):
        assert "XID_79 gpu 0000:91:00.0" in found["message"]


def test_truncated_nvidia_smi_fails_closed_on_the_node(control_plane, node, start_agent, tmp_path):
    sources, log = bundle_from("healthy-h100", tmp_path)
    shutil.copy(
        DATA / "nvidia-smi-q_h100_535.183.01_truncated_invalid.txt", sources.root / "nvidia-smi.txt"
    )
    start_agent(node, sources, log)
    wait_for(condition_is(control_plane, node, GPU, "False", "OutputUnparseable"))


def test_xid79_appended_flips_gpu_condition_within_a_second_and_back(
    control_plane, node, start_agent, tmp_path
):
    sources, log = bundle_from("healthy-h100", tmp_path)
    start_agent(node, sources, log)
    healthy = wait_for(condition_is(control_plane, node, GPU, "True"))

    with log.open("a") as handle:
        handle.write(XID79)
    written = time.monotonic()
    broken = wait_for(condition_is(control_plane, node, GPU, "False", "Xid79"), timeout_s=5)
    assert time.monotonic() - written < 1.5
    assert "gpu 0000:91:00.0" in broken["message"]
    assert broken["lastTransitionTime"] >= healthy["lastTransitionTime"]

    # The report the controller acts on: the recommended rung and the GPUs it concerns.
    report = wait_for(
        lambda: (
            json.loads(
                control_plane.request("GET", f"/api/v1/nodes/{node}")["metadata"][
                    "annotations"
                ].get(REPORT_ANNOTATION, "{}")
            )
            .get("layers", {})
            .get("gpu", {})
            .get("action")
            == "REBOOT"
            and json.loads(
                control_plane.request("GET", f"/api/v1/nodes/{node}")["metadata"]["annotations"][
                    REPORT_ANNOTATION
                ]
            )
        ),
        what="the report annotation",
    )
    assert report["layers"]["gpu"]["codes"] == ["XID_79"]
    assert report["layers"]["gpu"]["gpus"] == ["0000:91:00.0"]
    assert report["layers"]["network"]["status"] == "Healthy"

    # Heartbeats refresh lastHeartbeatTime, never lastTransitionTime, while nothing changes.
    later = wait_for(
        lambda: (
            (c := conditions(control_plane, node)[GPU])["lastHeartbeatTime"]
            > broken["lastHeartbeatTime"]
            and c
        ),
        timeout_s=6,
        what="a heartbeat",
    )
    assert later["status"] == "False"
    assert later["lastTransitionTime"] == broken["lastTransitionTime"]

    # The cause clears with a new boot: a fresh kernel log and a new boot id. Condition
    # times have one-second resolution; the heartbeat above is stamped a second later than
    # the transition already, so the next transition cannot share its second.
    (sources.root / "boot_id").write_text("boot-after-reboot\n")
    fresh = log.with_name("kmsg.new")
    shutil.copy(EXAMPLES / "clean-boot.log", fresh)
    fresh.replace(log)
    restored = wait_for(condition_is(control_plane, node, GPU, "True", "Healthy"))
    assert restored["lastTransitionTime"] > broken["lastTransitionTime"]

    reasons = [e["reason"] for e in events_for(control_plane, node)]
    assert reasons.count("Xid79") == 1  # one Event per transition, not per poll
    event = next(e for e in events_for(control_plane, node) if e["reason"] == "Xid79")
    assert event["type"] == "Warning"
    assert "XID_79" in event["note"]


def test_api_server_outage_loses_nothing(control_plane, node, start_agent, tmp_path):
    sources, log = bundle_from("healthy-h100", tmp_path)
    running = start_agent(node, sources, log)
    registry = running.agent.metrics.registry

    def publish_errors() -> float:
        return sample(registry, "gpuguard_publish_errors_total", kind="unavailable")

    wait_for(condition_is(control_plane, node, GPU, "True"))
    control_plane.stop_apiserver()
    try:
        with log.open("a") as handle:
            handle.write(XID79)
        # The agent sees the line and fails to publish, with backoff.
        wait_for(lambda: publish_errors() >= 2, 10, "failed publishes")
        assert running.thread.is_alive()
    finally:
        control_plane.start_apiserver()
    wait_for(condition_is(control_plane, node, GPU, "False", "Xid79"), timeout_s=45)
    assert publish_errors() >= 1


def test_restart_does_not_flip_a_known_bad_node_healthy(control_plane, node, start_agent, tmp_path):
    sources, log = bundle_from("healthy-h100", tmp_path)
    first = start_agent(node, sources, log)
    wait_for(condition_is(control_plane, node, GPU, "True"))
    with log.open("a") as handle:
        handle.write(XID79)
    broken = wait_for(condition_is(control_plane, node, GPU, "False", "Xid79"))
    wait_for(
        lambda: (
            control_plane.request("GET", f"/api/v1/nodes/{node}")["metadata"]
            .get("annotations", {})
            .get(MEMORY_ANNOTATION)
        ),
        what="the remembered findings",
    )
    first.halt()

    # Same boot, but the line is gone from the log (ring buffer wrapped).
    shutil.copy(EXAMPLES / "clean-boot.log", log)
    restarted = time.time()
    start_agent(node, sources, log)
    # Its first publish (the conditions, then the report) comes after its first check round.
    wait_for(lambda: reported_at(control_plane, node) > restarted, what="a report after restart")
    still = conditions(control_plane, node)[GPU]
    assert still["status"] == "False"
    assert still["lastTransitionTime"] == broken["lastTransitionTime"]
    assert "XID_79" in still["message"]


def test_hanging_diagnostic_flips_gpu_condition_within_its_timeout(
    control_plane, node, start_agent, tmp_path
):
    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\nexec sleep 1000\n")
    tool.chmod(stat.S_IRWXU)
    log = tmp_path / "kern.log"
    shutil.copy(EXAMPLES / "clean-boot.log", log)
    settings = {
        "tools": {"nvidia-smi": str(tool), "dcgmi": str(tmp_path / "absent")},
        "kernel_log": str(log),
        "infiniband_sysfs": str(tmp_path / "no-ib"),
        "timeouts": {"nvidia-smi": 1.0},
        "expected_nics": None,
        "expected_link_gbps": None,
    }
    started = time.monotonic()
    start_agent(node, LiveSources(Config(**{**FAST, **settings})), log, **settings)
    found = wait_for(condition_is(control_plane, node, GPU, "False", "CheckTimedOut"), timeout_s=10)
    assert time.monotonic() - started < 1.0 + 0.5 + 3  # timeout, grace, API round trips
    assert "node" in found["message"]


def test_eks_profile_writes_eks_names_and_removes_ours(control_plane, node, start_agent, tmp_path):
    sources, log = bundle_from("healthy-h100", tmp_path)
    first = start_agent(node, sources, log)
    wait_for(condition_is(control_plane, node, GPU, "True"))
    first.halt()
    start_agent(node, sources, log, condition_profile="eks")
    for kind in ("AcceleratedHardwareReady", "NetworkingReady", "KernelReady"):
        wait_for(condition_is(control_plane, node, kind, "True"), what=kind)
    wait_for(lambda: GPU not in conditions(control_plane, node), what="old types removed")


def test_metrics_and_probes(control_plane, node, tmp_path):
    sources, log = bundle_from("xid79-fallen-off-bus", tmp_path)
    metrics = AgentMetrics()
    port = free_port()
    server = serve(metrics, port, host="127.0.0.1")
    api = NodeApi(load_api(control_plane.admin_kubeconfig))
    agent = Agent(
        Config(**FAST), sources, default_checks(), FileFollower(log, 0.05), node, api, metrics
    )
    running = RunningAgent(agent)
    try:
        wait_for(lambda: metrics.ready.is_set(), what="first publish")
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{base}/readyz") as answer:
            assert answer.status == 200
        with urllib.request.urlopen(f"{base}/healthz") as answer:
            assert answer.status == 200
        with urllib.request.urlopen(f"{base}/metrics") as answer:
            text = answer.read().decode()
        assert 'gpuguard_layer_status{layer="gpu",status="Unhealthy"} 1.0' in text
        assert 'gpuguard_xid_events_total{xid="79"} 1.0' in text
        assert 'gpuguard_findings{code="XID_79",layer="gpu",severity="critical"} 1.0' in text
        assert 'gpuguard_check_runs_total{check="nvidia-smi",outcome="ok"}' in text
        assert "gpuguard_last_publish_timestamp_seconds" in text
        assert sample(metrics.registry, "gpuguard_publish_duration_seconds_count") >= 1
    finally:
        running.halt()
        server.shutdown()


def test_agent_process_publishes_and_exits_cleanly_on_sigterm(control_plane, node, tmp_path):
    sources, _ = bundle_from("healthy-h100", tmp_path)
    config = tmp_path / "agent.yaml"
    config.write_text("check_interval_s: 1\nmetrics_port: 0\nexpected_gpus: 1\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuguard.cli",
            "agent",
            "--node-name",
            node,
            "--config",
            str(config),
            "--kubeconfig",
            str(control_plane.admin_kubeconfig),
            "--bundle",
            str(sources.root),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(condition_is(control_plane, node, GPU, "True"), timeout_s=30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "gpuguard agent stopped" in proc.stderr.read()
