"""Following the kernel log as it grows, so that an Xid reaches the API in about a second.

A follower feeds a :class:`LogSink` from its own thread: ``lines(block, reset)`` first
with everything already in the log (``reset=True``), then with each block of new complete
lines (bytes, newline-separated, each line cut to ``lines.MAX_LINE_BYTES``); a file is read
at most :data:`READ_BYTES` at a time, so memory stays bounded however fast the log grows.
A file that shrinks or is replaced (a new boot, a rotated log) is read again from the
start with ``reset=True``. A followed file that is gone, or is no longer a regular file,
for longer than :data:`MISSING_GRACE_S` is said with ``unreadable(detail)``; the grace
covers a rotation's rename-then-create (microseconds, a poll or so), and the follower
keeps looking and reads the file from the start once it is back.
"""

from __future__ import annotations

import os
import select
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Protocol

from gpuguard.agent.kernel_log.lines import LineCutter
from gpuguard.sources import KMSG, drain_kmsg, kernel_log_methods, kmsg_message

POLL_S = 0.1
READ_BYTES = 1 << 20
MISSING_GRACE_S = 1.0


class LogSink(Protocol):
    def lines(self, block: bytes, reset: bool) -> None: ...

    def unreadable(self, detail: str) -> None: ...


class Follower(Protocol):
    """Follows one kernel log source until ``stop`` is set."""

    description: str

    def follow(self, sink: LogSink, stop: threading.Event) -> None: ...


class FileFollower:
    """A plain file (``kern.log``, a test's log): polled for growth every 100 ms."""

    def __init__(
        self, path: Path, poll_s: float = POLL_S, grace_s: float = MISSING_GRACE_S
    ) -> None:
        self.path = path
        self.poll_s = poll_s
        self.grace_s = grace_s
        self.description = str(path)

    def follow(self, sink: LogSink, stop: threading.Event) -> None:
        if isinstance(info := self._stat(), str):
            raise OSError(f"{self.path}: {info}")
        identity: tuple[int, int] | None = None
        position = 0
        cutter = LineCutter()
        missing_since: float | None = None
        said = False
        while not stop.is_set():
            info = self._stat()
            if isinstance(info, str):
                now = time.monotonic()
                missing_since = now if missing_since is None else missing_since
                if not said and now - missing_since >= self.grace_s:
                    sink.unreadable(f"{self.path}: {info} for {now - missing_since:.1f}s")
                    said = True
                identity = None  # whatever comes back is another file: read it all
                stop.wait(self.poll_s)
                continue
            missing_since, said = None, False
            reset = identity != (info.st_dev, info.st_ino) or info.st_size < position
            if reset:
                identity, position, cutter = (info.st_dev, info.st_ino), 0, LineCutter()
            if info.st_size > position or reset:
                position = self._read(position, cutter, sink, reset, stop)
            stop.wait(self.poll_s)

    def _stat(self) -> os.stat_result | str:
        """The file's status, or what is wrong with it."""
        try:
            info = self.path.stat()
        except FileNotFoundError:
            return "no such file"
        return info if stat.S_ISREG(info.st_mode) else "not a regular file"

    def _read(
        self, position: int, cutter: LineCutter, sink: LogSink, reset: bool, stop: threading.Event
    ) -> int:
        """Everything from ``position`` on, a chunk at a time; the new position."""
        try:
            handle = self.path.open("rb")
        except FileNotFoundError:  # gone since its stat: the next poll says so
            return position
        with handle:
            handle.seek(position)
            while True:
                chunk = handle.read(READ_BYTES)
                position += len(chunk)
                block = cutter.feed(chunk)
                if block or reset:
                    sink.lines(block, reset)
                    reset = False
                if len(chunk) < READ_BYTES or stop.is_set():
                    return position


class KmsgFollower:
    """``/dev/kmsg``: one record per read; starts at the oldest record kept. Records come
    in blocks of what is there when the descriptor is readable (the kernel caps a record's
    length)."""

    description = str(KMSG)

    def __init__(self, path: Path = KMSG, wake_s: float = 1.0) -> None:
        self.path = path
        self.wake_s = wake_s  # how often ``stop`` is looked at while the log is quiet

    def follow(self, sink: LogSink, stop: threading.Event) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            sink.lines(self._block(fd), True)
            while not stop.is_set():
                readable, _, _ = select.select([fd], [], [], self.wake_s)
                if readable and (block := self._block(fd)):
                    sink.lines(block, False)
        finally:
            os.close(fd)

    @staticmethod
    def _block(fd: int) -> bytes:
        return b"".join(kmsg_message(r).encode() + b"\n" for r in drain_kmsg(fd))


class JournalFollower:
    """``journalctl -k -f`` for nodes where ``/dev/kmsg`` cannot be read."""

    description = "journalctl -k -f"

    def __init__(self, journalctl: str = "journalctl") -> None:
        self.journalctl = journalctl

    def follow(self, sink: LogSink, stop: threading.Event) -> None:
        proc = subprocess.Popen(
            [self.journalctl, "-k", "-b", "-f", "--no-pager", "-q", "-o", "short-iso"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

        def stop_journalctl() -> None:
            stop.wait()
            proc.terminate()

        threading.Thread(target=stop_journalctl, daemon=True).start()
        assert proc.stdout is not None
        sink.lines(b"", True)
        cutter = LineCutter()
        fd = proc.stdout.fileno()
        while chunk := os.read(fd, READ_BYTES):  # whatever is there, up to a bound
            if block := cutter.feed(chunk):
                sink.lines(block, False)
        proc.wait()


def follower_for(choice: str, bundle_log: Path | None = None) -> Follower:
    """The follower for the ``kernel_log`` setting (``auto``, ``kmsg``, ``journalctl``, path);
    ``auto`` reads ``/dev/kmsg`` where it may, journald elsewhere."""
    if bundle_log is not None:
        return FileFollower(bundle_log)
    methods = kernel_log_methods(choice, follow=True)
    if methods is None:
        return FileFollower(Path(choice))
    if methods == ("kmsg",) or ("kmsg" in methods and os.access(KMSG, os.R_OK)):
        return KmsgFollower()
    return JournalFollower()
