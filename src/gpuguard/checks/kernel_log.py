"""Kernel log scanning: Xid, SXid, fallen-off-bus, EFA driver and kernel faults.

The kernel log is the layer that still works when DCGM, NVML and nvidia-smi do not, so it
is always read. Scanning is two-step for speed: one regular expression finds the few lines
worth parsing (a node's boot log is mostly other drivers' chatter), then each such line is
parsed whatever the collector's prefix (``dmesg``, ``dmesg -T``, ISO, ``--decode``,
journald, raw ``/dev/kmsg``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from gpuguard.checks.base import CheckContext
from gpuguard.checks.kernel_incidents import findings_for_events
from gpuguard.model import Finding, Layer
from gpuguard.sources import Artifact

# Lines containing none of these are never parsed further. Plain substrings, searched
# one at a time with str.find: far faster in CPython than one regex alternation.
MARKERS = (
    "NVRM: ",
    "SXid (",
    "infiniband ",
    "efa ",
    "BUG",  # "BUG: soft lockup", "kernel BUG at", "BUG: unable to handle"
    "blocked for more than",
    "Oops: ",
    "Hardware Error",
)

_BDF = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
_XID = re.compile(
    rf"NVRM: Xid \((?:PCI:)?(?P<bdf>{_BDF})(?: GPU-I:(?P<gi>\d+))?\): "
    r"(?P<code>\d+),?\s*(?P<text>.*)"
)
_SXID = re.compile(
    rf"(?P<switch>nvidia-nvswitch\d+): SXid \((?:PCI:)?(?P<bdf>{_BDF}(?:\.[0-7])?)\): "
    r"(?P<code>\d+),?\s*(?P<text>.*)"
)
_FALLEN = re.compile(
    rf"NVRM: (?:The NVIDIA )?GPU (?:at )?(?:PCI:)?(?P<bdf>{_BDF}(?:\.[0-7])?)\b.*fallen off the bus"
)
_PROCESS = re.compile(r"pid='?(?P<pid><unknown>|\d+)'?, name=(?P<name>[^,]*),\s*")
_CAUSED_BY = re.compile(r"caused by previous Xid (?P<code>\d+)")
# EFA's driver logs as "efa <pci>:" or through the RDMA core as "infiniband <ibdev>:".
_EFA = re.compile(
    rf"(?:infiniband (?P<ibdev>(?:rdmap\w+|efa_\d+))|efa (?P<pci>{_BDF}\.[0-7])): (?P<text>.*)"
)
_KERNEL = re.compile(
    r"(?P<kind>soft lockup|blocked for more than \d+ seconds|kernel BUG at|BUG: unable to handle"
    r"|Oops: |Hardware Error|NVRM: API mismatch|RmInitAdapter failed)"
)


@dataclass(frozen=True)
class KernelEvent:
    """One relevant kernel log line, parsed.

    ``kind`` is ``xid``, ``sxid``, ``fallen_off_bus``, ``efa`` or ``kernel``; ``device`` is
    the PCI bus id (GPU, NVSwitch, EFA) or RDMA device name; ``code`` the Xid/SXid number.
    """

    kind: str
    line: str
    device: str = ""
    code: int | None = None
    text: str = ""
    pid: str | None = None
    process: str | None = None
    caused_by: int | None = None
    gpu_instance: int | None = None


def relevant_lines(text: str) -> Iterator[str]:
    """The lines of ``text`` that contain a marker, each once, in log order."""
    starts: set[int] = set()
    for marker in MARKERS:
        position = text.find(marker)
        while position >= 0:
            line_start = text.rfind("\n", 0, position) + 1
            starts.add(line_start)
            line_end = text.find("\n", position)
            if line_end < 0:
                break
            position = text.find(marker, line_end)
    for start in sorted(starts):
        end = text.find("\n", start)
        yield text[start : end if end >= 0 else len(text)].rstrip("\r")


def parse_line(line: str) -> KernelEvent | None:
    """The event a kernel log line records, or None if it records nothing we act on."""
    if (m := _XID.search(line)) is not None:
        text = m["text"]
        pid = process = None
        if (p := _PROCESS.match(text)) is not None:
            pid = None if p["pid"] == "<unknown>" else p["pid"]
            process = None if p["name"] in ("<unknown>", "") else p["name"]
            text = text[p.end() :]
        caused = _CAUSED_BY.search(text)
        return KernelEvent(
            kind="xid",
            line=line,
            device=m["bdf"],
            code=int(m["code"]),
            text=text,
            pid=pid,
            process=process,
            caused_by=int(caused["code"]) if caused else None,
            gpu_instance=int(m["gi"]) if m["gi"] else None,
        )
    if (m := _SXID.search(line)) is not None:
        return KernelEvent("sxid", line, m["bdf"], int(m["code"]), m["text"], process=m["switch"])
    if (m := _FALLEN.search(line)) is not None:
        return KernelEvent("fallen_off_bus", line, m["bdf"])
    if (m := _EFA.search(line)) is not None:
        return KernelEvent("efa", line, m["ibdev"] or m["pci"], text=m["text"])
    if (m := _KERNEL.search(line)) is not None:
        return KernelEvent("kernel", line, text=m["kind"])
    return None


def scan(text: str) -> list[KernelEvent]:
    """Every event in a kernel log, in log order."""
    return [event for line in relevant_lines(text) if (event := parse_line(line)) is not None]


def classify_log(text: str, source: str = "kernel-log") -> list[Finding]:
    """Findings for a whole kernel log."""
    return findings_for_events(scan(text), source)


class KernelLogCheck:
    """Reads the kernel log (``/dev/kmsg``, ``journalctl -k``, ``dmesg`` or a file)."""

    name: ClassVar[str] = "kernel-log"
    layer: ClassVar[Layer] = Layer.KERNEL

    def run(self, ctx: CheckContext) -> list[Finding]:
        output = ctx.sources.read(Artifact.KERNEL_LOG, ctx.timeout_s)
        return classify_log(output.text, source=self.name)
