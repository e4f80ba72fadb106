"""The StepFun InfiniteHBD trace (SIGCOMM'25; data/traces/infinitehbd/SOURCE.md) as records.

Its events are ``fault_start`` / ``fault_end`` pairs of one node and one fault type
(``Level``, ``Class``, ``Desc``), times in days. Each ``(Class, Desc)`` maps to the trace
class whose signal is nearest to what the description says the node showed, and, where
the description says what clears it, to that fix. The fleet is the 400 servers the trace
was drawn from (its README), over the span of its events.
"""

from __future__ import annotations

import json
import math

from gpuguard.errors import ConfigError
from gpuguard.sim.faults import Fix, Locus
from gpuguard.sim.trace import Trace, TraceRecord, check_record, finish

M, P, J = Locus.MACHINE, Locus.POSITION, Locus.JOB
SERVERS = 400  # "fault trace data from 400 GPU servers" (the trace's README)

# (Class, Desc) -> (trace class, fix when the description says it, None: the class's
# shares; locus: where the fault lives, docs/simulator.md "Where a fault lives"). A cable or
# a remote optic is the position's: a new server in the slot is plugged into the same one.
# The unattributed records (no signal, the job dies) are booked as the job's: where they
# live is not known, and they end with the job's restart.
MAPPING: dict[tuple[str, str], tuple[str, Fix | None, Locus]] = {
    ("GPU", "GPU DBE(Double Bit ECC) > Threshold"): ("hbm", Fix.REPLACE, M),  # retirement: RMA
    ("GPU", "GPU SBE(Single Bit ECC) > Threshold"): ("hbm", Fix.RESET, M),  # a remap pending
    ("GPU", "GPU xid Error"): ("gpu", None, M),
    ("GPU", "GPU Lost"): ("gpu", None, M),
    ("GPU", "GPU device unknow error"): ("gpu", None, M),  # NVML "Unknown Error": GPU lost
    ("GPU", "GPU device not found"): ("pcie", None, M),  # off the bus
    ("GPU", "GPU Temperature High"): ("thermal", None, M),
    ("GPU", "nvidia-smi Timeout"): ("gsp", None, M),  # the driver stops answering
    # A narrow PCIe link or low P2P bandwidth: the GPU works, slower. The agent's
    # PCIE_WIDTH_DEGRADED reads the width; the simulator emits no width, so only a load
    # test finds these here (conservative for gpuguard).
    ("GPU", "GPU PCI link width low"): ("fail_slow", None, M),
    ("GPU", "GPU P2P Bandwidth Low"): ("fail_slow", None, M),
    ("GPU", "Silent Data Corruption"): ("sdc", None, M),
    ("Parameter Plane Cable", "Link Down"): ("fabric", Fix.SELF, P),  # one node's cable
    ("NIC", "NIC Link Speed low"): ("nic_slow", None, M),
    ("NIC", "NIC PCI link Width low"): ("nic_slow", None, M),
    ("NIC", "NIC Lost"): ("nic", None, M),
    ("NIC", "Rnic Gid Error"): ("nic", None, M),
    ("Power Supply", "Power Supply Failure detected"): ("host", Fix.REPLACE, M),
    ("Power Supply", "Redundancy Lost"): ("host", Fix.REPLACE, M),
    ("Fan", "Speed Critical (Sensor)"): ("host", Fix.REPLACE, M),
    ("Fan", "Redundancy Lost"): ("host", Fix.REPLACE, M),
    ("Motherboard Battery", "Low"): ("host", Fix.REPLACE, M),
    ("Motherboard", "Motherboard Failed"): ("host", Fix.REPLACE, M),
    ("CPU", "Configuration Error"): ("host", Fix.REBOOT, M),
    ("CPU", "Machine Check Exception ( Uncorrectable )"): ("host", Fix.REPLACE, M),
    ("RAID Card", "Bus Correctable error"): ("host", Fix.REPLACE, M),
    ("Riser Card", "RiserCard Fault"): ("host", Fix.REPLACE, M),
    ("Other Failures", "Unknown Error"): ("unattributed", None, J),  # hardware or software
    ("File System", "FS: Multiple Disk FS Error"): ("host", Fix.REBOOT, M),
    ("File System", "FS Readonly"): ("host", Fix.REBOOT, M),
    ("Software Tool", "Kubelet Date Absent"): ("host", Fix.REBOOT, M),  # NotReady
    ("Operating System", "Kernel Panic"): ("host", Fix.REBOOT, M),
    ("Firmware", "Firmware mismatch"): ("host", Fix.REBOOT, M),
    ("Unknown Error", "Unknown Error"): ("unattributed", None, J),
    ("System Crash", "Server down"): ("host", None, M),
    # Found by the operators' stress test: a GPU that fails under load, no signal at rest.
    ("Stress Test Failure", "Unknown Error"): ("fail_slow", None, M),
    ("Change", "Y-cables Taken offline"): ("fabric", Fix.SELF, P),
    ("Change", "Remote Optical Module Failure"): ("fabric", Fix.SELF, P),
    ("Training Task Troubleshooting", "Suspect Machine Offline"): ("unattributed", None, J),
    ("Test", "Temporarily Offline"): ("unattributed", None, J),
}


def parse_infinitehbd(text: str, origin: str) -> Trace:
    try:
        events = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{origin}: not JSON: {exc.msg} (line {exc.lineno})") from None
    if not isinstance(events, list):
        raise ConfigError(f"{origin}: expected a list of events")
    opened: dict[tuple[str, str, str], list[tuple[float, int]]] = {}
    records: list[tuple[int, TraceRecord]] = []
    last = 0.0
    for number, event in enumerate(events, start=1):
        node, time, kind, cls, desc = _fields(event, origin, number)
        last = max(last, time)
        key = (node, cls, desc)
        if kind == "fault_start":
            opened.setdefault(key, []).append((time, number))
            continue
        if not opened.get(key):
            raise ConfigError(
                f"{origin}: record {number}: field event_type: fault_end with no fault_start"
                f" of {cls} / {desc} on node {node}"
            )
        start, first = opened[key].pop(0)
        records.append((first, _record(node, start, time, cls, desc, origin, number)))
    for (node, cls, desc), starts in opened.items():  # still open when the trace ends
        for start, number in starts:
            records.append((number, _record(node, start, math.inf, cls, desc, origin, number)))
    ordered = [record for _, record in sorted(records, key=lambda item: item[0])]
    return finish(origin, ordered, SERVERS, last)


def _record(
    node: str, start: float, end: float, cls: str, desc: str, origin: str, number: int
) -> TraceRecord:
    mapped = MAPPING.get((cls, desc))
    if mapped is None:
        raise ConfigError(
            f"{origin}: record {number}: field fault_type: no mapping for Class {cls!r},"
            f" Desc {desc!r} (sim/trace_infinitehbd.py MAPPING)"
        )
    trace_class, fix, locus = mapped
    record = TraceRecord(node, start, end, trace_class, f"{cls}: {desc}", fix, locus)
    return check_record(record, origin, number)


def _fields(event: object, origin: str, number: int) -> tuple[str, float, str, str, str]:
    where = f"{origin}: record {number}"
    if not isinstance(event, dict):
        raise ConfigError(f"{where}: expected an object")
    for field in ("node_id", "event_time", "event_type", "fault_type"):
        if field not in event:
            raise ConfigError(f"{where}: field {field}: missing")
    node, time, kind, fault = (
        event["node_id"],
        event["event_time"],
        event["event_type"],
        event["fault_type"],
    )
    if not isinstance(node, str) or not node:
        raise ConfigError(f"{where}: field node_id: expected a non-empty string")
    if isinstance(time, bool) or not isinstance(time, int | float) or not math.isfinite(time):
        raise ConfigError(f"{where}: field event_time: expected a number, got {time!r}")
    if kind not in ("fault_start", "fault_end"):
        raise ConfigError(f"{where}: field event_type: {kind!r} (fault_start or fault_end)")
    if not isinstance(fault, dict) or not all(
        isinstance(fault.get(k), str) for k in ("Class", "Desc")
    ):
        raise ConfigError(f"{where}: field fault_type: expected Class and Desc strings")
    return node, float(time), kind, fault["Class"], fault["Desc"]
