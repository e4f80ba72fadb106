"""Diagnostic tools are bounded, with real processes: a tool printing without end is cut at
the cap and killed, and a tool whose child escapes its process group and never exits is
watched until it does, never started again meanwhile (no pile-up of processes, threads or
file descriptors, whatever the interval)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuguard.checks.base import CheckContext
from gpuguard.checks.nvidia_smi.check import SmiCheck
from gpuguard.config import Config
from gpuguard.errors import CheckTimedOut
from gpuguard.model import Layer, Outcome, Status
from gpuguard.runner import RepeatingCheck, assess, run_check
from gpuguard.sources import MAX_OUTPUT_BYTES, LiveSources, run_tool
from tests.conftest import DATA
from tests.support.cluster import wait_for
from tests.unit.test_fail_closed import XML, make_tool

MiB = 1024 * 1024
INTERVAL_S = 0.2
TIMEOUT_S = 1.0  # ample for the fake tool to start and fork, even on a busy machine
ROUNDS_FOR_S = 3.0  # how long the schedule runs against the hung tool


def prints(total_bytes: int, finished: Path) -> str:
    """A tool that prints ``total_bytes`` in 1 MiB writes, then marks that it finished."""
    return (
        f"#!{sys.executable}\n"
        "import sys\n"
        f"left = {total_bytes}\n"
        "while left:\n"
        "    n = min(left, 1 << 20)\n"
        "    sys.stdout.buffer.write(b'x' * n)\n"
        "    left -= n\n"
        "sys.stdout.buffer.flush()\n"
        f"open({str(finished)!r}, 'w').close()\n"
    )


def escapes(escaped: Path) -> str:
    """A tool stuck for good whose child leaves the process group (as a tool stuck in the
    driver survives a kill), holding stdout; the child notes its pid in ``escaped``."""
    return (
        f"#!{sys.executable}\n"
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    open(os.path.join({str(escaped)!r}, str(os.getpid())), 'w').close()\n"
        "time.sleep(100000)\n"
    )


# The process's own peak (ru_maxrss would carry the parent's over exec).
PEAK_RSS_KIB = """
def peak_rss_kib():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            return int(line.split()[1])
"""


def smi_context(tool: Path, timeout_s: float) -> CheckContext:
    config = Config(tools={"nvidia-smi": str(tool)})
    return CheckContext(LiveSources(config), config, timeout_s)


def test_output_past_the_cap_is_cut_the_tool_killed_and_the_check_fails_closed(tmp_path):
    finished = tmp_path / "finished"
    tool = make_tool(tmp_path, "nvidia-smi", prints(300 * MiB, finished))
    result = run_check(SmiCheck(), smi_context(tool, 20))
    assert result.outcome is Outcome.FAILED, result.detail
    assert "output too large" in result.detail
    (finding,) = result.findings
    assert finding.inconclusive
    assert assess([result], fail_closed=True).layers[Layer.GPU].status is Status.UNHEALTHY
    assert not finished.exists()  # stopped, not read to the end


def test_output_of_exactly_the_cap_is_kept_whole(tmp_path):
    tool = make_tool(tmp_path, "tool", prints(MAX_OUTPUT_BYTES, tmp_path / "finished"))
    output = run_tool([str(tool)], 20)
    assert (len(output.text), output.exit_code) == (MAX_OUTPUT_BYTES, 0)


def test_real_outputs_fit_far_under_the_cap():
    # The captures are of one GPU or a whole node; a 16-GPU node's worst is 16 of the biggest.
    biggest = max(path.stat().st_size for path in DATA.iterdir() if path.is_file())
    assert 16 * biggest < MAX_OUTPUT_BYTES


def test_memory_stays_bounded_under_a_300_mb_output(tmp_path):
    tool = make_tool(tmp_path, "nvidia-smi", prints(300 * MiB, tmp_path / "finished"))
    measure = (
        "import sys\n"
        "from gpuguard.errors import CheckError\n"
        "from gpuguard.sources import run_tool\n"
        f"{PEAK_RSS_KIB}\n"
        "before = peak_rss_kib()\n"
        "try:\n"
        f"    run_tool([{str(tool)!r}], 30)\n"
        "except CheckError as exc:\n"
        "    print(exc, file=sys.stderr)\n"
        "print(before, peak_rss_kib())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", measure], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    before_kib, peak_kib = map(int, proc.stdout.split())
    assert "output too large" in proc.stderr
    assert (peak_kib - before_kib) * 1024 < 3 * MAX_OUTPUT_BYTES


@pytest.fixture
def escaped(tmp_path) -> Iterator[Path]:
    """Where escaped children note their pids; every one is killed at the end."""
    directory = tmp_path / "escaped"
    directory.mkdir()
    yield directory
    for pid in _pids(directory):
        _kill(pid)


def test_a_hung_tool_is_watched_not_started_again_and_nothing_piles_up(tmp_path, escaped):
    tool = make_tool(tmp_path, "nvidia-smi", escapes(escaped))
    runner = RepeatingCheck(SmiCheck(), smi_context(tool, TIMEOUT_S))
    threads_before, fds_before = threading.active_count(), _open_fds()
    results, threads, fds, copies = [], [], [], []
    schedule = threading.Event()  # never set: waiting on it is the check interval
    end = time.monotonic() + ROUNDS_FOR_S
    while time.monotonic() < end:
        results.append(runner.run_once())
        threads.append(threading.active_count())
        fds.append(_open_fds())
        copies.append(sum(_alive(pid) for pid in _pids(escaped)))
        schedule.wait(INTERVAL_S)

    assert max(copies) == 1, copies
    assert len(results) >= 5
    assert max(threads) <= threads_before + 2, threads
    assert max(fds) <= fds_before + 4, fds
    first, *later = results
    assert first.outcome is Outcome.TIMED_OUT, first.detail
    for result in later:
        assert result.outcome is Outcome.TIMED_OUT, result.detail
        assert "has not exited yet" in result.detail
        assert str(tool) in result.detail
        assert "since" in result.detail
        assert assess([result], fail_closed=True).layers[Layer.GPU].status is Status.UNHEALTHY
    # Another caller of the same tool is refused too, at once.
    with pytest.raises(CheckTimedOut, match="has not exited yet"):
        run_tool([str(tool), "-q"], 5)

    # Once the stuck process really exits, the check runs normally again.
    for pid in _pids(escaped):
        _kill(pid)
    make_tool(tmp_path, "nvidia-smi.new", f"#!/bin/sh\ncat '{XML}'\n").replace(tool)
    wait_for(lambda: runner.run_once().outcome is Outcome.OK, 5, "a normal run after the exit")
    assert threading.active_count() <= threads_before + 1


def _pids(directory: Path) -> list[int]:
    return [int(path.name) for path in directory.iterdir()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))
