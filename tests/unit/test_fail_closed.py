"""Fail closed, with real processes: a diagnostic that hangs, crashes or prints garbage
gives an explicit verdict on time, and never lets its layer read as Healthy."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuguard.checks.base import CheckContext
from gpuguard.checks.dcgm.check import DcgmCheck
from gpuguard.checks.nvidia_smi.check import SmiCheck
from gpuguard.cli import main
from gpuguard.config import Config
from gpuguard.model import Action, Layer, Outcome, Severity, Status
from gpuguard.runner import GRACE_S, RepeatingCheck, assess, run_check
from gpuguard.sources import LiveSources
from tests.conftest import DATA
from tests.support.cluster import wait_for

TIMEOUT_S = 1.0
# Time allowed past the timeout for killing the tool and reporting.
MARGIN_S = GRACE_S + 1.0

XML = DATA / "nvidia-smi-q-x_a10g_515.105.01_v11.xml"

FAKE_TOOLS = {
    "hangs": "#!/bin/sh\nexec sleep 1000\n",
    # Ignores SIGTERM and leaves a grandchild holding stdout open.
    "hangs_stubbornly": "#!/bin/sh\ntrap '' TERM\nsleep 1000 &\nwait\n",
    "exits_1": '#!/bin/sh\necho "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\nexit 1\n',
    "segfaults": "#!/bin/sh\nkill -SEGV $$\n",
    "half_document": f"#!/bin/sh\nhead -c 2500 '{XML}'\n",
    "garbage": "#!/bin/sh\necho 'lorem ipsum <gpu> not xml'\n",
}


def make_tool(directory: Path, name: str, body: str, executable: bool = True) -> Path:
    path = directory / name
    path.write_text(body)
    mode = stat.S_IRUSR | stat.S_IWUSR | (stat.S_IXUSR if executable else 0)
    path.chmod(mode)
    return path


def smi_context(tool: Path) -> CheckContext:
    config = Config(tools={"nvidia-smi": str(tool)})
    return CheckContext(LiveSources(config), config, TIMEOUT_S)


@pytest.mark.parametrize(
    ("behaviour", "outcome", "words"),
    [
        ("hangs", Outcome.TIMED_OUT, "no result after 1s"),
        ("hangs_stubbornly", Outcome.TIMED_OUT, "no result after 1s"),
        ("exits_1", Outcome.FAILED, "exit"),
        ("segfaults", Outcome.FAILED, "SIGSEGV"),
        ("half_document", Outcome.UNPARSEABLE, ""),
        ("garbage", Outcome.UNPARSEABLE, ""),
    ],
)
def test_broken_nvidia_smi_gives_a_verdict_on_time(tmp_path, behaviour, outcome, words):
    tool = make_tool(tmp_path, "nvidia-smi", FAKE_TOOLS[behaviour])
    started = time.monotonic()
    result = run_check(SmiCheck(), smi_context(tool))
    elapsed = time.monotonic() - started
    assert elapsed < TIMEOUT_S + MARGIN_S
    assert result.outcome is outcome, result.detail
    assert words in result.detail
    (finding,) = result.findings
    assert finding.inconclusive
    report = assess([result], fail_closed=True)
    assert report.layers[Layer.GPU].status is Status.UNHEALTHY
    assert assess([result], fail_closed=False).layers[Layer.GPU].status is Status.UNKNOWN


def test_hung_tool_is_killed_not_left_running(tmp_path):
    marker = tmp_path / "pid"
    tool = make_tool(tmp_path, "nvidia-smi", f"#!/bin/sh\necho $$ > '{marker}'\nexec sleep 1000\n")
    run_check(SmiCheck(), smi_context(tool))
    pid = int(marker.read_text())
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid)


def test_tool_that_is_not_executable_is_a_failed_check(tmp_path):
    tool = make_tool(tmp_path, "nvidia-smi", FAKE_TOOLS["garbage"], executable=False)
    result = run_check(SmiCheck(), smi_context(tool))
    assert result.outcome is Outcome.FAILED
    assert "not executable" in result.detail


def test_missing_tool_is_tool_missing_not_healthy(tmp_path):
    config = Config(tools={"nvidia-smi": str(tmp_path / "absent")})
    result = run_check(SmiCheck(), CheckContext(LiveSources(config), config, TIMEOUT_S))
    assert result.outcome is Outcome.TOOL_MISSING
    report = assess([result], fail_closed=True)
    assert report.layers[Layer.GPU].status is Status.UNHEALTHY  # no GPU source answered


def test_hung_dcgmi_is_caught_too(tmp_path):
    tool = make_tool(tmp_path, "dcgmi", FAKE_TOOLS["hangs"])
    config = Config(tools={"dcgmi": str(tool)})
    started = time.monotonic()
    result = run_check(DcgmCheck(), CheckContext(LiveSources(config), config, TIMEOUT_S))
    assert time.monotonic() - started < TIMEOUT_S + MARGIN_S  # watches and query share it
    assert result.outcome is Outcome.TIMED_OUT


class StuckInProcess:
    """A check blocked where no signal reaches it, as an NVML call stuck in the driver."""

    name = "stuck"
    layer = Layer.GPU

    def __init__(self) -> None:
        self.release = threading.Event()
        self.runs = 0

    def run(self, ctx: CheckContext) -> list:
        self.runs += 1
        self.release.wait()
        return []


def test_runner_returns_on_time_even_when_a_check_cannot_be_interrupted():
    check = StuckInProcess()
    config = Config()
    started = time.monotonic()
    result = run_check(check, CheckContext(LiveSources(config), config, 0.3))
    check.release.set()
    assert time.monotonic() - started < 0.3 + MARGIN_S
    assert result.outcome is Outcome.TIMED_OUT
    assert "abandoned" in result.detail


def test_a_check_stuck_in_process_is_reported_not_started_again():
    check = StuckInProcess()
    config = Config()
    runner = RepeatingCheck(check, CheckContext(LiveSources(config), config, 0.2))
    first, second = runner.run_once(), runner.run_once()
    assert "abandoned" in first.detail
    assert second.outcome is Outcome.TIMED_OUT
    assert "has not exited yet" in second.detail and "since" in second.detail
    assert assess([second], fail_closed=True).layers[Layer.GPU].status is Status.UNHEALTHY
    assert check.runs == 1
    check.release.set()
    wait_for(lambda: runner.run_once().outcome is Outcome.OK, 5, "a normal run once released")


class Records:
    """A check that notes the thread each run is on."""

    name = "records"
    layer = Layer.GPU

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def run(self, ctx: CheckContext) -> list:
        self.threads.append(threading.current_thread())
        return []


def test_a_repeating_check_runs_on_one_long_lived_thread():
    # A thread started per run cost more CPU than most checks' runs (the agent's idle CPU).
    check = Records()
    config = Config()
    runner = RepeatingCheck(check, CheckContext(LiveSources(config), config, 1))
    results = [runner.run_once() for _ in range(3)]
    assert [r.outcome for r in results] == [Outcome.OK] * 3
    assert len(check.threads) == 3 and len(set(check.threads)) == 1
    assert check.threads[0] is not threading.current_thread()
    runner.close()
    check.threads[0].join(5)
    assert not check.threads[0].is_alive(), "the worker did not end once closed"


class Crashes:
    name = "crashes"
    layer = Layer.NETWORK

    def run(self, ctx: CheckContext) -> list:
        return {}["missing"]  # a bug in a check


def test_a_bug_in_a_check_is_a_failed_check_not_a_crash():
    config = Config()
    result = run_check(Crashes(), CheckContext(LiveSources(config), config, 1))
    assert result.outcome is Outcome.FAILED
    assert "internal error: KeyError" in result.detail


def test_cli_with_hanging_tools_exits_unhealthy_on_time(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("nvidia-smi", "dcgmi"):
        make_tool(tools, name, FAKE_TOOLS["hangs"])
    log = tmp_path / "kern.log"
    log.write_text("[ 1.0] Linux version 6.1.0\n")
    config = tmp_path / "gpuguard.yaml"
    config.write_text(
        f"kernel_log: {log}\ninfiniband_sysfs: {tmp_path / 'no-ib'}\ndefault_timeout_s: 1\n"
    )
    env = {**os.environ, "PATH": f"{tools}:/usr/bin:/bin"}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "gpuguard.cli", "check", "--json", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr
    assert '"CHECK_TIMED_OUT"' in proc.stdout
    # nvidia-smi runs as NVML's fallback, after the first wave: two timeouts plus start-up.
    assert elapsed < 2 * (1 + MARGIN_S) + 5


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purpose.
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_every_missing_gpu_source_is_reported_not_merged(tmp_path, capsys):
    (tmp_path / "kmsg.log").write_text("[ 1.0] Linux version 6.1.0\n")
    assert main(["check", "--json", "--bundle", str(tmp_path)]) == 2
    gpu = json.loads(capsys.readouterr().out)["layers"]["gpu"]
    assert gpu["status"] == "Unhealthy"
    # The in-job check answered (no verdict directory in the bundle): it adds evidence, it
    # never vouches for the layer.
    assert gpu["answered_by"] == []
    sources = sorted(f["source"] for f in gpu["findings"] if f["code"] == "TOOL_MISSING")
    assert sources == ["dcgm", "dcgm-exporter", "load-clocks", "nvidia-smi", "nvml"]


@pytest.mark.parametrize(
    ("message", "gpu"),
    [
        # nvidia-smi's own words when it cannot open a GPU the driver lost (after Xid 79),
        # as users paste them: the whole output, exit status non-zero.
        ("Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error", "3b:00.0"),
        ("Unable to determine the device handle for GPU1: 0000:34:00.0: GPU is lost", "34:00.0"),
    ],
)
def test_nvidia_smi_that_cannot_open_a_lost_gpu_names_it_lost(tmp_path, message, gpu):
    tool = make_tool(tmp_path, "nvidia-smi", f"#!/bin/sh\necho '{message}'\nexit 255\n")
    result = run_check(SmiCheck(), smi_context(tool))
    assert result.outcome is Outcome.OK, result.detail
    (finding,) = result.findings
    assert (finding.code, finding.severity) == ("GPU_LOST", Severity.CRITICAL)
    assert finding.action is Action.REBOOT  # a reset needs the handle nvidia-smi lacks
    assert finding.component.id.endswith(gpu)
