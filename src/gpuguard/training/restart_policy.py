"""Whether `gpuguard run` restarts a job that ended, and after how long. Pure: no processes.

Two budgets, because two kinds of failure deserve different patience:

- **infrastructure**: the job was interrupted by something outside it: it exited 75
  (preempted) or 69 (GPU lost) or another ``--infra-exit-code``, was killed by SIGKILL
  (a drain's deadline, the OOM killer) or SIGTERM, the watchdog ended it for making no
  progress, or it failed with a transport or device error as its last words on stderr
  (gpuguard.remediation.signatures). Retried within a generous budget (default 50);
- **application**: anything else (a Python exception, its own non-zero exit, a crash
  signal such as SIGSEGV). Retried within a small budget (default 3): the same code
  would likely fail the same way.

Independently of both, a **crash loop** stops the job: ``crash_loop_failures`` failures in
a row, within ``crash_loop_window_s``, none of which got past the best step reached
before. Progress is the heartbeat; a job that never beats counts a run as progress when it
lasted longer than the window. The delay before a restart doubles with each failure
without progress (from ``backoff_s`` to ``backoff_max_s``) and starts over after progress.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass

from gpuguard.remediation.signatures import Signature
from gpuguard.training.contract import EXIT_GPU_LOST, EXIT_INFRASTRUCTURE, EXIT_PREEMPTED

_INFRASTRUCTURE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM})
_KNOWN_CODES = {
    EXIT_PREEMPTED: "preempted",
    EXIT_GPU_LOST: "GPU lost",
    EXIT_INFRASTRUCTURE: "infrastructure error",
}


class Cause(enum.Enum):
    SUCCESS = "success"
    INFRASTRUCTURE = "infrastructure"
    APPLICATION = "application"


@dataclass(frozen=True)
class RunResult:
    """How one run of the job ended.

    ``returncode`` follows `subprocess`: negative for a signal. ``reported_code`` is what a
    worker wrote with `exit_preempted`/`exit_gpu_lost` (through torchrun, whose own exit
    status is then 1). ``step`` is the last heartbeat of the run. ``last_words`` is what
    its stderr's tail was classified as, if anything.
    """

    returncode: int
    started_at: float
    ended_at: float
    stalled: bool = False
    reported_code: int | None = None
    step: int | None = None
    last_words: Signature | None = None

    @property
    def infrastructure_error(self) -> bool:
        """Failed with an exit status of its own, its last words the infrastructure's."""
        words = self.last_words
        return self.returncode > 0 and words is not None and words.infrastructure


@dataclass(frozen=True)
class RestartPolicy:
    infra_retries: int = 50
    app_retries: int = 3
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0
    crash_loop_failures: int = 5
    crash_loop_window_s: float = 600.0
    infra_exit_codes: frozenset[int] = frozenset(_KNOWN_CODES)


@dataclass(frozen=True)
class Restart:
    delay_s: float
    report: str


@dataclass(frozen=True)
class Stop:
    exit_status: int
    report: str


def exit_status(result: RunResult) -> int:
    """What the launcher exits with for this run: the code a worker reported when the
    command failed (torchrun's own 1 would hide a worker's 75), else the command's status
    as a shell shows it (128 + N for a process killed by signal N)."""
    if result.returncode != 0 and result.reported_code is not None:
        return result.reported_code
    if result.infrastructure_error and result.returncode not in _KNOWN_CODES:
        return EXIT_INFRASTRUCTURE
    return 128 - result.returncode if result.returncode < 0 else result.returncode


def describe(result: RunResult) -> str:
    """How a run ended, in a few words: 'exit 75 (preempted)', 'killed by SIGKILL'."""
    if result.returncode < 0:
        text = f"killed by {_signal_name(-result.returncode)}"
    else:
        text = f"exit {result.returncode}"
        if result.returncode in _KNOWN_CODES:
            text += f" ({_KNOWN_CODES[result.returncode]})"
    if result.reported_code is not None and result.reported_code != result.returncode:
        meaning = _KNOWN_CODES.get(result.reported_code, "infrastructure")
        text += f", a worker reported {result.reported_code} ({meaning})"
    if result.stalled:
        text += ", after the watchdog ended it for making no progress"
    if result.returncode != 0 and result.last_words is not None:
        whose = "infrastructure" if result.last_words.infrastructure else "application"
        text += f", last words {result.last_words.code} ({whose}): {result.last_words.detail}"
    return text


def classify(result: RunResult, infra_exit_codes: frozenset[int]) -> Cause:
    if result.stalled:
        return Cause.INFRASTRUCTURE
    if result.returncode == 0:
        return Cause.SUCCESS
    if result.reported_code in infra_exit_codes or result.infrastructure_error:
        return Cause.INFRASTRUCTURE
    if result.returncode < 0:
        killed_by = -result.returncode
        return Cause.INFRASTRUCTURE if killed_by in _INFRASTRUCTURE_SIGNALS else Cause.APPLICATION
    return Cause.INFRASTRUCTURE if result.returncode in infra_exit_codes else Cause.APPLICATION


class RestartBudget:
    """Decides, run after run, between `Restart` and `Stop`."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self.runs = 0
        self.infrastructure = 0
        self.application = 0
        self.best_step: int | None = None
        self._stuck_failures: list[float] = []  # end times of recent failures without progress

    def after(self, result: RunResult) -> Restart | Stop:
        policy = self.policy
        self.runs += 1
        progressed = self._progressed(result)
        if result.step is not None and (self.best_step is None or result.step > self.best_step):
            self.best_step = result.step
        cause = classify(result, policy.infra_exit_codes)
        how = describe(result)
        if cause is Cause.SUCCESS:
            return Stop(0, f"job finished after {self._runs()}: {how}; {self._tally()}")
        if progressed:
            self._stuck_failures.clear()
        else:
            horizon = result.ended_at - policy.crash_loop_window_s
            self._stuck_failures = [t for t in self._stuck_failures if t >= horizon]
            self._stuck_failures.append(result.ended_at)
        if cause is Cause.INFRASTRUCTURE:
            self.infrastructure += 1
            used, allowed, what = self.infrastructure, policy.infra_retries, "interruption"
        else:
            self.application += 1
            used, allowed, what = self.application, policy.app_retries, "error"
        stopped = f"stopped after {self._runs()}"
        last = f"last run: {how}; {self._tally()}"
        if len(self._stuck_failures) >= policy.crash_loop_failures:
            window = result.ended_at - self._stuck_failures[0]
            past = "" if self.best_step is None else f" past step {self.best_step}"
            return Stop(
                exit_status(result),
                f"{stopped}: crash loop, {len(self._stuck_failures)} failures in {window:.0f} s "
                f"without progress{past}; {last}",
            )
        if used > allowed:
            return Stop(
                exit_status(result),
                f"{stopped}: {cause.value} budget spent "
                f"({allowed} restart{'' if allowed == 1 else 's'} allowed); {last}",
            )
        streak = len(self._stuck_failures)
        delay = min(policy.backoff_max_s, policy.backoff_s * 2 ** max(streak - 1, 0))
        return Restart(
            delay, f"run {self.runs} ended: {how}; {cause.value} {what} {used} of {allowed} allowed"
        )

    def _progressed(self, result: RunResult) -> bool:
        if result.step is not None:
            return self.best_step is None or result.step > self.best_step
        if self.best_step is None:  # a job that never beats: a long run counts as progress
            return result.ended_at - result.started_at >= self.policy.crash_loop_window_s
        return False

    def _runs(self) -> str:
        return "1 run" if self.runs == 1 else f"{self.runs} runs"

    def _tally(self) -> str:
        best = "" if self.best_step is None else f", best step {self.best_step}"
        return (
            f"infrastructure interruptions {self.infrastructure}, "
            f"application errors {self.application}{best}"
        )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
