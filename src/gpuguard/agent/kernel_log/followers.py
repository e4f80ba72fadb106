"""Following the kernel log as it grows, so that an Xid reaches the API in about a second.

A follower calls ``on_lines(lines, reset)`` from its own thread: first with everything
already in the log (``reset=True``), then with each batch of new complete lines. A file
that shrinks or is replaced (a new boot, a rotated log) is read again from the start with
``reset=True``.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from gpuguard.sources import (
    KMSG,
    KMSG_RECORD_BYTES,
    drain_kmsg,
    kernel_log_methods,
    kmsg_message,
)

LinesCallback = Callable[[list[str], bool], None]
POLL_S = 0.1


class Follower(Protocol):
    """Follows one kernel log source until ``stop`` is set."""

    description: str

    def follow(self, on_lines: LinesCallback, stop: threading.Event) -> None: ...


class FileFollower:
    """A plain file (``kern.log``, a test's log): polled for growth every 100 ms."""

    def __init__(self, path: Path, poll_s: float = POLL_S) -> None:
        self.path = path
        self.poll_s = poll_s
        self.description = str(path)

    def follow(self, on_lines: LinesCallback, stop: threading.Event) -> None:
        if not self.path.exists():
            raise FileNotFoundError(f"{self.path}: no such file")
        identity: tuple[int, int] | None = None
        position = 0
        pending = ""
        while not stop.is_set():
            try:
                stat = self.path.stat()
            except FileNotFoundError:  # between a rotation's unlink and the new file
                stop.wait(self.poll_s)
                continue
            reset = identity != (stat.st_dev, stat.st_ino) or stat.st_size < position
            if reset:
                identity, position, pending = (stat.st_dev, stat.st_ino), 0, ""
            if stat.st_size > position or reset:
                with self.path.open("rb") as handle:
                    handle.seek(position)
                    chunk = handle.read()
                position += len(chunk)
                text = pending + chunk.decode("utf-8", errors="replace")
                *complete, pending = text.split("\n")
                if complete or reset:
                    on_lines(complete, reset)
            stop.wait(self.poll_s)


class KmsgFollower:
    """``/dev/kmsg``: one record per read, blocking; starts at the oldest record kept."""

    description = str(KMSG)

    def __init__(self, path: Path = KMSG) -> None:
        self.path = path

    def follow(self, on_lines: LinesCallback, stop: threading.Event) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            on_lines([kmsg_message(record) for record in drain_kmsg(fd)], True)
            os.set_blocking(fd, True)
            while not stop.is_set():
                try:
                    record = os.read(fd, KMSG_RECORD_BYTES)
                except BrokenPipeError:
                    continue  # records were overwritten before we read them
                on_lines([kmsg_message(record)], False)
        finally:
            os.close(fd)


class JournalFollower:
    """``journalctl -k -f`` for nodes where ``/dev/kmsg`` cannot be read."""

    description = "journalctl -k -f"

    def __init__(self, journalctl: str = "journalctl") -> None:
        self.journalctl = journalctl

    def follow(self, on_lines: LinesCallback, stop: threading.Event) -> None:
        proc = subprocess.Popen(
            [self.journalctl, "-k", "-b", "-f", "--no-pager", "-q", "-o", "short-iso"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

        def stop_journalctl() -> None:
            stop.wait()
            proc.terminate()

        threading.Thread(target=stop_journalctl, daemon=True).start()
        assert proc.stdout is not None
        on_lines([], True)
        for line in proc.stdout:
            on_lines([line.rstrip("\n")], False)
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
