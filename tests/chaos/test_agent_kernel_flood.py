"""A real ``gpuguard agent`` process under hostile kernel logs (chaos_findings rows 39-43).

The kernel log is the bundle's ``kmsg.log``, a followed file. A flood of Xid lines, an
over-long line and a deleted log must leave the agent's memory well under the chart's
limit (``resources.limits.memory: 128Mi``) and never leave the Node saying healthy when
it is not: the Xid 79 written after the flood still reaches the Node, and a log that is
gone reads as not healthy until it is back.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.kube.test_agent import GPU, KERNEL, XID79, bundle_from, condition_is
from tests.support.cluster import wait_for
from tests.support.controlplane import ControlPlane

CHART_LIMIT_MIB = 128
PEAK_LIMIT_MIB = 100  # the chart's limit with margin (baseline about 57 MiB)
XID13 = "NVRM: Xid (PCI:0000:91:00): 13, pid=4242, name=python, Graphics Exception: ESR 0x1\n"


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory (``VmHWM``: the kernel samples every page)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"/proc/{pid}/status has no VmHWM")


@pytest.fixture
def agent_process(
    control_plane: ControlPlane, node: str, tmp_path: Path
) -> Iterator[Callable[[], tuple[subprocess.Popen[bytes], Path]]]:
    """Starts ``gpuguard agent`` on a healthy bundle for ``node``; returns it and its log."""
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> tuple[subprocess.Popen[bytes], Path]:
        sources, log = bundle_from("healthy-h100", tmp_path)
        config = tmp_path / "agent.yaml"
        config.write_text("check_interval_s: 1\nmetrics_port: 0\nexpected_gpus: 1\n")
        argv = [sys.executable, "-m", "gpuguard.cli", "agent", "--node-name", node]
        argv += ["--config", str(config), "--kubeconfig", str(control_plane.admin_kubeconfig)]
        argv += ["--bundle", str(sources.root)]
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        wait_for(condition_is(control_plane, node, KERNEL, "True"), timeout_s=30)
        return procs[-1], log

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(10)
        assert proc.stderr is not None
        proc.stderr.close()


def test_an_xid79_behind_a_flood_of_xid13_lines_reaches_the_node_in_bounded_memory(
    control_plane, node, agent_process
):
    proc, log = agent_process()
    with log.open("a") as handle:
        for _ in range(20):
            handle.write(XID13 * 10_000)
            handle.flush()
        handle.write(XID79)
    wait_for(condition_is(control_plane, node, GPU, "False", "Xid79"), timeout_s=30)
    assert proc.poll() is None, "the agent died in the flood"
    assert peak_rss_mib(proc.pid) < PEAK_LIMIT_MIB < CHART_LIMIT_MIB


def test_an_overlong_line_is_cut_and_the_xid_ending_it_is_seen(control_plane, node, agent_process):
    proc, log = agent_process()
    junk = b"\x00garbage without a newline " * 40_000  # about 1 MiB
    with log.open("ab") as handle:
        for _ in range(40):
            handle.write(junk)
            handle.flush()
        handle.write(XID79.encode())
    wait_for(condition_is(control_plane, node, GPU, "False", "Xid79"), timeout_s=30)
    assert proc.poll() is None
    assert peak_rss_mib(proc.pid) < PEAK_LIMIT_MIB


def test_a_deleted_kernel_log_is_not_healthy_until_it_is_back(control_plane, node, agent_process):
    proc, log = agent_process()
    log.unlink()
    gone = wait_for(condition_is(control_plane, node, KERNEL, "False"), timeout_s=15)
    assert "kmsg.log" in gone["message"] or gone["reason"] == "CheckFailed"
    log.write_text("[    9.000000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  590.48.01\n")
    wait_for(condition_is(control_plane, node, KERNEL, "True"), timeout_s=15)
    log.unlink()
    log.mkdir()  # something that is not a file in its place
    wait_for(condition_is(control_plane, node, KERNEL, "False", "CheckFailed"), timeout_s=15)
    assert proc.poll() is None
