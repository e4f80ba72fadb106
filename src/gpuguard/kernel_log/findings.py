"""One finding per kernel log incident: what it is about, how bad, which repair.

A fault whose line names no GPU we can read is about the node; a driver message that
repeats an Xid of the same GPU leaves the Xid to speak for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpuguard.checks.xid_catalog import rule_for, xid_finding
from gpuguard.kernel_log.incidents import MAX_NAMES, Incident, IncidentKey, gpu_or_node
from gpuguard.kernel_log.messages import KernelEvent
from gpuguard.kernel_log.rules import (
    DRIVER_MESSAGES,
    DRIVER_RULES,
    EFA_RULES,
    SAME_AS_XID,
    kernel_rule,
)
from gpuguard.model import NODE, Action, Component, Finding, Layer, Severity, gpu, nic


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
    message = DRIVER_MESSAGES[code].format(who=who)
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


def _kernel_finding(incident: Incident, source: str) -> Finding:
    event = incident.first
    layer, code, severity, action = kernel_rule(event)
    message = f"kernel reported: {event.text}"
    return Finding(layer, code, severity, action, NODE, source, message, event.line)
