"""The job's stderr, passed through unchanged, its tail kept for the launcher to read.

A job's last words (an NCCL transport error, a CUDA out-of-memory) say whose fault its
end was; the launcher reads them once the run is over. The copy goes to the launcher's
own stderr (file descriptor 2) byte for byte, as soon as it is read, so that the
container's log is what the job printed.
"""

from __future__ import annotations

import os
import threading
from typing import IO

from gpuguard.remediation.signatures import TAIL_CHARS

CHUNK = 65536
JOIN_TIMEOUT_S = 2.0


class StderrTail:
    """Copies ``pipe`` to stderr on a thread; ``text`` is the last ``TAIL_CHARS`` bytes."""

    def __init__(self, pipe: IO[bytes], keep: int = TAIL_CHARS) -> None:
        self._pipe = pipe
        self._keep = keep
        self._tail = bytearray()
        self._thread = threading.Thread(target=self._copy, name="job-stderr", daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        fd = self._pipe.fileno()
        try:
            while chunk := os.read(fd, CHUNK):
                _write_all(chunk)
                self._tail += chunk
                if len(self._tail) > 2 * self._keep:
                    del self._tail[: -self._keep]
        except OSError:
            return  # the pipe closed under us: the run is over, keep what was read
        finally:
            self._pipe.close()

    def text(self) -> str:
        """The tail, after the writers closed it (or after a short wait: a process the
        job left behind may hold the pipe)."""
        self._thread.join(JOIN_TIMEOUT_S)
        return bytes(self._tail[-self._keep :]).decode("utf-8", errors="replace")


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(2, view)
        except OSError:
            return  # our own stderr is gone: the tail is still kept
        view = view[written:]
