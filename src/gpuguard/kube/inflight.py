"""Which threads are inside a socket read of a shared client, so that it closes safely.

Closing a connection pool frees the socket descriptors of every connection, including one
another thread is blocked reading (a watch waits minutes for its next event). The kernel
then hands the same descriptor number to the next connection opened, and the orphaned
reader, waking up, reads that connection's TLS records: the new connection fails with
"decryption failed or bad record mac" in whichever unrelated request comes next.

So a closing client first shuts down the sockets of its open watches (``shutdown`` wakes a
blocked reader with end-of-file and keeps the descriptor), waits until no thread is inside
a read or request, and only then closes the pool. The owner of a ``stop`` event can end the
watches started with it the same way, without closing the client others share.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from gpuguard.kube.errors import KubeUnavailable

CLOSE_WAIT_S = 11.0  # just over a request's own timeout: a blocked request ends by then


@dataclass
class _Stream:
    sock: socket.socket | None
    stop: threading.Event | None


class InFlight:
    """Counts threads inside requests and watch reads; shuts down watch sockets on demand."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = 0
        self._closing = False
        self._streams: dict[int, _Stream] = {}
        self._ids = itertools.count()

    @contextlib.contextmanager
    def busy(self, what: str) -> Iterator[None]:
        """Around one request, or one read of a watch stream."""
        with self._cond:
            if self._closing:
                raise KubeUnavailable(f"{what}: the client is closed")
            self._busy += 1
        try:
            yield
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def stream(self, sock: object, stop: threading.Event | None) -> Iterator[None]:
        """While a watch stream is open: its socket, to shut down on close or ``stop``."""
        entry = _Stream(sock if isinstance(sock, socket.socket) else None, stop)
        key = next(self._ids)
        with self._cond:
            self._streams[key] = entry
            if self._closing or (stop is not None and stop.is_set()):
                _shut(entry)  # the stop came between the request and this registration
        try:
            yield
        finally:
            with self._cond:
                del self._streams[key]

    def end_streams(self, stop: threading.Event) -> None:
        """Wake the watches started with ``stop`` (already set) out of their reads."""
        with self._cond:
            for entry in self._streams.values():
                if entry.stop is stop:
                    _shut(entry)

    def close(self) -> bool:
        """Refuse new work, end every watch, wait for readers; False if one never left."""
        with self._cond:
            self._closing = True
            for entry in self._streams.values():
                _shut(entry)
            return self._cond.wait_for(lambda: self._busy == 0, timeout=CLOSE_WAIT_S)


def _shut(entry: _Stream) -> None:
    if entry.sock is None:
        return
    with contextlib.suppress(OSError):  # already disconnected
        # The plain socket's shutdown: ssl.SSLSocket's own would drop its TLS state under
        # the reading thread's feet.
        socket.socket.shutdown(entry.sock, socket.SHUT_RDWR)
