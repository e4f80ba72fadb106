"""Linux inotify on the directory of a followed file: the follower sleeps until the file
is written, truncated, created, renamed or removed, instead of polling it (a watch on the
directory, not the file, also sees a rotation's new file). ``stop`` wakes it through a
pipe. Where inotify is not there (another OS, the per-user limit of instances reached),
``DirectoryWatch.open`` returns None and the follower polls."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import select
import struct
import threading
from pathlib import Path

from gpuguard import threads

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_Q_OVERFLOW, IN_IGNORED = 0x400, 0x800, 0x4000, 0x8000
IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000
CHILD = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE
MASK = CHILD | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
# Events about the directory itself, or lost ones: the file must be looked at again.
ALWAYS = IN_DELETE_SELF | IN_MOVE_SELF | IN_Q_OVERFLOW | IN_IGNORED
HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then name
READ_BYTES = 64 * 1024


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library's inotify calls, looked up once: the process's own symbols, since
    ``find_library`` would run ldconfig on every follow (each retry of an unreadable log)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        _ = libc.inotify_init1, libc.inotify_add_watch
    except (OSError, AttributeError, TypeError):
        return None
    return libc


class DirectoryWatch:
    """Wakes for changes to one file, or for ``stop``: its name in its directory, and,
    when the path is a symbolic link, the target's name in the target's directory (a
    write to the target tells nothing to the link's directory)."""

    def __init__(self, fd: int, names: set[bytes], stop: threading.Event) -> None:
        self.fd = fd
        self.names = names
        self.gone = False  # the directory itself went: the caller polls from then on
        self._wake_r, self._wake_w = os.pipe()
        self._closed = False
        self._lock = threading.Lock()  # no write to the pipe once its numbers are freed
        self._stopper = threads.start("inotify-wake-on-stop", self._wake_on, stop)

    @classmethod
    def open(cls, path: Path, stop: threading.Event) -> DirectoryWatch | None:
        libc = _libc()
        if libc is None:
            return None
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            return None
        places = {path, path.resolve()}
        for place in places:
            if libc.inotify_add_watch(fd, os.fsencode(place.parent), MASK) < 0:
                os.close(fd)
                return None
        return cls(fd, {os.fsencode(place.name) for place in places}, stop)

    def _wake_on(self, stop: threading.Event) -> None:
        stop.wait()
        with self._lock:
            if not self._closed:
                os.write(self._wake_w, b"x")

    def wait(self, timeout_s: float) -> bool:
        """Sleep until the file may have changed (True), ``stop`` or ``timeout_s``."""
        readable, _, _ = select.select([self.fd, self._wake_r], [], [], timeout_s)
        return self.fd in readable and self._drain()

    def _drain(self) -> bool:
        """Read every queued event; whether one concerns the file (or may have)."""
        concerns = False
        while True:
            try:
                data = os.read(self.fd, READ_BYTES)
            except BlockingIOError:
                return concerns
            offset = 0
            while offset + HEADER.size <= len(data):
                _, mask, _, length = HEADER.unpack_from(data, offset)
                name = data[offset + HEADER.size : offset + HEADER.size + length].rstrip(b"\0")
                offset += HEADER.size + length
                self.gone |= bool(mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED))
                concerns |= bool(mask & ALWAYS) or name in self.names

    def close(self) -> None:
        with self._lock:
            self._closed = True
        for fd in (self.fd, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
