"""The agent's deep-check schedule: idle GPUs only (and idle long enough), once-only give-up,
verify on request, hung suites failing the GPU layer closed, and the rest of the agent never
waiting for it."""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import ClassVar

import msgspec
import pynvml
import pytest

from gpuguard.agent.daemon import Agent
from gpuguard.agent.deep import (
    Activity,
    DeepRun,
    DeepSchedule,
    Idleness,
    read_idleness,
)
from gpuguard.agent.metrics import AgentMetrics
from gpuguard.agent.publisher import deep_entries
from gpuguard.checks.base import CheckContext
from gpuguard.config import Config
from gpuguard.errors import ToolMissing
from gpuguard.kernel_log.followers import FileFollower
from gpuguard.model import NODE, Action, Finding, Layer, Outcome, Severity, Status
from gpuguard.sources import BundleSources
from tests.conftest import EXAMPLES
from tests.support.clock import FakeClock
from tests.support.cluster import wait_for
from tests.support.metrics import sample

IDLE = Idleness(Activity.IDLE)
BUSY = Idleness(Activity.BUSY, "GPU 0 runs 1 compute process(es)")


# --- reading idleness through NVML ---------------------------------------------------------
class ActivityNvml:
    """pynvml's activity calls over a list of (processes, utilization %) per GPU."""

    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[tuple[int, int]], broken: bool = False) -> None:
        self.gpus = gpus
        self.broken = broken

    def nvmlInit(self) -> None:
        if self.broken:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[object]:
        return [SimpleNamespace(pid=100 + n) for n in range(self.gpus[handle][0])]

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=self.gpus[handle][1], memory=0)


def test_idle_needs_no_process_and_low_utilization_on_every_gpu():
    assert read_idleness(ActivityNvml([(0, 0), (0, 5)]), 5.0).activity is Activity.IDLE
    busy = read_idleness(ActivityNvml([(0, 0), (2, 0)]), 5.0)
    assert busy == Idleness(Activity.BUSY, "GPU 1 runs 2 compute process(es)")
    hot = read_idleness(ActivityNvml([(0, 6)]), 5.0)
    assert hot.activity is Activity.BUSY and "6% busy" in hot.why


def test_unreadable_activity_is_not_idle_and_says_why():
    missing = read_idleness(None, 5.0)
    assert missing.activity is Activity.UNKNOWN and "pynvml is not installed" in missing.why
    broken = read_idleness(ActivityNvml([(0, 0)], broken=True), 5.0)
    assert broken.activity is Activity.UNKNOWN and "nvmlInit failed" in broken.why


# --- the schedule ----------------------------------------------------------------------------
class FakeDeepCheck:
    """Stands in for the PyTorch suite: counts runs, then does what ``behave`` says."""

    name: ClassVar[str] = "deep-gpu"
    layer: ClassVar[Layer] = Layer.GPU

    def __init__(self, behave: Callable[[], list[Finding]] = list) -> None:
        self.behave = behave
        self.runs = 0

    def run(self, ctx: CheckContext) -> list[Finding]:
        self.runs += 1
        return self.behave()


def fast_config(**deep: object) -> Config:
    return Config(check_interval_s=0.05, deep={"interval_s": 0.05, "min_idle_s": 0, **deep})


@pytest.fixture
def schedule() -> Iterator[Callable[..., tuple[DeepSchedule, list[DeepRun], AgentMetrics]]]:
    stops: list[threading.Event] = []

    def start(check, config, idleness=lambda: IDLE):
        runs: list[DeepRun] = []
        metrics = AgentMetrics()
        sources = BundleSources(EXAMPLES / "healthy-h100")
        deep = DeepSchedule(
            check, config, sources, idleness=idleness, on_run=runs.append, metrics=metrics
        )
        stop = threading.Event()
        stops.append(stop)
        threading.Thread(target=deep.run, args=(stop,), daemon=True).start()
        return deep, runs, metrics

    yield start
    for stop in stops:
        stop.set()


def test_runs_every_interval_while_idle(schedule):
    check = FakeDeepCheck()
    _, runs, metrics = schedule(check, fast_config())
    wait_for(lambda: len(runs) >= 3, 5, "three scheduled runs")
    assert all(r.trigger == "schedule" and r.passed and r.requested_at is None for r in runs)
    runs_total = "gpuguard_deep_check_runs_total"
    assert sample(metrics.registry, runs_total, trigger="schedule", verdict="passed") >= 3
    last_run = "gpuguard_deep_check_last_run_timestamp_seconds"
    assert sample(metrics.registry, last_run, trigger="schedule") == pytest.approx(
        time.time(), abs=5
    )


@pytest.mark.parametrize("idleness", [BUSY, Idleness(Activity.UNKNOWN, "NVML failed")])
def test_busy_or_unknown_gpus_put_the_run_off_and_say_why_once(schedule, caplog, idleness):
    caplog.set_level(logging.INFO, "gpuguard.agent")
    check = FakeDeepCheck()
    _, runs, metrics = schedule(check, fast_config(), idleness=lambda: idleness)
    reason = str(idleness.activity)

    def skips() -> float:
        return sample(metrics.registry, "gpuguard_deep_check_skipped_total", reason=reason)

    wait_for(lambda: skips() >= 3, 5, "three skips")
    assert check.runs == 0 and runs == []
    lines = [r.message for r in caplog.records if "waits" in r.message]
    assert lines == [f"scheduled deep check waits: {idleness.why}"]


def test_without_pytorch_the_schedule_stops_after_one_try(schedule, caplog):
    caplog.set_level(logging.INFO, "gpuguard.agent")

    def no_torch() -> list[Finding]:
        raise ToolMissing("PyTorch is not installed")

    check = FakeDeepCheck(no_torch)
    node = Node()
    deep, stamped = stepped(fast_config(), node, check)
    advance(deep, node, 0.05)  # the first run, which ends the schedule
    node.step(0.4)  # eight intervals later
    assert deep.step() is None  # nothing scheduled: it waits to be woken
    runs = [run for _, run in stamped]
    assert check.runs == 1
    assert runs[0].verdict == "tool_missing" and runs[0].codes == ["TOOL_MISSING"]
    assert not runs[0].passed
    stopped = [r for r in caplog.records if "stopped" in r.message]
    assert len(stopped) == 1 and "PyTorch is not installed" in stopped[0].message

    # A verify is still answered, and fails: no PyTorch never passes.
    deep.request_verify("2025-01-01T00:00:00.5Z")
    deep.step()
    answer = next(run for _, run in stamped if run.trigger == "verify")
    assert answer.requested_at == "2025-01-01T00:00:00.5Z" and not answer.passed


def test_verify_runs_at_once_on_busy_gpus_and_answers_each_stamp_once():
    check, node, metrics = FakeDeepCheck(), Node(), AgentMetrics()
    node.busy = [(0, float("inf"))]
    deep, stamped = stepped(Config(), node, check, metrics)  # no schedule
    deep.request_verify("2025-01-01T00:00:01Z")
    deep.step()
    ((_, answer),) = stamped
    assert (answer.trigger, answer.requested_at, answer.passed) == (
        "verify",
        "2025-01-01T00:00:01Z",
        True,
    )
    deep.request_verify("2025-01-01T00:00:01Z")  # seen again at the next heartbeat
    deep.step()
    assert check.runs == 1
    deep.request_verify("2025-01-01T00:00:09Z")  # a new request
    deep.step()
    assert check.runs == 2
    runs_total = "gpuguard_deep_check_runs_total"
    assert sample(metrics.registry, runs_total, trigger="verify", verdict="passed") == 2


def test_failing_suite_fails_the_verify_with_its_codes(schedule):
    bad = Finding(
        Layer.GPU, "DEEP_MATMUL_SLOW", Severity.WARNING, Action.RESET_GPU, NODE, "deep-gpu", "slow"
    )
    info = Finding(Layer.GPU, "DEEP_SUITE_MEASURED", Severity.INFO, Action.NONE, NODE, "d", "ok")
    deep, runs, _ = schedule(FakeDeepCheck(lambda: [bad, info]), Config())
    deep.request_verify("2025-01-01T00:00:01Z")
    (answer,) = wait_for(lambda: runs, 5, "the verify")
    assert (answer.passed, answer.verdict, answer.codes) == (False, "failed", ["DEEP_MATMUL_SLOW"])
    deep, verify = deep_entries(answer, answer)
    assert deep is not None and msgspec.to_builtins(verify) == {
        "requestedAt": "2025-01-01T00:00:01Z",
        "at": deep.at,
        "passed": False,
        "codes": ["DEEP_MATMUL_SLOW"],
    }


# --- idle long enough, on a controlled clock -------------------------------------------------
class Node(FakeClock):
    """A clock the test moves and the GPUs' activity at each moment."""

    def __init__(self) -> None:
        super().__init__(0.0)
        self.busy: list[tuple[float, float]] = []  # [start, end) spans with a job on the GPUs

    def idleness(self) -> Idleness:
        return BUSY if any(a <= self.monotonic() < b for a, b in self.busy) else IDLE


def stepped(
    config: Config, node: Node, check: FakeDeepCheck, metrics: AgentMetrics | None = None
) -> tuple[DeepSchedule, list[tuple[float, DeepRun]]]:
    runs: list[tuple[float, DeepRun]] = []
    deep = DeepSchedule(
        check,
        config,
        BundleSources(EXAMPLES / "healthy-h100"),
        idleness=node.idleness,
        on_run=lambda run: runs.append((node.monotonic(), run)),
        metrics=metrics or AgentMetrics(),
        clock=node,
    )
    return deep, runs


def advance(deep: DeepSchedule, node: Node, until: float) -> list[float]:
    """Step the schedule as its thread would, up to ``until``; returns when it sampled."""
    steps = []
    while node.monotonic() <= until:
        steps.append(node.monotonic())
        wait = deep.step()
        if wait is None:
            break
        node.step(wait)
    return steps


HOURLY = Config(check_interval_s=30, deep={"interval_s": 3600, "min_idle_s": 900})


def test_an_idle_node_runs_on_time_having_watched_the_last_min_idle_seconds():
    node, check = Node(), FakeDeepCheck()
    deep, runs = stepped(HOURLY, node, check)
    steps = advance(deep, node, 7200)
    assert [t for t, _ in runs] == [3600, 7200]
    assert all(run.trigger == "schedule" for _, run in runs)
    # Nothing is sampled until min_idle before the run is due.
    assert [t for t in steps if t < 3600] == [0, *range(2700, 3600, 30)]


def test_a_run_waits_for_min_idle_of_unbroken_idleness_and_a_busy_sample_restarts_it():
    node, check = Node(), FakeDeepCheck()
    node.busy = [(0, 3500), (3980, 4040)]  # a job ends, and another comes for a minute
    deep, runs = stepped(HOURLY, node, check)
    advance(deep, node, 4500)
    assert runs == []  # idle from the sample at 3,510 s, busy at 3,990 s: not 900 s yet
    advance(deep, node, 6000)
    ((started, run),) = runs
    # The first idle sample after the short job is at 4,050 s; then 900 s of idle samples.
    assert started == 4050 + 900 and run.trigger == "schedule"
    assert check.runs == 1


def test_a_job_that_comes_back_within_min_idle_is_not_met_by_a_run():
    node, check = Node(), FakeDeepCheck()
    node.busy = [(0, 3700), (3700 + 600, 20_000)]  # its restart comes back after 10 min
    deep, runs = stepped(HOURLY, node, check)
    advance(deep, node, 19_000)
    assert runs == []
    advance(deep, node, 22_000)
    assert [t for t, _ in runs] == [20_010 + 900]  # sampled every 30 s from 2,700 s


def test_without_min_idle_a_single_idle_sample_is_enough():
    node, check = Node(), FakeDeepCheck()
    node.busy = [(0, 3700)]
    config = Config(check_interval_s=30, deep={"interval_s": 3600, "min_idle_s": 0})
    deep, runs = stepped(config, node, check)
    advance(deep, node, 4000)
    assert [t for t, _ in runs] == [3720]


def test_a_verify_does_not_wait_for_min_idle():
    node, check = Node(), FakeDeepCheck()
    node.busy = [(0, 10_000)]
    deep, runs = stepped(HOURLY, node, check)
    advance(deep, node, 100)
    deep.request_verify("2025-01-01T00:00:01Z")
    deep.step()
    ((started, run),) = runs
    assert started == node.monotonic() and run.trigger == "verify"


def test_min_idle_is_validated():
    assert Config().deep.min_idle_s == 900
    with pytest.raises(ValueError, match="min_idle_s"):
        Config(deep={"min_idle_s": -1})


# --- inside the agent ------------------------------------------------------------------------
def test_hung_suite_fails_the_gpu_layer_closed_and_the_kernel_log_keeps_flowing(tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(EXAMPLES / "healthy-h100", bundle)
    (bundle / "boot_id").write_text(f"boot-{uuid.uuid4()}\n")
    release = threading.Event()

    def hang() -> list[Finding]:
        release.wait(30)
        return []

    hung = FakeDeepCheck(hang)
    config = Config(
        check_interval_s=0.05,
        timeouts={"deep-gpu": 0.3},
        deep={"interval_s": 0.05, "min_idle_s": 0},
    )
    follower = FileFollower(bundle / "kmsg.log", 0.02)
    agent = Agent(
        config,
        BundleSources(bundle),
        [],
        follower,
        "node",
        api=None,
        deep_check=hung,
        idleness=lambda: IDLE,
    )
    stop = threading.Event()
    agent.start_observers(stop)
    try:
        assert agent.wait_first_round(5)
        # The round can end before the schedule's first run begins (a loaded machine).
        wait_for(lambda: hung.runs == 1, 5, "the deep check to start and hang")
        with (bundle / "kmsg.log").open("a") as log:  # while the suite hangs
            log.write(
                "NVRM: Xid (PCI:0000:91:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
            )

        def xid_seen() -> bool:
            report = agent.report()
            return report is not None and any(
                f.code == "XID_79" for h in report.layers.values() for f in h.findings
            )

        wait_for(xid_seen, 5, "the Xid while the deep check hangs")
        assert hung.runs == 1 and not release.is_set()  # seen while the one run still hangs

        def timed_out() -> bool:
            report = agent.report()
            return report is not None and any(
                r.check == "deep-gpu" and r.outcome is Outcome.TIMED_OUT for r in report.results
            )

        wait_for(timed_out, 5, "the deep check's timeout")
        report = agent.report()
        assert report is not None and report.layers[Layer.GPU].status is Status.UNHEALTHY
        assert "CHECK_TIMED_OUT" in {f.code for f in report.layers[Layer.GPU].findings}
    finally:
        release.set()
        stop.set()


def test_an_agent_that_never_runs_the_suite_does_not_load_its_numpy():
    """The deep suite's modules (and NumPy, ~15 MB resident) load when it first runs, not
    with the agent: most agents run it rarely or never."""
    import subprocess
    import sys

    probe = (
        "import sys, gpuguard.agent.main, gpuguard.agent.daemon, gpuguard.kube.client;"
        "from gpuguard.checks.load.checks import DeepGpuCheck; DeepGpuCheck();"
        "print(sorted(m for m in ('numpy', 'gpuguard.checks.load.measure') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
