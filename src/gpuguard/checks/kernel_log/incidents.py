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

from gpuguard.checks.kernel_log.messages import KernelEvent
from gpuguard.checks.xid_catalog import rule_for, xid_finding
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
    # A GPU this driver does not support is unusable, and no repair changes that.
    "gpu_unsupported": (Layer.GPU, "GPU_UNSUPPORTED_BY_DRIVER", Severity.CRITICAL, Action.NONE),
    "driver_mismatch": (Layer.KERNEL, "NVIDIA_DRIVER_MISMATCH", Severity.CRITICAL, Action.REBOOT),
}
# Driver messages that repeat what an Xid of the same GPU already said.
SAME_AS_XID = {"GPU_FALLEN_OFF_BUS": 79, "GSP_RPC_ERRORS": 119}
_DRIVER_MESSAGES = {
    "GPU_FALLEN_OFF_BUS": "{who} has fallen off the PCIe bus and no longer answers its driver",
    "GPU_INIT_FAILED": "the driver could not initialise {who}",
    "GPU_POWER_NOT_CONNECTED": "{who} does not have its power cables connected",
    "GSP_RPC_ERRORS": "{who} keeps timing out its GSP firmware calls; the driver asks for a reset",
    "NVLINK_TRAINING_FAILED": "NVLink discovery of {who} with a peer failed: its links stay down",
    "GPU_UNSUPPORTED_BY_DRIVER": "{who} is not supported by the installed driver",
    "NVIDIA_DRIVER_MISMATCH": "the NVIDIA kernel module and its user-space libraries differ",
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


@dataclass
class _Group:
    """Lines that make up one incident."""

    first: KernelEvent
    lines: int = 0
    devices: list[str] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)
    followers: set[int] = field(default_factory=set)

    def add(self, event: KernelEvent) -> None:
        self.lines += 1
        if event.device not in self.devices:
            self.devices.append(event.device)
        who = _process_label(event)
        if who and who not in self.processes:
            self.processes.append(who)


def findings_for_events(events: Sequence[KernelEvent], source: str) -> list[Finding]:
    """One finding per incident, in the order incidents first appear."""
    findings: list[Finding] = []
    findings += _xid_findings([e for e in events if e.kind == "xid"], source)
    findings += _driver_findings(events, source)
    findings += _sxid_findings([e for e in events if e.kind == "sxid"], source)
    findings += _efa_findings([e for e in events if e.kind == "efa"], source)
    findings += _kernel_findings([e for e in events if e.kind == "kernel"], source)
    return findings


def _xid_findings(events: list[KernelEvent], source: str) -> list[Finding]:
    app_groups: dict[int, _Group] = {}
    hw_groups: dict[tuple[int, str], _Group] = {}
    last_app: _Group | None = None
    seen = {(e.code, e.device) for e in events}
    for event in events:
        code = event.code if event.code is not None else -1
        if code in _FOLLOWERS and event.caused_by is None and last_app is not None:
            last_app.followers.add(code)
            last_app.add(event)
            continue
        if code == 45 and event.caused_by is not None:
            if (event.caused_by, event.device) in seen:
                continue  # the Xid it names is in this log and speaks for itself
            key = (code, event.device)
            hw_groups.setdefault(key, _Group(event)).add(event)
            continue
        if rule_for(code).application:
            group = app_groups.setdefault(code, _Group(event))
            group.add(event)
            last_app = group
        else:
            hw_groups.setdefault((code, event.device), _Group(event)).add(event)
    findings = [_app_incident(code, group, source) for code, group in app_groups.items()]
    findings += [_hardware_xid(group, source) for group in hw_groups.values()]
    return findings


def _app_incident(code: int, group: _Group, source: str) -> Finding:
    base = xid_finding(
        code, gpu_or_node(group.first.device), source, group.first.line, group.first.text
    )
    parts = [f"Xid {code} ({rule_for(code).description}): one application incident"]
    parts.append(
        f"{group.lines} line(s) on {len(group.devices)} GPU(s) "
        + ", ".join(gpu_or_node(d).id for d in group.devices)
    )
    if group.followers:
        parts.append("followed by Xid " + "/".join(str(c) for c in sorted(group.followers)))
    if group.processes:
        parts.append("process " + ", ".join(group.processes))
    return Finding(
        layer=base.layer,
        code=base.code,
        severity=base.severity,
        # An application fault never asks for more than killing the job.
        action=min(base.action, Action.KILL_JOB),
        component=base.component,
        source=source,
        message="; ".join(parts),
        evidence=group.first.line,
    )


def _hardware_xid(group: _Group, source: str) -> Finding:
    event = group.first
    code = event.code if event.code is not None else -1
    component = gpu_or_node(event.device)
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
    if group.lines > 1:
        finding = replace(finding, message=f"{finding.message} ({group.lines} lines)")
    return finding


def _driver_findings(events: Sequence[KernelEvent], source: str) -> list[Finding]:
    """Findings for the driver's other messages, one per kind and component.

    A message that names no GPU on its own line borrows the GPU from the line of the same
    message just before it; one that names none at all is about the node: a GPU that fell
    off the bus is a fault whether or not we can tell which one.
    """
    xids = {(e.code, gpu(e.device).id) for e in events if e.kind == "xid"}
    findings: dict[tuple[str, Component], Finding] = {}
    for event, device in zip(events, devices_named(events), strict=True):
        rule = DRIVER_RULES.get(event.kind)
        if rule is None:
            continue
        layer, code, severity, action = rule
        component = gpu_or_node(device) if layer is Layer.GPU else NODE
        if (SAME_AS_XID.get(code), component.id) in xids:
            continue  # the Xid of the same GPU speaks for it
        key = (code, component)
        if key not in findings:
            findings[key] = Finding(
                layer,
                code,
                severity,
                action,
                component,
                source,
                _driver_message(code, component, device),
                event.line,
            )
    return list(findings.values())


def devices_named(events: Sequence[KernelEvent]) -> list[str]:
    """The device each event is about: its own, or for a driver message whose line names
    none, the GPU the line of the same message just before it named ("" when neither)."""
    devices: list[str] = []
    named: tuple[int, str] | None = None  # (index, address) of the last line naming a GPU
    for index, event in enumerate(events):
        device = event.device
        if event.kind == "gpu_named":
            named = (index, device)
        elif not device and event.kind in DRIVER_RULES and named is not None:
            device = named[1] if index - named[0] <= _NAMED_WITHIN else ""
        devices.append(device)
    return devices


def _driver_message(code: str, component: Component, device: str) -> str:
    who = component.id if device else "a GPU the message does not name"
    return _DRIVER_MESSAGES[code].format(who=who)


def _sxid_findings(events: list[KernelEvent], source: str) -> list[Finding]:
    groups: dict[tuple[int | None, str], list[KernelEvent]] = {}
    for event in events:
        groups.setdefault((event.code, event.device), []).append(event)
    findings = []
    for (code, device), lines in groups.items():
        fatal = any(_SXID_FATAL.match(e.text) for e in lines)
        # "Fatal, Link 48 LTSSM Fault Up": the part after the first comma names the link.
        links = sorted({m[1] for e in lines if (m := _SXID_LINK.search(e.text))})
        component = Component("nvswitch", gpu(device).id)
        findings.append(
            Finding(
                layer=Layer.GPU,
                code=f"SXID_{code}",
                # A fatal NVSwitch error takes the fabric down for every GPU: the node must
                # restart (fabric manager included); non-fatal ones are worth watching.
                severity=Severity.CRITICAL if fatal else Severity.WARNING,
                action=Action.REBOOT if fatal else Action.NONE,
                component=component,
                source=source,
                message=(
                    f"NVSwitch SXid {code} on {lines[0].process or 'a switch'} ({component.id}), "
                    f"{'fatal' if fatal else 'non-fatal'}"
                    + (f": {', '.join(links)}" if links else "")
                ),
                evidence=next((e.line for e in lines if _SXID_FATAL.match(e.text)), lines[0].line),
            )
        )
    return findings


def _efa_findings(events: list[KernelEvent], source: str) -> list[Finding]:
    findings: dict[tuple[str, str], Finding] = {}
    for event in events:
        for prefix, code, severity, action in EFA_RULES:
            if event.text.startswith(prefix):
                key = (code, event.device)
                if key not in findings:
                    findings[key] = Finding(
                        layer=Layer.NETWORK,
                        code=code,
                        severity=severity,
                        action=action,
                        component=nic(event.device),
                        source=source,
                        message=f"EFA device {event.device}: {event.text}",
                        evidence=event.line,
                    )
                break
    return list(findings.values())


def _kernel_findings(events: list[KernelEvent], source: str) -> list[Finding]:
    findings: dict[str, Finding] = {}
    for event in events:
        rule = next((r for kind, r in KERNEL_RULES.items() if event.text.startswith(kind)), None)
        if rule is None:
            rule = MACHINE_CHECK_FATAL if machine_check_is_fatal(event.line) else MACHINE_CHECK
        layer, code, severity, action = rule
        if code not in findings:
            findings[code] = Finding(
                layer,
                code,
                severity,
                action,
                NODE,
                source,
                f"kernel reported: {event.text}",
                event.line,
            )
    return list(findings.values())


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


def gpu_or_node(device: str) -> Component:
    """The GPU a line names, or the node when it names none we could read."""
    return gpu(device) if device else NODE


def _process_label(event: KernelEvent) -> str:
    if event.process and event.pid:
        return f"{event.process} (pid {event.pid})"
    return event.process or (f"pid {event.pid}" if event.pid else "")
