"""Kernel log scanning: finding the lines worth parsing, fast, in any collector's shape.

The kernel log is the layer that still works when DCGM, NVML and nvidia-smi do not, so it
is always read. Scanning is two-step for speed: a byte-level multi-pattern search (a SIMD
Aho-Corasick automaton) finds the few lines that contain a marker (a node's boot log is
mostly other drivers' chatter), and only those lines are decoded and parsed by the
grammar in :mod:`gpuguard.kernel_log.messages`, whatever the collector's prefix
(``dmesg``, ``dmesg -T``, ISO, ``--decode``, journald, raw ``/dev/kmsg``).

One printk call can hold several lines (the driver's "fallen off the bus" message has
three). Collectors deliver them as separate records, as one journald entry whose lines
follow each other, or as one ``/dev/kmsg`` record with the newlines escaped as ``\\x0a``;
every shape ends up as the same sequence of lines here.

The agent reads through :class:`RepeatScanner`, which parses each distinct message once
(a flood of one message costs a look-up a line) and hands the events to
``tally.IncidentTally``, which counts them into incidents rather than keeping lines.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import ClassVar

import ahocorasick_rs

from gpuguard.checks.base import CheckContext
from gpuguard.errors import ParseError
from gpuguard.kernel_log.messages import (
    AER_PHRASES,
    KERNEL_PHRASES,
    LINK_PHRASES,
    KernelEvent,
    parse_line,
)
from gpuguard.kernel_log.tally import findings_for_events
from gpuguard.model import Finding, Layer
from gpuguard.sources import Artifact

__all__ = [
    "KernelEvent",
    "RepeatScanner",
    "classify_log",
    "has_kernel_record",
    "parse_line",
    "relevant_lines",
    "scan",
]

# A line holding none of these is never decoded or parsed. The driver writes "NVRM:" into
# every message it prints; the others are the kernel's own faults and the lines that must
# survive a shipper that strips "NVRM:" (Xid, SXid, fallen off the bus). Few markers keep
# the automaton's SIMD prefilter fast (it slows with every one added: docs/BENCHMARKS.md);
# tests/unit/test_kernel_messages.py checks that every phrase the grammar needs is kept.
MARKERS = (
    b"NVRM",
    b"Xid",
    b"fallen off the bus",
    b"infiniband ",  # EFA through the RDMA core
    b"efa ",
    *(phrase.encode() for phrase in (*KERNEL_PHRASES, *AER_PHRASES, *LINK_PHRASES)),
)
# Leftmost-first matching is what lets the automaton use its SIMD prefilter.
_FINDER = ahocorasick_rs.BytesAhoCorasick(
    list(MARKERS), matchkind=ahocorasick_rs.MATCHKIND_LEFTMOST_FIRST
)
# How /dev/kmsg escapes the newlines inside one record.
KMSG_NEWLINE = "\\x0a"


def relevant_lines(log: bytes | str) -> Iterator[str]:
    """The lines of ``log`` that contain a marker, each once, in log order.

    Lines are split on newlines and on ``/dev/kmsg``'s escaped ``\\x0a``, so a multi-line
    message reads the same from every collector.
    """
    data = log.encode("utf-8", errors="surrogatepass") if isinstance(log, str) else log
    for start, end in _relevant_spans(data):
        yield from split_record(_decoded(data[start:end]))


def _relevant_spans(data: bytes) -> Iterator[tuple[int, int]]:
    """(start, end) of each line of ``data`` holding a marker, each once, in order."""
    next_line = 0  # the end of the last line yielded: later matches in it are skipped
    for _, start, _ in _FINDER.find_matches_as_indexes(data):
        if start < next_line:
            continue
        line_end = data.find(b"\n", start)
        if line_end < 0:
            line_end = len(data)
        next_line = line_end
        yield data.rfind(b"\n", 0, start) + 1, line_end


def _decoded(line: bytes) -> str:
    return line.decode("utf-8", errors="replace").rstrip("\r")


# The time stamp a collector puts in front of a message, the only part in which the lines
# of a flood of the same message differ: dmesg's "[ 5.123456] ", /dev/kmsg's
# "6,1234,5678901,-;", an ISO time (journald's short-iso, rsyslog's). Nothing the grammar
# reads lies in it, so lines equal after it parse to the same events.
_STAMP = re.compile(
    rb"^(?:\[ *\d+\.\d+\]|\d+,\d+,\d+,[^;\s]{0,64};"
    rb"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)[ \t]*"
)
# The start of a line as each collector the agent and `gpuguard check` read writes a kernel
# record: dmesg ("[    5.123456] "), dmesg -T ("[Fri Dec  4 05:46:09 2026] "), dmesg
# --decode ("kern  :info  : "), /dev/kmsg ("6,1234,5678901,-;"), an ISO time (dmesg
# --time-format=iso, journalctl -o short-iso, rsyslog) and journalctl's default short form
# ("Dec 04 05:46:09 host kernel: "). A log with none of them, and no line the grammar
# reads, is no kernel log: random bytes or prose must never read healthy.
_RECORD = re.compile(
    rb"(?m)^(?:\[ *\d+\.\d+\] "
    rb"|\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\] "
    rb"|(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|local\d) *:"
    rb"(?:emerg|alert|crit|err|warn|notice|info|debug) *: "
    rb"|\d+,\d+,\d+,[^;\s]{0,64};"
    rb"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s"
    rb"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)? \S+ kernel: )"
)
_CACHED_CHARS = 1024  # a longer line is parsed every time (it is no kernel record)
_CACHED_LINES = 4096


class RepeatScanner:
    """Scans log blocks for events, parsing each distinct message once.

    A flood repeats one message with only its time stamp changing; the events of a message
    seen before come from a bounded cache, so the flood costs a dictionary look-up a line,
    not a parse and new objects. An event from the cache is the first line's (its
    ``line`` is that line's): :class:`~gpuguard.kernel_log.tally.IncidentTally`
    keeps only an incident's first line anyway; ``forget`` after dropping incidents.
    """

    def __init__(self) -> None:
        self._parsed: dict[bytes, tuple[KernelEvent, ...]] = {}

    def events(self, block: bytes) -> list[KernelEvent]:
        """The events of ``block``'s lines, in log order."""
        found: list[KernelEvent] = []
        parsed = self._parsed
        for start, end in _relevant_spans(block):
            line = block[start:end]
            key = line[m.end() :] if (m := _STAMP.match(line)) else line
            events = parsed.get(key)
            found.extend(self._parse(key, line) if events is None else events)
        return found

    def _parse(self, key: bytes, line: bytes) -> tuple[KernelEvent, ...]:
        events = tuple(e for part in split_record(_decoded(line)) if (e := parse_line(part)))
        if len(key) <= _CACHED_CHARS:
            if len(self._parsed) >= _CACHED_LINES:
                self._parsed.clear()
            self._parsed[key] = events
        return events

    def forget(self) -> None:
        self._parsed.clear()


def split_record(line: str) -> Iterable[str]:
    """One ``/dev/kmsg`` record's lines (``\\x0a`` escapes a newline inside a record)."""
    return line.split(KMSG_NEWLINE) if KMSG_NEWLINE in line else (line,)


def scan(log: bytes | str) -> list[KernelEvent]:
    """Every event in a kernel log, in log order."""
    return [event for line in relevant_lines(log) if (event := parse_line(line)) is not None]


def has_kernel_record(log: bytes | str) -> bool:
    """Whether any line of ``log`` starts as a collector writes a kernel record."""
    data = log.encode("utf-8", errors="surrogatepass") if isinstance(log, str) else log
    return _RECORD.search(data) is not None


def classify_log(log: bytes | str, source: str = "kernel-log") -> list[Finding]:
    """Findings for a whole kernel log. A log with neither a line the grammar reads nor a
    kernel record is a :class:`ParseError` (the check's verdict is then Unknown), empty or
    not: garbage is never a healthy kernel."""
    events = scan(log)
    if not events and not has_kernel_record(log):
        unit = "bytes" if isinstance(log, bytes) else "characters"
        raise ParseError(
            f"no kernel log record in {len(log):,} {unit}"
            " (expected dmesg, journalctl -k or /dev/kmsg lines)"
        )
    return findings_for_events(events, source)


class KernelLogCheck:
    """Reads the kernel log (``/dev/kmsg``, ``journalctl -k``, ``dmesg`` or a file)."""

    name: ClassVar[str] = "kernel-log"
    layer: ClassVar[Layer] = Layer.KERNEL

    def run(self, ctx: CheckContext) -> list[Finding]:
        output = ctx.sources.read(Artifact.KERNEL_LOG, ctx.timeout_s)
        try:
            return classify_log(output.text, source=self.name)
        except ParseError as exc:
            raise ParseError(f"{output.origin}: {exc}") from None
