"""Replaying a recorded fault trace instead of drawing faults from rates.

A trace is a list of records: the node a fault hit, when it started and ended (days from
the trace's start), its class (one of ``TRACE_CLASSES``: what the simulator emits for it)
and the recorded description. The file format is CSV with the header
``node,start_days,end_days,class,description`` and optional columns ``fix``
(``restart``, ``reset``, ``reboot``, ``replace``, ``self``; empty: drawn from the
scenario's shares for the class) and ``locus`` (``machine``, ``position``, ``domain``,
``job``: where the fault lives; empty: the class's, ``default_locus``); ``# nodes: N``
and ``# days: D`` lines before the header give the fleet's size and the span (otherwise
the scenario's). ``infinitehbd`` names the
bundled StepFun trace (``trace_infinitehbd``). Errors name the file, the record and the
field.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpuguard.errors import ConfigError
from gpuguard.sim.fault_stream import fault_from_record
from gpuguard.sim.faults import DAY, LOCI, Fault, Fix, Locus, Signal
from gpuguard.sim.scenario import Scenario

# Trace class -> (simulator fault class, the signal when the class's own draw would not
# give it). Each emits what docs/simulator.md's class table says.
TRACE_CLASSES: dict[str, tuple[str, Signal | None]] = {
    "gpu": ("gpu", None),  # Xid 79 + NVML GPU lost
    "nvlink": ("nvlink", None),  # Xid 74 + a link down
    "pcie": ("pcie", None),  # fallen off the bus, no Xid
    "hbm": ("hbm", None),  # Xid 48 + a row-remap flag (pending or failed, by the fix)
    "sram": ("sram", None),  # Xid 95
    "gsp": ("gsp", None),  # Xid 119, the GPU hangs
    "application": ("application", None),  # Xid 13 from the job
    "kernel_driver": ("kernel_driver", None),  # kernel BUG line
    "nccl_hang": ("nccl_hang", None),
    "host": ("host", None),  # the node NotReady
    "nic": ("nic", Signal.PORT_DOWN),
    "nic_slow": ("nic", Signal.RATE_DROP),  # a port at half its rate
    "fabric": ("fabric", None),  # a port down on this node only, until the record's end
    "thermal": ("thermal", None),
    "sdc": ("sdc", None),
    "fail_slow": ("fail_slow", None),  # a slow GPU, no signal: only a load test finds it
    "unattributed": ("unattributed", None),  # the job dies, nothing shows on the node
}
FIELDS = ("node", "start_days", "end_days", "class", "description")
OPTIONAL = ("fix", "locus")


@dataclass(frozen=True)
class TraceRecord:
    node: str
    start_days: float
    end_days: float
    cls: str
    description: str
    fix: Fix | None = None
    locus: Locus | None = None  # None: the class's (``default_locus``)


def default_locus(trace_class: str) -> Locus:
    """Where a trace class's faults live when the record does not say. A trace's
    ``fabric`` record is one node's link (a cable, an optic), so a position; the rest as
    the simulator's class (``faults.LOCI``)."""
    if trace_class == "fabric":
        return Locus.POSITION
    return LOCI[TRACE_CLASSES[trace_class][0]]


@dataclass(frozen=True)
class Trace:
    name: str
    records: tuple[TraceRecord, ...]
    nodes: int  # the fleet's size (nodes with no fault included)
    days: float

    def node_index(self) -> dict[str, int]:
        """Slots by node, in order of each node's first fault."""
        index: dict[str, int] = {}
        for record in self.records:
            index.setdefault(record.node, len(index))
        return index

    def recorded_availability(self) -> float:
        """The share of node-time not inside a recorded fault (overlaps counted once)."""
        spans: dict[str, list[tuple[float, float]]] = {}
        for r in self.records:
            spans.setdefault(r.node, []).append((r.start_days, min(r.end_days, self.days)))
        down = 0.0
        for intervals in spans.values():
            intervals.sort()
            start, end = intervals[0]
            for low, high in intervals[1:]:
                if low > end:
                    down += end - start
                    start, end = low, high
                else:
                    end = max(end, high)
            down += end - start
        return 1.0 - down / (self.nodes * self.days)

    def faults(self, scenario: Scenario, rng: np.random.Generator) -> list[Fault]:
        slots = self.node_index()
        faults: list[Fault] = []
        for record in sorted(self.records, key=lambda r: (r.start_days, slots[r.node])):
            cls, signal = TRACE_CLASSES[record.cls]
            faults.append(
                fault_from_record(
                    len(faults),
                    slots[record.node],
                    cls,
                    record.start_days * DAY,
                    record.end_days * DAY,
                    scenario,
                    rng,
                    fix=record.fix,
                    signal=signal,
                    locus=record.locus if record.locus is not None else default_locus(record.cls),
                )
            )
        return faults


def parse_csv(text: str, origin: str) -> Trace:
    meta: dict[str, float] = {}
    lines = text.splitlines()
    while lines and lines[0].startswith("#"):
        key, _, value = lines.pop(0).lstrip("# ").partition(":")
        if key.strip() not in ("nodes", "days"):
            raise ConfigError(f"{origin}: unknown header line {key.strip()!r} (nodes, days)")
        meta[key.strip()] = _number(value.strip(), origin, "header", key.strip())
    reader = csv.reader(io.StringIO("\n".join(lines)))
    header = next(reader, None)
    if header is None or tuple(h.strip() for h in header[:5]) != FIELDS:
        raise ConfigError(f"{origin}: the header must be {','.join(FIELDS)}[,fix[,locus]]")
    records = []
    for number, row in enumerate(reader, start=1):
        if not row:
            continue
        if not 5 <= len(row) <= 7:
            raise ConfigError(f"{origin}: record {number}: {len(row)} fields, expected 5 to 7")
        node, start, end, cls, description = (cell.strip() for cell in row[:5])
        fix, locus = (row[i].strip() if len(row) > i else "" for i in (5, 6))
        records.append(
            check_record(
                TraceRecord(
                    node,
                    _number(start, origin, number, "start_days"),
                    _number(end, origin, number, "end_days"),
                    cls,
                    description,
                    _fix(fix, origin, number),
                    _locus(locus, origin, number),
                ),
                origin,
                number,
            )
        )
    return finish(origin, records, meta.get("nodes"), meta.get("days"))


def check_record(record: TraceRecord, origin: str, number: int) -> TraceRecord:
    where = f"{origin}: record {number}"
    if not record.node:
        raise ConfigError(f"{where}: field node: empty")
    if record.cls not in TRACE_CLASSES:
        raise ConfigError(
            f"{where}: field class: {record.cls!r} is not one of {', '.join(TRACE_CLASSES)}"
        )
    if record.start_days < 0:
        raise ConfigError(f"{where}: field start_days: {record.start_days:g} is before 0")
    if record.end_days < record.start_days:
        raise ConfigError(
            f"{where}: field end_days: {record.end_days:g} is before start_days"
            f" {record.start_days:g}"
        )
    return record


def finish(
    origin: str, records: list[TraceRecord], nodes: float | None, days: float | None
) -> Trace:
    if not records:
        raise ConfigError(f"{origin}: no fault records")
    named = len({r.node for r in records})
    fleet = int(nodes) if nodes is not None else named
    if fleet < named:
        raise ConfigError(f"{origin}: header nodes {fleet} but {named} nodes have faults")
    span = days if days is not None else math.ceil(max(r.end_days for r in records))
    if span <= 0:
        raise ConfigError(f"{origin}: header days must be positive")
    return Trace(Path(origin).stem, tuple(records), fleet, float(span))


def _number(text: str, origin: str, number: int | str, field: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        where = f"record {number}" if isinstance(number, int) else number
        raise ConfigError(f"{origin}: {where}: field {field}: {text!r} is not a number")
    return value


def _fix(text: str, origin: str, number: int) -> Fix | None:
    if not text:
        return None
    try:
        return Fix[text.upper()]
    except KeyError:
        names = ", ".join(str(f) for f in Fix)
        raise ConfigError(
            f"{origin}: record {number}: field fix: {text!r} is not one of {names}"
        ) from None


def _locus(text: str, origin: str, number: int) -> Locus | None:
    if not text:
        return None
    try:
        return Locus(text.lower())
    except ValueError:
        names = ", ".join(str(locus) for locus in Locus)
        raise ConfigError(
            f"{origin}: record {number}: field locus: {text!r} is not one of {names}"
        ) from None
