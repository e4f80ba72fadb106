"""``gpuguard run -- COMMAND``: run a training job, restart it after interruptions, stop it
when it is the job that fails.

The launcher starts COMMAND in a session of its own, tells it where to resume (environment
variables of `gpuguard.training.contract`), watches its heartbeat, and after each run
lets `RestartBudget` decide between a restart after a back-off and a stop. It is made to be
a container's entry point (PID 1): a SIGTERM to it, the pod going away, is passed to the job
(which saves its checkpoint) and ends the restarts; the launcher then waits for the job and
exits with the job's status. Everything the job left running is ended before the next run,
so that no stray worker keeps a GPU.

Runnable as ``python -m gpuguard.training.launcher`` where only the standard library is
available (a training image): this module imports nothing else of gpuguard's heavy parts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from gpuguard.clock import SYSTEM_CLOCK
from gpuguard.errors import ConfigError
from gpuguard.remediation.signatures import classify
from gpuguard.training import process_tree
from gpuguard.training.contract import (
    CHECKPOINT_DIR_ENV,
    EXIT_REASON_FILE_ENV,
    HEARTBEAT_FILE_ENV,
    RESTART_COUNT_ENV,
)
from gpuguard.training.heartbeat import read_heartbeat
from gpuguard.training.options import add_arguments
from gpuguard.training.restart_policy import (
    RestartBudget,
    RestartPolicy,
    RunResult,
    Stop,
    describe,
    exit_status,
)
from gpuguard.training.stderr_tail import StderrTail

POLL_S = 0.05
LEFTOVER_TIMEOUT_S = 10.0
# What a stop request becomes for the job: SIGHUP (the terminal went away) is a stop too.
_FORWARDED = {
    signal.SIGTERM: signal.SIGTERM,
    signal.SIGINT: signal.SIGINT,
    signal.SIGHUP: signal.SIGTERM,
}
EXIT_USAGE = 64
EXIT_CANNOT_RUN = 126
EXIT_NOT_FOUND = 127


@dataclass(frozen=True)
class Watchdog:
    progress_timeout_s: float | None
    startup_timeout_s: float | None
    kill_grace_s: float


class CannotStart(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Launcher:
    def __init__(
        self,
        command: Sequence[str],
        policy: RestartPolicy,
        watchdog: Watchdog,
        checkpoint_dir: Path | None,
    ) -> None:
        self.command = list(command)
        self.policy = policy
        self.watchdog = watchdog
        self.checkpoint_dir = checkpoint_dir
        self._stop_requests: list[signal.Signals] = []
        self._workdir = Path()

    def run(self) -> int:
        """Run the job to its end; the launcher's exit status."""
        previous = {signum: signal.signal(signum, self._note_stop) for signum in _FORWARDED}
        if not process_tree.become_subreaper():
            say("cannot adopt the job's orphans (no PR_SET_CHILD_SUBREAPER): they may outlive it")
        self._workdir = Path(tempfile.mkdtemp(prefix="gpuguard-run-"))
        try:
            return self._run_until_done()
        except CannotStart as exc:
            say(str(exc))
            return exc.status
        finally:
            shutil.rmtree(self._workdir, ignore_errors=True)
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _run_until_done(self) -> int:
        budget = RestartBudget(self.policy)
        last: RunResult | None = None
        while True:
            if self._stop_requests:
                return self._stopped(last)
            last = self._run_once(restarts=budget.runs)
            if self._stop_requests:
                return self._stopped(last)
            decision = budget.after(last)
            if isinstance(decision, Stop):
                say(f"{decision.report}; exit status {decision.exit_status}")
                return decision.exit_status
            say(f"{decision.report}; restarting in {decision.delay_s:.1f} s")
            self._sleep(decision.delay_s)

    def _stopped(self, last: RunResult | None) -> int:
        asked = self._stop_requests[0].name
        if last is None:
            say(f"stopped: asked to stop ({asked}) before the job started")
            return 128 + self._stop_requests[0]
        status = exit_status(last)
        say(f"stopped: asked to stop ({asked}); last run: {describe(last)}; exit status {status}")
        return status

    def _run_once(self, restarts: int) -> RunResult:
        heartbeat = self._workdir / "heartbeat"
        reason = self._workdir / "exit-reason"
        heartbeat.write_bytes(b"")
        reason.unlink(missing_ok=True)
        env = dict(os.environ)
        env[RESTART_COUNT_ENV] = str(restarts)
        env[HEARTBEAT_FILE_ENV] = str(heartbeat)
        env[EXIT_REASON_FILE_ENV] = str(reason)
        if self.checkpoint_dir is not None:
            env[CHECKPOINT_DIR_ENV] = str(self.checkpoint_dir)
        started = SYSTEM_CLOCK.monotonic()
        child = self._start(env)
        assert child.stderr is not None  # started with stderr=PIPE
        stderr = StderrTail(child.stderr)
        watch = _RunWatch(self._stop_requests, self.watchdog, child.pid, heartbeat, started)
        while not process_tree.exited(child.pid):
            process_tree.reap_orphans(keep=child.pid)
            watch.poll(SYSTEM_CLOCK.monotonic())
            time.sleep(POLL_S)
        self._end_leftovers(child.pid)
        child.returncode = process_tree.reap(child.pid)
        last_beat = read_heartbeat(heartbeat)
        return RunResult(
            returncode=child.returncode,
            started_at=started,
            ended_at=SYSTEM_CLOCK.monotonic(),
            stalled=watch.stalled,
            reported_code=_read_reported_code(reason),
            step=last_beat if last_beat is not None else watch.step,
            last_words=classify(stderr.text()) if child.returncode else None,
        )

    def _start(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen(
                self.command, env=env, start_new_session=True, stderr=subprocess.PIPE
            )
        except FileNotFoundError as exc:
            raise CannotStart(EXIT_NOT_FOUND, f"cannot start {self.command[0]!r}: {exc}") from exc
        except OSError as exc:
            raise CannotStart(EXIT_CANNOT_RUN, f"cannot run {self.command[0]!r}: {exc}") from exc

    def _end_leftovers(self, child: int) -> None:
        """SIGKILL whatever the job left behind (its leader has exited)."""
        deadline = SYSTEM_CLOCK.monotonic() + LEFTOVER_TIMEOUT_S
        while left := [pid for pid in process_tree.descendants(os.getpid()) if pid != child]:
            process_tree.signal_all(left, signal.SIGKILL)
            process_tree.reap_exited(left)
            if SYSTEM_CLOCK.monotonic() > deadline:
                say(f"processes {left} of the job did not end on SIGKILL; going on")
                return
            time.sleep(0.01)

    def _sleep(self, seconds: float) -> None:
        """Wait before a restart; a stop request cuts the wait short."""
        deadline = SYSTEM_CLOCK.monotonic() + seconds
        while not self._stop_requests and SYSTEM_CLOCK.monotonic() < deadline:
            process_tree.reap_orphans(keep=None)
            time.sleep(min(POLL_S, max(deadline - SYSTEM_CLOCK.monotonic(), 0)))

    def _note_stop(self, signum: int, frame: FrameType | None) -> None:
        self._stop_requests.append(signal.Signals(signum))


class _RunWatch:
    """One run's stop requests and watchdog, checked at every poll."""

    def __init__(
        self,
        stop_requests: list[signal.Signals],
        watchdog: Watchdog,
        pid: int,
        heartbeat: Path,
        started: float,
    ) -> None:
        self.stop_requests = stop_requests
        self.watchdog = watchdog
        self.pid = pid
        self.heartbeat = heartbeat
        self.step: int | None = None
        self.moved_at = started
        self.stalled = False
        self.stall_noticed_at = 0.0
        self.killed = False
        self.stops_handled = 0

    def poll(self, now: float) -> None:
        while self.stops_handled < len(self.stop_requests):
            signum = self.stop_requests[self.stops_handled]
            self.stops_handled += 1
            if self.stops_handled == 1:
                self._signal_leader(_FORWARDED[signum])
            else:
                say(f"{signum.name} again: killing the job")
                self._kill_all()
        beat = read_heartbeat(self.heartbeat)
        if beat != self.step:
            self.step, self.moved_at = beat, now
        watchdog = self.watchdog
        if self.stalled:
            if now - self.stall_noticed_at >= watchdog.kill_grace_s:
                self._kill_all()
            return
        timeout = watchdog.startup_timeout_s if self.step is None else watchdog.progress_timeout_s
        # Once a stop was passed on, the job is saving: its grace period is the pod's.
        if timeout is None or self.stops_handled or now - self.moved_at <= timeout:
            return
        self.stalled, self.stall_noticed_at = True, now
        at = "before its first heartbeat" if self.step is None else f"at step {self.step}"
        say(
            f"no progress for {timeout:g} s ({at}): ending the job "
            f"(SIGTERM, SIGKILL after {watchdog.kill_grace_s:g} s)"
        )
        self._signal_leader(signal.SIGTERM)

    def _signal_leader(self, signum: signal.Signals) -> None:
        process_tree.signal_all([self.pid], signum)

    def _kill_all(self) -> None:
        if not self.killed:
            self.killed = True
            process_tree.signal_all(process_tree.descendants(os.getpid()), signal.SIGKILL)


def run_launcher(args: argparse.Namespace) -> int:
    """``gpuguard run``: the parsed options to a `Launcher` run."""
    command = list(args.job_command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise ConfigError("no command to run (usage: gpuguard run [options] -- COMMAND...)")
    if args.checkpoint_dir is not None:
        try:
            args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--checkpoint-dir {args.checkpoint_dir}: {exc}") from exc
    policy = RestartPolicy(
        infra_retries=args.infra_retries,
        app_retries=args.app_retries,
        backoff_s=args.backoff,
        backoff_max_s=max(args.backoff_max, args.backoff),
        crash_loop_failures=args.crash_loop,
        crash_loop_window_s=args.crash_loop_window,
        infra_exit_codes=RestartPolicy().infra_exit_codes | frozenset(args.infra_exit_code),
    )
    startup = args.startup_timeout if args.startup_timeout is not None else args.progress_timeout
    watchdog = Watchdog(args.progress_timeout, startup, args.kill_grace)
    return Launcher(command, policy, watchdog, args.checkpoint_dir).run()


def say(message: str) -> None:
    print(f"gpuguard run: {message}", file=sys.stderr, flush=True)


def _read_reported_code(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuguard run", description="Run a training job; restart it after interruptions."
    )
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse's usage errors exit 2; gpuguard's exit 64
        return EXIT_USAGE if exc.code == 2 else int(exc.code or 0)
    try:
        return run_launcher(args)
    except ConfigError as exc:
        say(str(exc))
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
