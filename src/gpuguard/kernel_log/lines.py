"""Cutting a byte stream into lines of bounded length.

A kernel record is under 1 KiB (the kernel's own limit); a longer "line" is junk, or a
record glued to junk by a writer that lost a newline. A line longer than
:data:`MAX_LINE_BYTES` is cut: its first and its last :data:`KEPT_BYTES` are kept, as two
lines, and the middle is dropped. So an Xid that starts a long line (a record with junk
after it) or ends one (junk, then a record) is still read, and the line waiting for its
newline never holds more than about :data:`MAX_LINE_BYTES`, however long it grows.
"""

from __future__ import annotations

MAX_LINE_BYTES = 16 * 1024
KEPT_BYTES = MAX_LINE_BYTES // 2


class LineCutter:
    """Turns chunks of a stream into blocks of complete lines, each at most
    :data:`MAX_LINE_BYTES`; ``cut`` counts the lines that were cut."""

    def __init__(self) -> None:
        self._pending = bytearray()  # the line waiting for its newline, while short
        self._head: bytes | None = None  # once it is too long: its first bytes...
        self._tail = b""  # ...and its last ones
        self.cut = 0

    def feed(self, chunk: bytes) -> bytes:
        """The complete lines ``chunk`` ends (each ending in a newline; b"" when none)."""
        last = chunk.rfind(b"\n")
        if last < 0:
            self._grow(chunk)
            return b""
        first = chunk.find(b"\n")
        self._grow(chunk[:first])
        done = self._take()
        lines = chunk[first + 1 : last + 1]
        self._grow(chunk[last + 1 :])
        if len(lines) > MAX_LINE_BYTES and max(map(len, lines.split(b"\n"))) > MAX_LINE_BYTES:
            lines = b"".join(self._cut_line(line) + b"\n" for line in lines[:-1].split(b"\n"))
        return (done + b"\n" if done else b"") + lines  # an empty line says nothing

    def _grow(self, data: bytes) -> None:
        if self._head is None:
            if len(self._pending) + len(data) <= MAX_LINE_BYTES:
                self._pending += data
                return
            joined = bytes(self._pending) + data
            self._head, self._tail = joined[:KEPT_BYTES], joined[-KEPT_BYTES:]
            self._pending.clear()
            self.cut += 1
            return
        self._tail = (self._tail + data[-KEPT_BYTES:])[-KEPT_BYTES:]

    def _take(self) -> bytes:
        if self._head is None:
            line = bytes(self._pending)
            self._pending.clear()
            return line
        line, self._head, self._tail = self._head + b"\n" + self._tail, None, b""
        return line

    def _cut_line(self, line: bytes) -> bytes:
        if len(line) <= MAX_LINE_BYTES:
            return line
        self.cut += 1
        return line[:KEPT_BYTES] + b"\n" + line[-KEPT_BYTES:]
