"""RDMA network layer: which ports form the fabric, and whether those ports are fit for it.

Reads ``/sys/class/infiniband`` (InfiniBand HCAs, RoCE NICs and AWS EFA alike), or
``ibstat`` where no sysfs copy exists. Not every RDMA port there is part of the fabric that
jobs use: a node's front-end Ethernet NICs appear too, often administratively down. So each
port first gets a role (:func:`assign_roles`), and only fabric ports are judged; a port
outside the fabric never gets a finding that asks for an action.

Roles: see :mod:`gpuguard.checks.network.roles`.

What the findings mean (fabric ports only):

- ``NIC_COUNT_MISMATCH`` (critical, REPLACE): fewer RDMA devices than ``expected_nics``. A
  collective runs at the pace of its slowest rank, so one lost adapter slows the whole job;
  an adapter that vanished from the bus does not come back by itself.
- ``FABRIC_PORTS_MISSING`` (critical, REPLACE): fewer fabric ports of a link layer than
  ``network.expected.<layer>.ports``; warning and NONE when ports of that layer are
  administratively ``Disabled``, since no rung enables a port.
- ``IB_LINK_DOWN`` (critical, REBOOT): no physical link (``Polling``: cable, transceiver or
  the peer switch port; link training or error recovery that did not finish). A reboot
  resets the adapter and retrains the link; if the cable is bad the ladder goes on.
- ``IB_PORT_AWAITING_SM`` (critical, NONE): InfiniBand link up, port ``DOWN``/``INIT``/
  ``ARMED``: the subnet manager has not configured or activated it (no SM, or it has not
  swept the port in). The port carries no traffic, so the node takes no new job, but no
  rung configures a port and a lost SM shows on every node at once: it needs a human.
- ``PORT_DISABLED`` (warning, NONE): a fabric port administratively disabled (``ip link
  set down``, ``mlxlink``, or the SM isolating it). No reboot changes an administrative state.
- ``PORT_STATE_UNREADABLE`` (critical, REBOOT): the kernel could not say a port's state
  (sysfs answers the driver's query error), which we never read as good.
- ``IBSTAT_PANIC`` (critical, REBOOT): ibstat could not open an adapter it had listed (info,
  NONE, for a device outside ``network.devices``).
- ``LINK_RATE_DEGRADED``: an active fabric port below the rate it should run at. Against
  an expected rate it is critical (REBOOT renegotiates the link); without one, ports slower
  than the fastest fabric port of the same model and link layer are a warning only.
- ``LINK_RATE_UNREADABLE`` (warning): an active fabric port whose rate could not be read.
- ``LINK_FLAPPED`` / ``IB_ERROR_COUNTER_RISING`` / ``EFA_ERROR_COUNTER_RISING`` (warning):
  see :mod:`~gpuguard.checks.network.counters`; excluded devices are not sampled.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import ClassVar

from gpuguard.checks.base import CheckContext
from gpuguard.checks.network.counters import JUDGED, counter_deltas
from gpuguard.checks.network.ibstat import IbPanic, IbstatPorts, parse_ibstat
from gpuguard.checks.network.roles import (
    EFA,
    ETHERNET,
    INFINIBAND,
    PortRole,
    Role,
    assign_roles,
    in_scope,
    link_layer_of,
)
from gpuguard.checks.network.sysfs import (
    ACTIVE,
    ACTIVE_DEFER,
    ARMED,
    DISABLED,
    DOWN,
    INIT,
    LINK_UP,
    POLLING,
    PortRecord,
    read_infiniband_sysfs,
)
from gpuguard.checks.rules import Rule
from gpuguard.config import LinkLayer, NetworkConfig
from gpuguard.errors import CheckFailed, NotApplicable, ToolMissing
from gpuguard.model import NODE, Action, Finding, Layer, Severity, nic
from gpuguard.sources import Artifact

__all__ = [
    "EFA",
    "ETHERNET",
    "INFINIBAND",
    "NetworkCheck",
    "PortRecord",
    "PortRole",
    "Role",
    "assign_roles",
    "counter_deltas",
    "evaluate_ports",
    "in_scope",
    "link_layer_of",
    "parse_ibstat",
    "read_infiniband_sysfs",
]
NO_NETWORK_CONFIG = NetworkConfig()

# Why a physical state other than LinkUp leaves a fabric port without a link.
_NO_LINK = {
    POLLING: "no link partner: check the cable, the transceiver and the switch port (peer)",
    "PortConfigurationTraining": "link training did not finish: cable, transceiver or peer",
    "LinkErrorRecovery": "link error recovery: a marginal cable or transceiver",
    "Sleep": "the port is asleep",
    "Phy Test": "the port was left in PHY test mode by a diagnostic",
    "PhyTest": "the port was left in PHY test mode by a diagnostic",
}
# Why an InfiniBand port with a physical link is not ACTIVE: the subnet manager's part.
_AWAITING_SM = {
    DOWN: "the logical port is DOWN: no subnet manager has brought it up (check `sminfo`)",
    INIT: "state INIT: no subnet manager has configured the port (no SM on this fabric, or"
    " it has not swept the port in yet; check `sminfo` and the SM's log)",
    ARMED: "state ARMED: the subnet manager configured the port but did not activate it"
    " (its sweep stopped short; check the SM's log)",
}


def _port_finding(rule: Rule, port: PortRecord, source: str, role: PortRole) -> Finding:
    """The finding ``rule`` gives for one port, its reason prefixed by the port's name."""
    evidence = (
        f"state={port.state} phys_state={port.phys_state} rate_gbps={port.rate_gbps}"
        f" link_layer={port.link_layer} role={role.role} ({role.why})"
    )
    if port.notes:
        evidence += "; " + "; ".join(port.notes)
    message = f"{port.name}: {rule.why}"
    return rule.finding(Layer.NETWORK, nic(port.device, port.port), source, message, evidence)


def evaluate_ports(
    ports: Sequence[PortRecord],
    expected_nics: int | None,
    expected_link_gbps: float | None,
    source: str,
    network: NetworkConfig = NO_NETWORK_CONFIG,
) -> list[Finding]:
    """Findings for adapter count, fabric port count, port state and port rate of one sample.

    ``expected_link_gbps`` applies to fabric ports whose link layer has no
    ``network.expected.<layer>.gbps``.
    """
    findings: list[Finding] = []
    devices = sorted({port.device for port in ports if in_scope(port.device, network)})
    if expected_nics is not None and len(devices) < expected_nics:
        findings.append(nic_count_mismatch(expected_nics, devices, source))
    expects = expected_nics is not None or any(e.ports for e in network.expected.values())
    roles = assign_roles(ports, network, expected_link_gbps, fabric_expected=expects)
    fabric = [port for port in ports if roles[port.name].fabric]
    findings.extend(_port_count_findings(ports, fabric, roles, network, source))
    for port in fabric:
        rule = _state_rule(port)
        if rule is not None:
            findings.append(_port_finding(rule, port, source, roles[port.name]))
    up = [port for port in fabric if port.link_up]
    findings.extend(_rate_findings(up, roles, network, expected_link_gbps, source))
    findings.extend(
        _candidate(port, roles[port.name], source)
        for port in ports
        if roles[port.name].role is Role.CANDIDATE
    )
    return findings


def _candidate(port: PortRecord, role: PortRole, source: str) -> Finding:
    """A RoCE port of the fabric's model that may be a broken fabric link or a port that is
    not part of the fabric (unused, or a front end): say so, repair nothing."""
    if port.link_up:
        code, what = "LINK_RATE_DEGRADED", f"{port.rate_gbps:g} Gb/s ({role.why})"
    else:
        why = _NO_LINK.get(port.phys_state or "", f"physical state {port.phys_state}")
        code, what = (
            "IB_LINK_DOWN",
            f"link down ({port.state}): {why}; a lost fabric link or an unused port",
        )
    why = f"{what}: set network.expected.Ethernet.ports (or network.devices) to have it judged"
    return _port_finding(Rule(code, Severity.WARNING, Action.NONE, why), port, source, role)


def _state_rule(port: PortRecord) -> Rule | None:
    """What a fabric port's state calls for; None for an active port."""
    if port.state is None or port.phys_state is None:
        return Rule(
            "PORT_STATE_UNREADABLE", Severity.CRITICAL, Action.REBOOT, "port state unreadable"
        )
    if port.phys_state == DISABLED:
        why = "administratively Disabled; enable it (a reboot does not)"
        return Rule("PORT_DISABLED", Severity.WARNING, Action.NONE, why)
    if port.phys_state != LINK_UP:
        why = _NO_LINK.get(port.phys_state, f"physical state {port.phys_state}")
        return Rule(
            "IB_LINK_DOWN", Severity.CRITICAL, Action.REBOOT, f"link down ({port.state}): {why}"
        )
    if port.state == ACTIVE:
        return None
    if link_layer_of(port) == INFINIBAND and port.state in _AWAITING_SM:
        why = f"physical link up, but {_AWAITING_SM[port.state]}"
        return Rule("IB_PORT_AWAITING_SM", Severity.CRITICAL, Action.NONE, why)
    why = "in link error recovery" if port.state == ACTIVE_DEFER else f"state {port.state}"
    return Rule("IB_LINK_DOWN", Severity.CRITICAL, Action.REBOOT, f"physical link up, but {why}")


def _port_count_findings(
    ports: Sequence[PortRecord],
    fabric: Sequence[PortRecord],
    roles: dict[str, PortRole],
    network: NetworkConfig,
    source: str,
) -> Iterable[Finding]:
    for layer, expected in network.expected.items():
        present = [port.name for port in fabric if link_layer_of(port) == layer]
        if expected.ports is None or len(present) >= expected.ports:
            continue
        disabled = [
            port.name
            for port in ports
            if link_layer_of(port) == layer
            and port.phys_state == DISABLED
            and roles[port.name].role is Role.FRONT_END
        ]
        message = f"{len(present)} {layer} fabric ports, {expected.ports} expected"
        evidence = f"fabric: {', '.join(present) or 'none'}"
        if disabled:
            # A disabled port may be a missing one: only enabling it can tell, no rung can.
            message += f"; administratively Disabled: {', '.join(disabled)}"
            severity, action = Severity.WARNING, Action.NONE
        else:
            severity, action = Severity.CRITICAL, Action.REPLACE
        yield Finding(
            Layer.NETWORK, "FABRIC_PORTS_MISSING", severity, action, NODE, source, message, evidence
        )


def nic_count_mismatch(expected: int, devices: Sequence[str], source: str) -> Finding:
    present = ", ".join(devices) or "none"
    return Finding(
        Layer.NETWORK,
        "NIC_COUNT_MISMATCH",
        Severity.CRITICAL,
        Action.REPLACE,
        NODE,
        source,
        f"{len(devices)} RDMA adapters present, {expected} expected",
        f"present: {present}",
    )


def _rate_findings(
    up: Sequence[PortRecord],
    roles: dict[str, PortRole],
    network: NetworkConfig,
    link_gbps: float | None,
    source: str,
) -> Iterable[Finding]:
    def finding(
        code: str, severity: Severity, action: Action, port: PortRecord, why: str
    ) -> Finding:
        rule = Rule(code, severity, action, why)
        return _port_finding(rule, port, source, roles[port.name])

    rated: list[tuple[PortRecord, float]] = []
    for port in up:
        if port.rate_gbps is None:
            why = "link rate could not be read"
            yield finding("LINK_RATE_UNREADABLE", Severity.WARNING, Action.NONE, port, why)
        else:
            rated.append((port, port.rate_gbps))
    # Without an expected rate, compare each port with its peers (same link layer and model).
    peak: dict[tuple[LinkLayer, str | None], float] = {}
    for port, rate in rated:
        key = (link_layer_of(port), port.ca_type)
        peak[key] = max(peak.get(key, rate), rate)
    for port, rate in rated:
        layer = link_layer_of(port)
        expected = network.expected.get(layer)
        gbps = expected.gbps if expected and expected.gbps is not None else link_gbps
        if gbps is not None:
            if rate < gbps:
                why = f"{rate:g} Gb/s, expected {gbps:g}"
                yield finding("LINK_RATE_DEGRADED", Severity.CRITICAL, Action.REBOOT, port, why)
        elif rate < (best := peak[(layer, port.ca_type)]):
            why = f"{rate:g} Gb/s, its peers run at {best:g}"
            yield finding("LINK_RATE_DEGRADED", Severity.WARNING, Action.NONE, port, why)


def panic_finding(panic: IbPanic, network: NetworkConfig = NO_NETWORK_CONFIG) -> Finding:
    component = NODE if panic.device is None else nic(panic.device)
    who = panic.device or "an adapter"
    message = f"ibstat could not read {who}; its ports are unknown"
    severity, action = Severity.CRITICAL, Action.REBOOT
    if panic.device is not None and not in_scope(panic.device, network):
        message += " (outside network.devices: not judged)"
        severity, action = Severity.INFO, Action.NONE
    return Finding(
        Layer.NETWORK, "IBSTAT_PANIC", severity, action, component, "ibstat", message, panic.line
    )


class NetworkCheck:
    """RDMA adapters from sysfs, or from ibstat where sysfs is not available."""

    name: ClassVar[str] = "network"
    layer: ClassVar[Layer] = Layer.NETWORK

    def __init__(self, wait: Callable[[float], None] = time.sleep) -> None:
        # How the live check waits between its two counter samples.
        self._wait = wait

    def run(self, ctx: CheckContext) -> list[Finding]:
        expected = ctx.expectations
        network = ctx.config.network
        root = ctx.sources.infiniband_root()
        ports: list[PortRecord]
        if root.is_dir():
            ports, panic, source = read_infiniband_sysfs(root, JUDGED), None, "sysfs"
        else:
            ibstat = self._read_ibstat(ctx)
            ports, panic, source = ibstat, ibstat.panic, "ibstat"
        findings = [] if panic is None else [panic_finding(panic, network)]
        if not ports and panic is None:
            wanted = expected.nics or any(e.ports for e in network.expected.values())
            if wanted:
                return evaluate_ports([], expected.nics, expected.link_gbps, source, network)
            where = f"{root} is empty" if root.is_dir() else f"{root} does not exist"
            if ctx.sources.live:
                raise NotApplicable(f"no RDMA adapters on this node ({where}), none expected")
            raise ToolMissing(f"no RDMA sysfs in the bundle ({where}) and no ibstat.txt")
        findings.extend(evaluate_ports(ports, expected.nics, expected.link_gbps, source, network))
        if source == "sysfs":
            later = self._later_sample(ctx, root)
            if later is not None:
                judged = [port for port in later if in_scope(port.device, network)]
                findings.extend(counter_deltas(ports, judged, source))
        return findings

    def _read_ibstat(self, ctx: CheckContext) -> IbstatPorts:
        """ibstat's ports, or none when ibstat is not there."""
        try:
            output = ctx.sources.read(Artifact.IBSTAT, ctx.timeout_s)
        except ToolMissing:
            return IbstatPorts()
        ports = parse_ibstat(output.text)
        # ibstat exits 255 after an ibpanic; any other failure leaves the output suspect.
        if output.exit_code != 0 and ports.panic is None:
            raise CheckFailed(f"{output.origin} exited {output.exit_code}")
        return ports

    def _later_sample(self, ctx: CheckContext, root: Path) -> list[PortRecord] | None:
        if not ctx.sources.live:
            later_root = ctx.sources.infiniband_root_later()
            return None if later_root is None else read_infiniband_sysfs(later_root, JUDGED)
        # Leave at least half of the time budget for reading and judging.
        self._wait(min(ctx.config.counter_sample_interval_s, ctx.timeout_s / 2))
        return read_infiniband_sysfs(root, JUDGED)
