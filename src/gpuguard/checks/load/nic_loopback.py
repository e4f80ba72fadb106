"""A loopback bandwidth test per RDMA adapter: server and client on the same port, so a
NIC that is up at a fraction of its rate shows it without a second node.

InfiniBand and RoCE ports run perftest's ``ib_write_bw``; EFA runs libfabric's
``fi_pingpong``. The measured rate is judged against ``expected_link_gbps`` and against the
node's other adapters.
"""

from __future__ import annotations

import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from gpuguard.checks.base import CheckContext
from gpuguard.checks.load.perftest import Bandwidth, parse_fi_pingpong, parse_perftest_bw
from gpuguard.checks.network.sysfs import PortRecord, read_infiniband_sysfs
from gpuguard.checks.rules import Rule
from gpuguard.errors import CheckError, CheckFailed, NotApplicable, ToolMissing
from gpuguard.model import Action, Finding, Layer, Severity, nic
from gpuguard.sources import LiveSources, run_tool

SOURCE = "deep-network"
BASE_PORT = 18600  # one TCP port per adapter for the test's own handshake
SERVER_START_S = 0.5


@dataclass(frozen=True)
class LoopbackPlan:
    port: PortRecord
    tool: str  # "ib_write_bw" or "fi_pingpong"
    server: list[str]
    client: list[str]
    parse: Callable[[str], list[Bandwidth]]


def plan_loopback(port: PortRecord, tcp_port: int, seconds: int) -> LoopbackPlan:
    if port.link_layer in ("InfiniBand", "Ethernet"):
        common = ["-d", port.device, "-i", str(port.port), "-p", str(tcp_port)]
        common += ["--report_gbits", "-F", "-D", str(seconds), "-s", "1048576"]
        return LoopbackPlan(port, "ib_write_bw", common, [*common, "localhost"], parse_perftest_bw)
    # EFA: libfabric's provider, reliable datagram endpoints, 1 MiB messages.
    common = ["-p", "efa", "-e", "rdm", "-d", port.device, "-P", str(tcp_port), "-S", "1048576"]
    common += ["-I", "1000"]
    return LoopbackPlan(port, "fi_pingpong", common, [*common, "localhost"], parse_fi_pingpong)


def run_loopback(plan: LoopbackPlan, tool_path: str, timeout_s: float) -> float:
    """The best bandwidth the loopback reached, Gb/s; raises a CheckError otherwise."""
    try:
        server = subprocess.Popen(
            [tool_path, *plan.server],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as exc:
        raise CheckFailed(f"{plan.tool}: cannot start the server: {exc}") from None
    try:
        time.sleep(SERVER_START_S)
        output = run_tool([tool_path, *plan.client], timeout_s)
    finally:
        server.kill()
        server.wait(timeout=5)
    if output.exit_code != 0:
        raise CheckFailed(f"{plan.tool} on {plan.port.name} exited {output.exit_code}")
    return max(row.gbps for row in plan.parse(output.text))


# As for a link that trained down: renegotiate. Deferred: the port is up and its traffic
# arrives, only slowly, so the node's jobs may finish first (no new work lands), then it is
# drained and rebooted.
BELOW_EXPECTED = Rule(
    "DEEP_NIC_LOOPBACK_SLOW",
    Severity.WARNING,
    Action.REBOOT,
    "slower than the expected link rate",
    deferred=True,
)
# Slower than its siblings only: no rate to hold it to, so flag it and repair nothing.
BELOW_SIBLINGS = Rule(
    "DEEP_NIC_LOOPBACK_SLOW", Severity.WARNING, Action.NONE, "slower than its siblings"
)
MEASURED = Rule("DEEP_NIC_LOOPBACK_MEASURED", Severity.INFO, Action.NONE, "what was measured")


def judge_loopback(
    measured: dict[str, float], expected_gbps: float | None, slow_fraction: float
) -> list[Finding]:
    """Each adapter against the expected link rate and against its siblings' median."""
    findings = []
    median = statistics.median(measured.values()) if len(measured) >= 2 else None
    for name, gbps in sorted(measured.items()):
        device, _, port = name.partition("/")
        component = nic(device, port or None)
        if expected_gbps is not None and gbps < expected_gbps * slow_fraction:
            rule = BELOW_EXPECTED
            message = (
                f"{name}: loopback {gbps:.1f} Gb/s, below {slow_fraction:.0%} of the"
                f" expected {expected_gbps:g} Gb/s"
            )
        elif median is not None and gbps < median * slow_fraction:
            rule = BELOW_SIBLINGS
            message = (
                f"{name}: loopback {gbps:.1f} Gb/s, {gbps / median:.0%} of the median of"
                f" the node's adapters ({median:.1f} Gb/s)"
            )
        else:
            rule, message = MEASURED, f"{name}: loopback {gbps:.1f} Gb/s"
        findings.append(rule.finding(Layer.NETWORK, component, SOURCE, message))
    return findings


class DeepNetworkCheck:
    """Loopback bandwidth of every active RDMA port, all adapters at once."""

    name: ClassVar[str] = "deep-network"
    layer: ClassVar[Layer] = Layer.NETWORK

    def run(self, ctx: CheckContext) -> list[Finding]:
        if not isinstance(ctx.sources, LiveSources):
            raise ToolMissing("the deep network check runs on the live node only")
        root = ctx.sources.infiniband_root()
        ports = [p for p in read_infiniband_sysfs(root) if p.link_up] if root.is_dir() else []
        if not ports:
            if ctx.expectations.nics:
                raise CheckFailed(f"no active RDMA port while {ctx.expectations.nics} expected")
            raise NotApplicable("no active RDMA port on this node")
        seconds = max(1, min(5, int(ctx.config.deep.budget_s / 10)))
        plans = [plan_loopback(p, BASE_PORT + i, seconds) for i, p in enumerate(ports)]
        tools = {plan.tool: ctx.sources.tool(plan.tool) for plan in plans}  # ToolMissing
        measured: dict[str, float] = {}
        failures: dict[str, CheckError] = {}

        def measure(plan: LoopbackPlan) -> None:
            try:
                measured[plan.port.name] = run_loopback(plan, tools[plan.tool], ctx.timeout_s * 0.8)
            except CheckError as exc:
                failures[plan.port.name] = exc

        threads = [threading.Thread(target=measure, args=(plan,), daemon=True) for plan in plans]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            name, error = sorted(failures.items())[0]
            raise type(error)(f"{name}: {error}")
        return judge_loopback(measured, ctx.expectations.link_gbps, ctx.config.deep.slow_fraction)
