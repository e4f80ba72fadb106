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
from pathlib import Path
from typing import Protocol

from gpuguard.clock import SYSTEM_CLOCK
from gpuguard.kernel_log.inotify import DirectoryWatch
from gpuguard.kernel_log.lines import LineCutter
from gpuguard.sources import KMSG, drain_kmsg, kernel_log_methods, kmsg_message

POLL_S = 0.1  # where inotify is not there, or once it missed a change
# With inotify: a look anyway, for a change no event told of (a file system that does not
# report every write, such as a network one). Once a look finds one, the file is polled.
BACKSTOP_S = 10.0
READ_BYTES = 1 << 20
MISSING_GRACE_S = 1.0
HEAD_BYTES = 256  # what tells a copy-truncated and refilled file from the one read


class LogSink(Protocol):
    def lines(self, block: bytes, reset: bool) -> None: ...

    def unreadable(self, detail: str) -> None: ...


class Follower(Protocol):
    """Follows one kernel log source until ``stop`` is set."""

    description: str

    def follow(self, sink: LogSink, stop: threading.Event) -> None: ...


class FileFollower:
    """A plain file (``kern.log``, a test's log): read when inotify says its directory
    changed it (and every :data:`BACKSTOP_S` anyway), else polled every 100 ms; polled from
    the first time a look with no event found the file changed (inotify misses changes
    there).

    A file replaced (another inode), shorter than what was read, or whose head is no longer
    the head that was read (logrotate's ``copytruncate`` followed by new lines past the old
    position between two polls) is read again from the start: its new head may hold an Xid.
    """

    def __init__(
        self,
        path: Path,
        poll_s: float = POLL_S,
        grace_s: float = MISSING_GRACE_S,
        *,
        notify: bool = True,
    ) -> None:
        self.path = path
        self.poll_s = poll_s
        self.notify = notify
        self.grace_s = grace_s
        self.description = str(path)
        self._identity: tuple[int, int] | None = None
        self._position = 0
        self._head = b""  # the file's first HEAD_BYTES as read
        self._changed: tuple[int, int] = (-1, -1)  # (size, mtime) when last looked at
        self._cutter = LineCutter()
        self._missing_since: float | None = None
        self._said = False
        self.untold = False  # a look with no event found a change: inotify is not enough

    def follow(self, sink: LogSink, stop: threading.Event) -> None:
        if isinstance(info := self._stat(), str):
            raise OSError(f"{self.path}: {info}")
        self._identity = None
        watch = DirectoryWatch.open(self.path, stop) if self.notify else None
        told = True  # the first look needs no event
        try:
            while not stop.is_set():
                if self.poll(sink, stop) and not told and watch is not None:
                    told = watch.wait(0)  # an event queued since the wake: late, not missed
                    if told:
                        continue  # look again for what it told of
                    self.untold = True
                if watch is None or watch.gone or self.untold:
                    stop.wait(self.poll_s)
                else:
                    told = watch.wait(self._sleep_s())
        finally:
            if watch is not None:
                watch.close()

    def _sleep_s(self) -> float:
        """Until the next look with no event: the rest of a missing file's grace, else
        the backstop."""
        if self._missing_since is None or self._said:
            return BACKSTOP_S
        return max(0.0, self._missing_since + self.grace_s - SYSTEM_CLOCK.monotonic())

    def poll(self, sink: LogSink, stop: threading.Event | None = None) -> bool:
        """One look at the file: what is new goes to ``sink``. Whether the file changed
        since the last look (replaced, gone, or another size or modification time)."""
        before = (self._identity, self._changed)
        info = self._stat()
        if isinstance(info, str):
            now = SYSTEM_CLOCK.monotonic()
            self._missing_since = self._missing_since or now
            if not self._said and now - self._missing_since >= self.grace_s:
                sink.unreadable(f"{self.path}: {info} for {now - self._missing_since:.1f}s")
                self._said = True
            self._identity = None  # whatever comes back is another file: read it all
            return self._identity != before[0]
        self._missing_since, self._said = None, False
        changed = (info.st_size, info.st_mtime_ns)
        reset = (
            self._identity != (info.st_dev, info.st_ino)
            or info.st_size < self._position
            or (changed != self._changed and not self._same_head())
        )
        self._changed = changed
        if reset:
            self._identity, self._position = (info.st_dev, info.st_ino), 0
            self._head, self._cutter = b"", LineCutter()
        if info.st_size > self._position or reset:
            self._read(sink, reset, stop or threading.Event())
        return (self._identity, self._changed) != before

    def _stat(self) -> os.stat_result | str:
        """The file's status, or what is wrong with it."""
        try:
            info = self.path.stat()
        except FileNotFoundError:
            return "no such file"
        return info if stat.S_ISREG(info.st_mode) else "not a regular file"

    def _same_head(self) -> bool:
        """Whether the file still starts with the bytes read from its start."""
        if not self._head:
            return True
        try:
            with self.path.open("rb") as handle:
                return handle.read(len(self._head)) == self._head
        except OSError:
            return True  # gone since its stat: the next poll says so

    def _read(self, sink: LogSink, reset: bool, stop: threading.Event) -> None:
        """Everything from the position on, a chunk at a time."""
        try:
            handle = self.path.open("rb")
        except FileNotFoundError:  # gone since its stat: the next poll says so
            return
        with handle:
            handle.seek(self._position)
            while True:
                chunk = handle.read(READ_BYTES)
                if len(self._head) < HEAD_BYTES and self._position < HEAD_BYTES:
                    self._head += chunk[: HEAD_BYTES - self._position]
                self._position += len(chunk)
                block = self._cutter.feed(chunk)
                if block or reset:
                    sink.lines(block, reset)
                    reset = False
                if len(chunk) < READ_BYTES or stop.is_set():
                    return


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
