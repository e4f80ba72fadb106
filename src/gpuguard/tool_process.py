"""Runs a node's diagnostic tools bounded in time and in output, and keeps sight of the ones
that will not die.

A tool runs in its own process group. Its output is read as it comes, and the group is
killed at the timeout or as soon as stdout passes its cap (:data:`MAX_OUTPUT_BYTES`, or the
caller's lower one: "output too large", a failed check). A tool can outlive the kill: one
stuck in the GPU driver ignores SIGKILL until the driver call returns, and a child that left
the group (``setsid``) is not reached by it. While such a run still holds the tool's pipes,
or is not reaped, it is *hung*: one watcher thread holds its pipes, discarding what comes,
until they close and the process is reaped. Until then that executable is not started again;
a call is refused with :class:`ToolStillRunning`, naming the hung run and since when. So
each tool has at most one hung run, and the threads and descriptors it holds stay bounded
whatever the schedule.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import select
import signal
import subprocess
import threading
from dataclasses import dataclass

from gpuguard.clock import SYSTEM_CLOCK
from gpuguard.errors import CheckFailed, CheckTimedOut, ToolMissing

log = logging.getLogger("gpuguard.tools")

# Far above any real report (nvidia-smi -q -x is up to ~120 KB per GPU, Blackwell's clock
# tables: 16 GPUs are 2 MB) and low enough that parsing what passes (XML takes ~12x its
# size) keeps the agent under its 128 MiB memory limit.
MAX_OUTPUT_BYTES = 4 * 1024 * 1024
STDERR_TAIL_BYTES = 4096  # enough to say why a tool died
KILL_GRACE_S = 0.2  # how long a killed tool gets to close its pipes and be reaped
READ_BYTES = 64 * 1024


@dataclass(frozen=True)
class ToolOutput:
    """A tool's standard output and exit status (or a bundle file, exit status 0)."""

    text: str
    exit_code: int
    origin: str


class ToolStillRunning(CheckTimedOut):
    """The previous run of this tool has not exited yet, so it is not started again."""


@dataclass(frozen=True)
class HungRun:
    """A run that outlived its kill: still holding its pipes, or not reaped."""

    key: str  # what it holds back: its executable, or the caller's hung_key
    command: str
    pid: int
    started: datetime.datetime
    started_monotonic: float

    def describe(self) -> str:
        age = SYSTEM_CLOCK.monotonic() - self.started_monotonic
        since = self.started.strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"{self.command} (pid {self.pid}, running since {since}, {age:.0f}s)"


class HungRuns:
    """The hung runs of this process, one watcher thread each, until they really exit.

    Process-wide on purpose: the processes are the process's children wherever they were
    started, and a tool stuck for one caller (a wedged driver) would be stuck for any.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[int, HungRun] = {}

    def of(self, key: str) -> HungRun | None:
        with self._lock:
            return next((r for r in self._runs.values() if r.key == key), None)

    def refuse_if_hung(self, key: str) -> None:
        run = self.of(key)
        if run is not None:
            raise ToolStillRunning(
                f"{key}: the previous run has not exited yet: {run.describe()};"
                " not started again until it does"
            )

    def watch(self, run: HungRun, proc: subprocess.Popen[bytes], pipes: _Pipes) -> None:
        with self._lock:
            self._runs[run.pid] = run
        log.warning("%s has not exited after its kill; watching it", run.describe())
        threading.Thread(
            target=self._until_exit, args=(run, proc, pipes), name=f"hung-{run.pid}", daemon=True
        ).start()

    def _until_exit(self, run: HungRun, proc: subprocess.Popen[bytes], pipes: _Pipes) -> None:
        pipes.pump(deadline=None)
        proc.wait()
        pipes.close()
        with self._lock:
            del self._runs[run.pid]
        log.info("%s has exited at last", run.describe())


HUNG = HungRuns()


def run_tool(
    argv: list[str],
    timeout_s: float,
    max_output_bytes: int = MAX_OUTPUT_BYTES,
    hung_key: str | None = None,
) -> ToolOutput:
    """Run a diagnostic with a hard timeout and a cap on its output; never blocks past the
    timeout (plus :data:`KILL_GRACE_S`). Raises ToolMissing, CheckTimedOut (ToolStillRunning
    while a previous run is hung) or CheckFailed. A hung run holds back the runs with its
    ``hung_key``: by default the executable (a wedged driver stalls any call of the tool)."""
    key = hung_key or argv[0]
    HUNG.refuse_if_hung(key)
    proc, started = _spawn(argv)
    command = " ".join(argv)
    deadline = SYSTEM_CLOCK.monotonic() + timeout_s
    pipes = _Pipes(proc, max_output_bytes)
    pipes.pump(deadline)
    if pipes.too_large or not pipes.closed or not _reaped(proc, deadline):
        if pipes.too_large:
            problem = f"{command}: output too large (over {_size(max_output_bytes)})"
            error: type[CheckFailed | CheckTimedOut] = CheckFailed
        else:
            problem = f"{command}: no result after {timeout_s:g}s"
            error = CheckTimedOut
        hung = _stop(proc, pipes, HungRun(key, command, proc.pid, *started))
        if hung:
            problem += f", killed, but it has not exited: {hung.describe()}"
        else:
            problem += ", killed"
        raise error(problem)
    pipes.close()
    if proc.returncode < 0:
        name = _signal_name(-proc.returncode)
        detail = pipes.stderr.decode("utf-8", errors="replace").strip()[-300:]
        raise CheckFailed(f"{argv[0]}: killed by {name}" + (f": {detail}" if detail else ""))
    return ToolOutput(pipes.stdout.decode("utf-8", errors="replace"), proc.returncode, command)


def _spawn(
    argv: list[str],
) -> tuple[subprocess.Popen[bytes], tuple[datetime.datetime, float]]:
    started = (datetime.datetime.now(datetime.UTC), SYSTEM_CLOCK.monotonic())
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise ToolMissing(f"{argv[0]}: not found") from None
    except PermissionError:
        raise CheckFailed(f"{argv[0]}: not executable") from None
    except OSError as exc:
        raise CheckFailed(f"{argv[0]}: cannot start: {exc.strerror}") from None
    return proc, started


def _stop(proc: subprocess.Popen[bytes], pipes: _Pipes, run: HungRun) -> HungRun | None:
    """Kill the tool's group; the run if it has not exited within the grace, now watched."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    pipes.discard()
    grace = SYSTEM_CLOCK.monotonic() + KILL_GRACE_S
    pipes.pump(grace)
    if _reaped(proc, grace) and pipes.closed:
        return None
    HUNG.watch(run, proc, pipes)
    return run


def _reaped(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    try:
        proc.wait(max(0.0, deadline - SYSTEM_CLOCK.monotonic()))
    except subprocess.TimeoutExpired:
        return False
    return True


class _Pipes:
    """A tool's stdout and stderr, read as they come: stdout up to just past the cap, the
    tail of stderr, or nothing kept once the tool is being stopped."""

    def __init__(self, proc: subprocess.Popen[bytes], limit: int) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self._stdout_fd = proc.stdout.fileno()
        self._files = {proc.stdout.fileno(): proc.stdout, proc.stderr.fileno(): proc.stderr}
        self._poll = select.poll()
        for fd in self._files:
            self._poll.register(fd, select.POLLIN)
        self.stdout = bytearray()
        self.stderr = bytearray()
        self._keep = True
        self._limit = limit

    @property
    def closed(self) -> bool:
        return not self._files

    @property
    def too_large(self) -> bool:
        return len(self.stdout) > self._limit

    def discard(self) -> None:
        self._keep = False
        self.stdout = bytearray()
        self.stderr = bytearray()

    def pump(self, deadline: float | None) -> None:
        """Read until both pipes close, ``deadline`` passes (None: no deadline), or stdout
        passes the cap."""
        while self._files and not self.too_large:
            now = SYSTEM_CLOCK.monotonic()
            if deadline is not None and now >= deadline:
                return
            wait_ms = None if deadline is None else max(1, int((deadline - now) * 1000))
            for fd, _ in self._poll.poll(wait_ms):
                self._read(fd)

    def close(self) -> None:
        for fd, file in list(self._files.items()):
            self._poll.unregister(fd)
            file.close()
        self._files.clear()

    def _read(self, fd: int) -> None:
        try:
            chunk = os.read(fd, READ_BYTES)
        except OSError:  # not seen on a pipe; taken as its end rather than a dead watcher
            chunk = b""
        if not chunk:
            self._poll.unregister(fd)
            self._files.pop(fd).close()
        elif not self._keep:
            pass
        elif fd == self._stdout_fd:
            self.stdout += chunk
        else:
            self.stderr += chunk
            del self.stderr[:-STDERR_TAIL_BYTES]


def _size(limit: int) -> str:
    return f"{limit // 2**20} MiB" if limit >= 2**20 else f"{limit // 1024} KiB"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
