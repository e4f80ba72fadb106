"""The deep GPU check in the agent: rarely, while the GPUs are idle, and on the controller's
request before a repaired node returns to service.

It has a thread of its own: the suite takes up to a minute, and the kernel-log follower
and the regular checks must not wait for it. It runs through the same fail-closed runner
as every other check, so a hung suite is a ``CHECK_TIMED_OUT`` verdict on the GPU layer.
A scheduled run never interrupts work: it needs every GPU idle as NVML reports it, and
when NVML cannot tell, it does not run. Idle for a moment is not enough: a job that failed
comes back to its nodes within minutes, and a run started the moment they emptied would be
in its way (and a false positive would drain a node it needs). So a scheduled run waits
until every sample for ``deep.min_idle_s`` said idle; a busy or unreadable sample starts
the wait again. A verify runs at once (the node is drained); its answer echoes the
request's stamp, so the controller can tell it from an older answer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sized
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from gpuguard.agent.metrics import AgentMetrics
from gpuguard.checks.base import Check, CheckContext
from gpuguard.checks.load.deep_run import DeepRun
from gpuguard.checks.nvml import nvml_session
from gpuguard.clock import SYSTEM_CLOCK, Clock
from gpuguard.config import Config
from gpuguard.errors import CheckError
from gpuguard.model import Outcome
from gpuguard.runner import RepeatingCheck
from gpuguard.sources import Sources

log = logging.getLogger("gpuguard.agent")

# The check cannot run on this node at all: stop scheduling it (a verify still asks).
NEVER_RUNS = (Outcome.TOOL_MISSING, Outcome.NOT_APPLICABLE)


class Activity(StrEnum):
    IDLE = "idle"
    BUSY = "busy"
    UNKNOWN = "unknown"  # NVML absent or failing: not known to be idle, so not idle


@dataclass(frozen=True)
class Idleness:
    activity: Activity
    why: str = ""


class _Utilization(Protocol):
    @property
    def gpu(self) -> int: ...  # percent of the last sample period a kernel ran


class NvmlActivity(Protocol):
    """The part of pynvml that tells whether the GPUs are busy."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int: ...

    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> object: ...

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object, /) -> Sized: ...

    def nvmlDeviceGetUtilizationRates(self, handle: object, /) -> _Utilization: ...


def read_idleness(nvml: NvmlActivity | None, busy_percent: float) -> Idleness:
    """Idle means no compute process on any GPU and each at most ``busy_percent`` busy."""
    if nvml is None:
        return Idleness(Activity.UNKNOWN, "pynvml is not installed: GPU activity unknown")
    try:
        with nvml_session(nvml):
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
                if processes:
                    why = f"GPU {index} runs {len(processes)} compute process(es)"
                    return Idleness(Activity.BUSY, why)
                used = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                if used > busy_percent:
                    why = f"GPU {index} is {used}% busy (idle: at most {busy_percent:g}%)"
                    return Idleness(Activity.BUSY, why)
    except (CheckError, nvml.NVMLError) as exc:
        return Idleness(Activity.UNKNOWN, f"cannot read GPU activity through NVML: {exc}")
    return Idleness(Activity.IDLE)


def nvml_idleness(busy_percent: float) -> Callable[[], Idleness]:
    try:
        import pynvml
    except ImportError:
        pynvml = None
    return lambda: read_idleness(pynvml, busy_percent)


class DeepSchedule:
    """Runs the deep check every ``deep.interval_s`` once idle long enough, and each verify.

    Idleness is sampled every ``check_interval_s`` from ``deep.min_idle_s`` before a run is
    due, so a node that was idle all along runs on time.
    """

    def __init__(
        self,
        check: Check,
        config: Config,
        sources: Sources,
        *,
        idleness: Callable[[], Idleness],
        on_run: Callable[[DeepRun], None],
        metrics: AgentMetrics,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._runner = RepeatingCheck(
            check, CheckContext(sources, config, config.timeout_for(check.name))
        )
        self._interval = config.deep.interval_s
        self._min_idle = config.deep.min_idle_s
        self._retry_s = config.check_interval_s  # how often to sample idleness
        self._idleness = idleness
        self._on_run = on_run
        self._metrics = metrics
        self._clock = clock  # monotonic: the schedule; now(): when a run finished
        self._lock = threading.Lock()
        self._pending: str | None = None
        self._taken: str | None = None  # the stamp being answered or last answered
        self._due = clock.monotonic() + self._interval if self._interval is not None else None
        self._idle_since: float | None = None  # first of the unbroken idle samples
        self._last_skip = ""
        self.wake = threading.Event()

    def request_verify(self, stamp: str) -> None:
        """Run the suite as soon as possible for the request stamped ``stamp`` (once)."""
        with self._lock:
            if stamp in (self._pending, self._taken):
                return
            self._pending = stamp
        self.wake.set()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.wake.clear()
            self.wake.wait(self.step())

    def step(self) -> float | None:
        """Answer a pending verify, or take the schedule one sample further; returns the
        seconds until the next step is needed (None: only when woken)."""
        with self._lock:
            stamp, self._pending = self._pending, None
            self._taken = stamp or self._taken
        if stamp is not None:
            self._run("verify", stamp)
        if self._due is None:
            return None
        now = self._clock.monotonic()
        watch_from = self._due - self._min_idle
        if now < watch_from:
            return watch_from - now
        next_sample = self._sample(now)
        return 0.0 if next_sample is None else max(0.0, next_sample - self._clock.monotonic())

    def _sample(self, now: float) -> float | None:
        """One idleness sample on the way to a due run; returns when to sample next, or
        None after a run (the next step sees where the schedule stands)."""
        assert self._due is not None and self._interval is not None
        idle = self._idleness()
        if idle.activity is not Activity.IDLE:
            self._idle_since = None
            if now >= self._due:
                self._metrics.deep_skipped.labels(str(idle.activity)).inc()
                self._waits(idle.why)
            return now + self._retry_s
        if self._idle_since is None:
            self._idle_since = now
        ready_at = max(self._due, self._idle_since + self._min_idle)
        if now < ready_at:
            if now >= self._due:
                self._waits(f"the GPUs must be idle for {self._min_idle:g}s first")
            return min(ready_at, now + self._retry_s)
        self._last_skip = ""
        run = self._run("schedule", None)
        if run.result.outcome in NEVER_RUNS:
            log.warning(
                "scheduled deep check stopped (it cannot run on this node): %s",
                run.result.detail,
            )
            self._due = None
        else:
            self._due = self._clock.monotonic() + self._interval
        return None

    def _waits(self, why: str) -> None:
        """A log line when the reason changes, not one per sample."""
        if why != self._last_skip:
            log.info("scheduled deep check waits: %s", why)
            self._last_skip = why

    def _run(self, trigger: str, stamp: str | None) -> DeepRun:
        log.info("deep check starting (%s)", trigger if stamp is None else f"verify {stamp}")
        self._idle_since = None  # the suite loads the GPUs: idleness is measured anew
        result = self._runner.run_once()
        run = DeepRun(trigger, result, self._clock.now(), stamp)
        self._metrics.observe_check(result)
        self._metrics.deep_runs.labels(trigger, run.verdict).inc()
        self._metrics.deep_last_run.labels(trigger).set(run.finished_at)
        log.info(
            "deep check (%s) %s in %.0fs%s",
            trigger,
            run.verdict,
            result.duration_s,
            f": {', '.join(run.codes)}" if run.codes else "",
        )
        self._on_run(run)
        return run
