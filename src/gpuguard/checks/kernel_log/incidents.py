"""Turning kernel log events into findings: one finding per incident, not per line.

A crashing job prints hundreds of Xid 13 lines on every GPU it used; that is one
application incident that recommends at most killing the job. A hardware Xid gives one
finding per GPU and code. Xid 45 follows the Xid it names; "fallen off the bus" without an
Xid 79 still counts, and so does a fault whose line names no GPU we can read: it is then
about the node.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

from gpuguard.checks.kernel_log.messages import KernelEvent
from gpuguard.checks.xid_catalog import reset_marks, rule_for, xid_finding
from gpuguard.model import (
    NODE,
    Action,
    Component,
    Finding,
    Layer,
    Severity,
    gpu,
    nic,
)

_SXID_LINK = re.compile(r",\s*(Link \d+[^,]*)")
# "Fatal, Link 48 ...", or the follow-on "Severity 1 Engine instance ..." line, whose number
# is NVSWITCH_ERROR_SEVERITY_TYPE (0 non-fatal, 1 fatal; error_nvswitch.c).
_SXID_FATAL = re.compile(r"Fatal\b|Severity 1 Engine instance")

# Xids that only ever follow another one in the same incident.
_FOLLOWERS = frozenset({43, 45})

# EFA driver messages (as matched text prefix) -> (code, severity, action).
# The admin-queue failures mean the device no longer answers its driver: only a new
# machine fixes that on EC2. A failed single command is worth a warning.
EFA_RULES: tuple[tuple[str, str, Severity, Action], ...] = (
    (
        "Wait for completion (polling) timeout",
        "EFA_ADMIN_TIMEOUT",
        Severity.CRITICAL,
        Action.REPLACE,
    ),
    (
        "The device didn't send any completion",
        "EFA_ADMIN_TIMEOUT",
        Severity.CRITICAL,
        Action.REPLACE,
    ),
    ("Admin queue is closed", "EFA_ADMIN_QUEUE_CLOSED", Severity.CRITICAL, Action.REPLACE),
    ("Reset indication didn't turn", "EFA_RESET_FAILED", Severity.CRITICAL, Action.REPLACE),
    ("Device isn't ready", "EFA_DEVICE_NOT_READY", Severity.CRITICAL, Action.REPLACE),
    ("Failed to process command", "EFA_COMMAND_FAILED", Severity.WARNING, Action.NONE),
    ("Failed to submit command", "EFA_COMMAND_FAILED", Severity.WARNING, Action.NONE),
)

# Kernel-level faults (matched words) -> (layer, code, severity, action).
KERNEL_RULES: dict[str, tuple[Layer, str, Severity, Action]] = {
    "soft lockup": (Layer.KERNEL, "KERNEL_SOFT_LOCKUP", Severity.WARNING, Action.NONE),
    "blocked for more than": (Layer.KERNEL, "KERNEL_HUNG_TASK", Severity.WARNING, Action.NONE),
    "kernel BUG at": (Layer.KERNEL, "KERNEL_BUG", Severity.CRITICAL, Action.REBOOT),
    "BUG: unable to handle": (Layer.KERNEL, "KERNEL_BUG", Severity.CRITICAL, Action.REBOOT),
    "BUG: kernel NULL pointer": (Layer.KERNEL, "KERNEL_BUG", Severity.CRITICAL, Action.REBOOT),
    "Oops: ": (Layer.KERNEL, "KERNEL_OOPS", Severity.CRITICAL, Action.REBOOT),
    # The die header of a trap in kernel code (before 6.x kernels printed it without Oops:).
    **{
        trap: (Layer.KERNEL, "KERNEL_OOPS", Severity.CRITICAL, Action.REBOOT)
        for trap in (
            "general protection fault",
            "divide error",
            "invalid opcode",
            "stack segment",
            "double fault",
        )
    },
    "Kernel panic - not syncing": (Layer.KERNEL, "KERNEL_PANIC", Severity.CRITICAL, Action.REBOOT),
}
# A hardware error the firmware (CPER/GHES "event severity"), the CPU (an MCA bank status
# with its UC bit) or EDAC reports as not corrected: the machine's state is suspect and
# only a restart clears it. A corrected one is worth a warning.
MACHINE_CHECK = (Layer.KERNEL, "MACHINE_CHECK", Severity.WARNING, Action.NONE)
MACHINE_CHECK_FATAL = (Layer.KERNEL, "MACHINE_CHECK_FATAL", Severity.CRITICAL, Action.REBOOT)
# A BERT record (the firmware's, of the previous boot) of a fatal or recoverable error: that
# boot ended in it and the reboot already happened, so no repair is due, but the machine
# is not healthy on its word either: held out of service until a person decides.
MACHINE_CHECK_PREVIOUS_BOOT = (
    Layer.KERNEL,
    "MACHINE_CHECK_PREVIOUS_BOOT_FATAL",
    Severity.CRITICAL,
    Action.NONE,
)
# Driver messages that are not Xids (kernel_messages.DRIVER_MESSAGES' kinds).
DRIVER_RULES: dict[str, tuple[Layer, str, Severity, Action]] = {
    "fallen_off_bus": (Layer.GPU, "GPU_FALLEN_OFF_BUS", Severity.CRITICAL, Action.REBOOT),
    # The driver could not bring the GPU up: only a new boot (a cold GPU) retries it.
    "gpu_init_failed": (Layer.GPU, "GPU_INIT_FAILED", Severity.CRITICAL, Action.REBOOT),
    # A cable, as Xid 54 (CHECK_MECHANICALS): software cannot repair it.
    "gpu_power_cables": (Layer.GPU, "GPU_POWER_NOT_CONNECTED", Severity.CRITICAL, Action.REPLACE),
    # As Xid 136 (link training failed, NVIDIA: RESET_GPU); the ladder goes on if it stays.
    "nvlink_training_failed": (
        Layer.GPU,
        "NVLINK_TRAINING_FAILED",
        Severity.CRITICAL,
        Action.RESET_GPU,
    ),
    # The driver says so itself: "The GPU likely needs to be reset", "GPU marked for reset".
    "gsp_rpc_errors": (Layer.GPU, "GSP_RPC_ERRORS", Severity.CRITICAL, Action.RESET_GPU),
    # As Xid 119 (a GSP RPC timeout, NVIDIA: RESET_GPU): its firmware stopped answering.
    "gsp_unresponsive": (Layer.GPU, "GSP_UNRESPONSIVE", Severity.CRITICAL, Action.RESET_GPU),
    # A GPU this driver does not support is unusable, and no repair changes that.
    "gpu_unsupported": (Layer.GPU, "GPU_UNSUPPORTED_BY_DRIVER", Severity.CRITICAL, Action.NONE),
    "driver_mismatch": (Layer.KERNEL, "NVIDIA_DRIVER_MISMATCH", Severity.CRITICAL, Action.REBOOT),
    # The GPU's PCIe link failed beyond what the link corrects: it falls off the bus (Xid
    # 79, which speaks for it when present); a reset of the GPU needs a working link.
    "gpu_pcie_fatal": (Layer.GPU, "GPU_PCIE_FATAL", Severity.CRITICAL, Action.REBOOT),
}
# Driver messages that repeat what an Xid of the same GPU already said.
SAME_AS_XID = {
    "GPU_FALLEN_OFF_BUS": 79,
    "GSP_RPC_ERRORS": 119,
    "GSP_UNRESPONSIVE": 119,
    "GPU_PCIE_FATAL": 79,
}
_DRIVER_MESSAGES = {
    "GPU_FALLEN_OFF_BUS": "{who} has fallen off the PCIe bus and no longer answers its driver",
    "GPU_INIT_FAILED": "the driver could not initialise {who}",
    "GPU_POWER_NOT_CONNECTED": "{who} does not have its power cables connected",
    "GSP_RPC_ERRORS": "{who} keeps timing out its GSP firmware calls; the driver asks for a reset",
    "GSP_UNRESPONSIVE": "the GSP firmware of {who} stopped answering (heartbeat or RPC timeout)",
    "NVLINK_TRAINING_FAILED": "NVLink discovery of {who} with a peer failed: its links stay down",
    "GPU_UNSUPPORTED_BY_DRIVER": "{who} is not supported by the installed driver",
    "NVIDIA_DRIVER_MISMATCH": "the NVIDIA kernel module and its user-space libraries differ",
    "GPU_PCIE_FATAL": "an uncorrectable fatal PCIe error (AER) on {who} or the link above it",
}
# How many events back the line naming the GPU may stand from the line of the same
# message that says what happened to it (other CPUs' lines can come between).
_NAMED_WITHIN = 3
# Machine-check severity words: CPER/GHES, the x86 MCE handler's own, EDAC's CE/UE.
_CPER_SEVERITY = re.compile(r"(?P<seq>\{\d+\})?\[Hardware Error\]: event severity: (?P<word>\w+)")
_MCA_STATUS = re.compile(r"Bank \d+: (?P<status>[0-9a-fA-F]{16})\b")
_MCA_UNCORRECTED = 1 << 61  # IA32_MCi_STATUS.UC (Intel SDM vol. 3B, 16.3.2.2)
# "Machine Check Exception": the CPU raised #MC, which it does only for an error it could
# not correct (corrected ones are only polled or signalled by CMCI).
_FATAL_WORDS = re.compile(
    r"Machine Check Exception|Processor context corrupt"
    r"|EDAC \S+: (?:\d+ )?UE |EDAC \S+: Uncorrected"
)


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
        if _application(code) and reset_marks(event.text) == (False, False):
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
        return ("kernel", _kernel_rule(event)[1])
    if kind == "link":
        return ("link", device)
    if kind == "pcie_fatal":
        return ("pcie", device)
    return None


@lru_cache(maxsize=1024)
def _application(code: int) -> bool:
    return rule_for(code).application


def incident_findings(
    incidents: Sequence[tuple[IncidentKey, Incident]], source: str
) -> list[Finding]:
    """One finding per incident (application Xids: per code), in the order incidents first
    appeared: Xids, the driver's other messages, SXids, EFA, the kernel's own."""
    by_kind: dict[object, list[tuple[IncidentKey, Incident]]] = {}
    for key, incident in incidents:
        by_kind.setdefault(key[0], []).append((key, incident))
    xids = {(key[1], gpu(i.device).id) for key, i in incidents if key[0] in ("app", "xid")}
    app: dict[int, list[Incident]] = {}
    for key, incident in by_kind.get("app", []):
        assert isinstance(key[1], int)
        app.setdefault(key[1], []).append(incident)
    findings = [_app_incident(code, group, source) for code, group in app.items()]
    for key, incident in by_kind.get("xid", []):
        cause = key[3]
        if cause is not None and (cause, gpu(incident.device).id) in xids:
            continue  # the Xid it names is in this log and speaks for itself
        findings.append(_hardware_xid(incident, source))
    for key, incident in by_kind.get("driver", []):
        finding = _driver_finding(str(key[1]), incident, source)
        if (SAME_AS_XID.get(finding.code), finding.component.id) not in xids:
            findings.append(finding)  # else the Xid of the same GPU speaks for it
    findings += [_sxid_finding(i, source) for _, i in by_kind.get("sxid", [])]
    findings += [_efa_finding(str(key[1]), i, source) for key, i in by_kind.get("efa", [])]
    findings += [_kernel_finding(i, source) for _, i in by_kind.get("kernel", [])]
    findings += [_link_finding(i, source) for _, i in by_kind.get("link", [])]
    findings += [_pcie_finding(i, source) for _, i in by_kind.get("pcie", [])]
    return findings


def _app_incident(code: int, group: list[Incident], source: str) -> Finding:
    first = group[0].first
    base = xid_finding(code, gpu_or_node(group[0].device), source, first.line, first.text)
    parts = [f"Xid {code} ({rule_for(code).description}): one application incident"]
    parts.append(
        f"{sum(i.lines for i in group)} line(s) on {len(group)} GPU(s) "
        + ", ".join(gpu_or_node(i.device).id for i in group)
    )
    followers = set().union(*(i.followers for i in group))
    if followers:
        parts.append("followed by Xid " + "/".join(str(c) for c in sorted(followers)))
    processes = list(dict.fromkeys(p for i in group for p in i.processes))
    if processes:
        more = len(processes) > MAX_NAMES or any(i.more_processes for i in group)
        parts.append("process " + ", ".join(processes[:MAX_NAMES]) + (" and more" if more else ""))
    return Finding(
        layer=base.layer,
        code=base.code,
        severity=base.severity,
        # An application fault never asks for more than killing the job.
        action=min(base.action, Action.KILL_JOB),
        component=base.component,
        source=source,
        message="; ".join(parts),
        evidence=first.line,
    )


def _hardware_xid(incident: Incident, source: str) -> Finding:
    event = incident.first
    code = event.code if event.code is not None else -1
    component = gpu_or_node(incident.device)
    if code == 45 and event.caused_by is not None:
        followed = xid_finding(event.caused_by, component, source, event.line)
        return Finding(
            layer=Layer.GPU,
            code="XID_45",
            severity=followed.severity,
            action=followed.action,
            component=component,
            source=source,
            message=(
                f"Xid 45 on {component.id} caused by Xid {event.caused_by}, whose own line is "
                f"not in this log: acting as for Xid {event.caused_by}"
            ),
            evidence=event.line,
        )
    finding = xid_finding(code, component, source, event.line, event.text)
    if incident.lines > 1:
        finding = replace(finding, message=f"{finding.message} ({incident.lines} lines)")
    return finding


def _driver_finding(kind: str, incident: Incident, source: str) -> Finding:
    """A driver message that names no GPU on its own line borrows the GPU from the line of
    the same message just before it; one that names none at all is about the node: a GPU
    that fell off the bus is a fault whether or not we can tell which one."""
    layer, code, severity, action = DRIVER_RULES[kind]
    component = gpu_or_node(incident.device) if layer is Layer.GPU else NODE
    who = component.id if incident.device else _unnamed(incident.first)
    message = _DRIVER_MESSAGES[code].format(who=who)
    return Finding(layer, code, severity, action, component, source, message, incident.first.line)


def _unnamed(event: KernelEvent) -> str:
    if event.gpu_number is None:
        return "a GPU the message does not name"
    n = event.gpu_number
    return f"GPU{n} (the driver's own number; no line of this log ties it to an address)"


def _sxid_finding(incident: Incident, source: str) -> Finding:
    first, fatal = incident.first, incident.fatal is not None
    links = sorted(incident.links)
    component = Component("nvswitch", gpu(incident.device).id)
    return Finding(
        layer=Layer.GPU,
        code=f"SXID_{first.code}",
        # A fatal NVSwitch error takes the fabric down for every GPU: the node must
        # restart (fabric manager included); non-fatal ones are worth watching.
        severity=Severity.CRITICAL if fatal else Severity.WARNING,
        action=Action.REBOOT if fatal else Action.NONE,
        component=component,
        source=source,
        message=(
            f"NVSwitch SXid {first.code} on {first.process or 'a switch'} ({component.id}), "
            f"{'fatal' if fatal else 'non-fatal'}" + (f": {', '.join(links)}" if links else "")
        ),
        evidence=(incident.fatal or first).line,
    )


def sxid_details(event: KernelEvent, incident: Incident) -> None:
    """What an SXid line adds to its incident: whether it is fatal, the link it names."""
    if incident.fatal is None and _SXID_FATAL.match(event.text):
        incident.fatal = sample(event)
    # "Fatal, Link 48 LTSSM Fault Up": the part after the first comma names the link.
    if (m := _SXID_LINK.search(event.text)) is not None and len(incident.links) < 4 * MAX_NAMES:
        incident.links.add(m[1][:64])


def _efa_finding(code: str, incident: Incident, source: str) -> Finding:
    _, _, severity, action = next(r for r in EFA_RULES if r[1] == code)
    event = incident.first
    return Finding(
        layer=Layer.NETWORK,
        code=code,
        severity=severity,
        action=action,
        component=nic(incident.device),
        source=source,
        message=f"EFA device {incident.device}: {event.text}",
        evidence=event.line,
    )


def _link_finding(incident: Incident, source: str) -> Finding:
    """A network link that went down after being up, as the network stack logged it: a
    cable, optic or switch port fault lives where the link is, so this only warns, as the
    port's own link_downed counter does (checks.network)."""
    message = (
        f"{incident.device}: the link went down {incident.lines} time(s) after being up "
        "(the network driver's log)"
    )
    return Finding(
        Layer.NETWORK,
        "LINK_FLAPPED",
        Severity.WARNING,
        Action.NONE,
        nic(incident.device),
        source,
        message,
        incident.first.line,
    )


def _pcie_finding(incident: Incident, source: str) -> Finding:
    """A fatal PCIe error on a device or bridge no known GPU sits at or below: the machine's
    hardware failed, but what is behind the port is not in the log (its boot lines may have
    left the ring buffer), so the node is held out of service and a person decides."""
    message = (
        f"PCIe device {incident.device} reported an uncorrectable fatal error (AER); no GPU "
        "this log enumerated is at or below it"
    )
    return Finding(
        Layer.KERNEL,
        "PCIE_FATAL",
        Severity.CRITICAL,
        Action.NONE,
        NODE,
        source,
        message,
        incident.first.line,
    )


def _kernel_rule(event: KernelEvent) -> tuple[Layer, str, Severity, Action]:
    rule = next((r for kind, r in KERNEL_RULES.items() if event.text.startswith(kind)), None)
    if rule is None:
        if machine_check_is_fatal(event.line):
            rule = MACHINE_CHECK_FATAL
        elif previous_boot_was_fatal(event.line):
            rule = MACHINE_CHECK_PREVIOUS_BOOT
        else:
            rule = MACHINE_CHECK
    return rule


def _kernel_finding(incident: Incident, source: str) -> Finding:
    event = incident.first
    layer, code, severity, action = _kernel_rule(event)
    message = f"kernel reported: {event.text}"
    return Finding(layer, code, severity, action, NODE, source, message, event.line)


def machine_check_is_fatal(text: str) -> bool:
    """Whether a hardware error report says the error was not corrected."""
    if _FATAL_WORDS.search(text) is not None:
        return True
    if (m := _CPER_SEVERITY.search(text)) is not None:
        # A record of this boot comes through GHES, numbered "{N}[Hardware Error]: ...";
        # BERT prints the firmware's records of the previous boot without the number: the
        # reboot that followed that error already happened.
        return m["seq"] is not None and m["word"].lower() in ("fatal", "recoverable")
    status = _MCA_STATUS.search(text)
    return status is not None and bool(int(status["status"], 16) & _MCA_UNCORRECTED)


def previous_boot_was_fatal(text: str) -> bool:
    """Whether a BERT record (no ``{N}``: drivers/acpi/apei/bert.c prints the previous
    boot's records with a bare "[Hardware Error]: ") says that boot's error was fatal or
    recoverable (not corrected)."""
    m = _CPER_SEVERITY.search(text)
    return m is not None and m["seq"] is None and m["word"].lower() in ("fatal", "recoverable")


def gpu_or_node(device: str) -> Component:
    """The GPU a line names, or the node when it names none we could read."""
    return gpu(device) if device else NODE


def _process_label(event: KernelEvent) -> str:
    if event.process and event.pid:
        return f"{event.process} (pid {event.pid})"
    return event.process or (f"pid {event.pid}" if event.pid else "")
