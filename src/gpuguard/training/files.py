"""Durable, atomic file writes with a checksum taken on the way out.

A machine can lose power or a pod be killed at any instant, so a file is written under a
temporary name, flushed to the disk, renamed into place, and the directory flushed too: a
reader sees the old state or the new one, never half of it. The checksum is computed from
the very bytes handed to the file, in the same pass, so that verifying it later proves
that what is on disk is what was written.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

TEMPORARY_PREFIX = ".tmp-"
_CHUNK = 8 << 20


class ChecksumMismatch(Exception):
    """A file is not the one its manifest describes (truncated, corrupted or replaced)."""


class HashingWriter:
    """Passes writes to a file and feeds them to a SHA-256 digest on the way."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self._digest = hashlib.sha256()
        self.size = 0

    def write(self, data: Buffer, /) -> int:
        view = memoryview(data).cast("B")
        self._digest.update(view)
        self._file.write(view)
        self.size += view.nbytes
        return view.nbytes

    def flush(self) -> None:
        self._file.flush()

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def write_atomically(
    directory: Path, name: str, fill: Callable[[HashingWriter], object]
) -> tuple[int, str]:
    """Create ``directory/name`` with what ``fill`` writes; return its size and SHA-256."""
    temporary = directory / f"{TEMPORARY_PREFIX}{os.urandom(6).hex()}-{name}"
    try:
        with temporary.open("wb") as file:
            writer = HashingWriter(file)
            fill(writer)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, directory / name)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_directory(directory)
    return writer.size, writer.hexdigest()


def fsync_directory(directory: Path) -> None:
    """Make the directory's entries (a rename, a new file) survive a crash."""
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def verify(path: Path, size: int, sha256: str) -> None:
    """Raise `ChecksumMismatch` unless the file has exactly this size and digest."""
    try:
        actual_size = path.stat().st_size
    except FileNotFoundError:
        raise ChecksumMismatch(f"{path.name} is missing") from None
    if actual_size != size:
        raise ChecksumMismatch(f"{path.name} has {actual_size} bytes, the manifest says {size}")
    digest = hashlib.sha256()
    chunk = memoryview(bytearray(_CHUNK))
    with path.open("rb", buffering=0) as file:
        while count := file.readinto(chunk):
            digest.update(chunk[:count])
    if digest.hexdigest() != sha256:
        raise ChecksumMismatch(f"{path.name} does not match its SHA-256 checksum")
