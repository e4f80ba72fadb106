"""Kernel log events grouped into incidents: one incident per fault, not per line.

A crashing job prints hundreds of Xid 13 lines on every GPU it used; that is one
application incident. A hardware Xid is one incident per GPU and code; Xid 43/45 join the
Xid they follow. ``findings`` says what each incident means.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import lru_cache

from gpuguard.checks.xid_catalog import reset_marks, rule_for
from gpuguard.kernel_log.messages import KernelEvent
from gpuguard.kernel_log.rules import DRIVER_RULES, EFA_RULES, kernel_rule
from gpuguard.model import NODE, Component, Layer, gpu

_SXID_LINK = re.compile(r",\s*(Link \d+[^,]*)")
# "Fatal, Link 48 ...", or the follow-on "Severity 1 Engine instance ..." line, whose number
# is NVSWITCH_ERROR_SEVERITY_TYPE (0 non-fatal, 1 fatal; error_nvswitch.c).
_SXID_FATAL = re.compile(r"Fatal\b|Severity 1 Engine instance")

# Xids that only ever follow another one in the same incident.
_FOLLOWERS = frozenset({43, 45})

# How many events back the line naming the GPU may stand from the line of the same
# message that says what happened to it (other CPUs' lines can come between).
NAMED_WITHIN = 3
# A stored incident keeps its first line as a sample, at most this long (a kernel record
# is under 1 KiB), and at most this many process names and NVLink names.
SAMPLE_CHARS = 1024
MAX_NAMES = 8

# An incident's key: what it is about. ("app", code, device) for an application Xid (one
# finding per code over every GPU), ("xid", code, device, caused_by) for a hardware Xid,
# ("driver", kind, component) for the driver's other messages, ("sxid", code, switch),
# ("efa", code, device), ("kernel", code), ("link", network link) for a flap and
# ("pcie", device) for a fatal PCIe error no known GPU is below.
IncidentKey = tuple[object, ...]


@dataclass
class Incident:
    """Every line of one incident, counted: its first line, when it was first and last
    seen, how many lines, and what its lines named (bounded)."""

    first: KernelEvent
    device: str  # the device it is about (a driver message's borrowed from the line before)
    first_at: float
    last_at: float
    lines: int = 0
    processes: list[str] = field(default_factory=list)
    more_processes: bool = False
    followers: set[int] = field(default_factory=set)
    fatal: KernelEvent | None = None  # SXid: its first fatal line
    links: set[str] = field(default_factory=set)  # SXid: the NVLinks its lines name

    def add(self, event: KernelEvent, now: float) -> None:
        self.lines += 1
        self.last_at = now
        who = _process_label(event)
        if who and who not in self.processes:
            if len(self.processes) < MAX_NAMES:
                self.processes.append(who)
            else:
                self.more_processes = True


def sample(event: KernelEvent) -> KernelEvent:
    """``event`` with its line and text cut to :data:`SAMPLE_CHARS`, to be kept."""
    if len(event.line) <= SAMPLE_CHARS and len(event.text) <= SAMPLE_CHARS:
        return event
    return replace(event, line=event.line[:SAMPLE_CHARS], text=event.text[:SAMPLE_CHARS])


def key_for(event: KernelEvent, device: str, last_app: int | None) -> IncidentKey | None:
    """The incident a line belongs to (``device``: the one it is about; ``last_app``: the
    latest application Xid's code, which Xid 43/45 lines follow); None: no incident."""
    kind = event.kind
    if kind == "xid":
        code = event.code if event.code is not None else -1
        if code in _FOLLOWERS and event.caused_by is None and last_app is not None:
            return ("app", last_app, device)
        if code == 45 and event.caused_by is not None:
            return ("xid", code, device, event.caused_by)
        # A line on which the driver marks the GPU for a reset is the GPU's, not the job's.
        if is_application(code) and reset_marks(event.text) == (False, False):
            return ("app", code, device)
        return ("xid", code, device, None)
    if kind in DRIVER_RULES:
        layer = DRIVER_RULES[kind][0]
        return ("driver", kind, gpu_or_node(device) if layer is Layer.GPU else NODE)
    if kind == "sxid":
        return ("sxid", event.code, device)
    if kind == "efa":
        rule = next((r for r in EFA_RULES if event.text.startswith(r[0])), None)
        return None if rule is None else ("efa", rule[1], device)
    if kind == "kernel":
        return ("kernel", kernel_rule(event)[1])
    if kind == "link":
        return ("link", device)
    if kind == "pcie_fatal":
        return ("pcie", device)
    return None


@lru_cache(maxsize=1024)
def is_application(code: int) -> bool:
    return rule_for(code).application


def sxid_details(event: KernelEvent, incident: Incident) -> None:
    """What an SXid line adds to its incident: whether it is fatal, the link it names."""
    if incident.fatal is None and _SXID_FATAL.match(event.text):
        incident.fatal = sample(event)
    # "Fatal, Link 48 LTSSM Fault Up": the part after the first comma names the link.
    if (m := _SXID_LINK.search(event.text)) is not None and len(incident.links) < 4 * MAX_NAMES:
        incident.links.add(m[1][:64])


def gpu_or_node(device: str) -> Component:
    """The GPU a line names, or the node when it names none we could read."""
    return gpu(device) if device else NODE


def _process_label(event: KernelEvent) -> str:
    if event.process and event.pid:
        return f"{event.process} (pid {event.pid})"
    return event.process or (f"pid {event.pid}" if event.pid else "")
