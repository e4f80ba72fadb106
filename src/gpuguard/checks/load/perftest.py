"""Parsers for the bandwidth tables of perftest (``ib_write_bw`` …) and libfabric's
``fi_pingpong``: text in, bandwidth per message size out, ``ParseError`` on anything else."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuguard.errors import ParseError


@dataclass(frozen=True)
class Bandwidth:
    size_bytes: int
    gbps: float  # gigabits per second (10^9)


_PERFTEST_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(MB|Gb)/sec\]\s+BW average\[")
_PERFTEST_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")
_DASHES = re.compile(r"^\s*-{20,}\s*$")


def parse_perftest_bw(text: str) -> list[Bandwidth]:
    """The average bandwidth of each size in a perftest ``*_bw`` report.

    perftest prints MB/sec (10^6 bytes) by default and Gb/sec with ``--report_gbits``; the
    header says which. The table ends at a dashed line, so a report cut short is refused.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _PERFTEST_HEADER.search(line)), None)
    if start is None:
        raise ParseError("perftest output: no '#bytes #iterations BW peak' table header")
    header = _PERFTEST_HEADER.search(lines[start])
    assert header is not None
    to_gbps = 1.0 if header.group(1) == "Gb" else 8 / 1000
    rows: list[Bandwidth] = []
    for line in lines[start + 1 :]:
        if _DASHES.match(line):
            if not rows:
                raise ParseError("perftest output: the result table is empty")
            return rows
        if not line.strip() or line.lstrip().startswith("WARNING"):
            continue
        match = _PERFTEST_ROW.match(line.replace("\t", " "))
        if match is None:
            raise ParseError(f"perftest output: not a result row: {line.strip()[:80]!r}")
        rows.append(Bandwidth(int(match.group(1)), float(match.group(4)) * to_gbps))
    raise ParseError("perftest output: truncated (no line closes the result table)")


_PINGPONG_HEADER = re.compile(r"^\s*bytes\s+#sent\s+#ack\s+total\s+time\s+MB/sec\s+usec/xfer")
_PINGPONG_ROW = re.compile(
    r"^\s*(\d+)([kmg]?)\s+(\d+)\s+=?(\d+)\s+[\d.]+[kmg]?\s+[\d.]+s\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$"
)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_fi_pingpong(text: str) -> list[Bandwidth]:
    """Bandwidth per message size from ``fi_pingpong``'s table (MB/sec is 10^6 bytes/s)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _PINGPONG_HEADER.match(line)), None)
    if start is None:
        raise ParseError("fi_pingpong output: no 'bytes #sent #ack total time MB/sec' header")
    rows: list[Bandwidth] = []
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        match = _PINGPONG_ROW.match(line)
        if match is None:
            raise ParseError(f"fi_pingpong output: not a result row: {line.strip()[:80]!r}")
        size = int(match.group(1)) * _UNITS[match.group(2)]
        rows.append(Bandwidth(size, float(match.group(5)) * 8 / 1000))
    if not rows:
        raise ParseError("fi_pingpong output: the result table is empty")
    return rows
