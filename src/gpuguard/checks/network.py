"""RDMA network layer: adapter count, port state and rate, and rising error counters.

Reads ``/sys/class/infiniband`` (InfiniBand HCAs and AWS EFA alike), or ``ibstat`` where no
sysfs copy exists. What the findings mean:

- ``NIC_COUNT_MISMATCH`` (critical, REPLACE): fewer RDMA adapters than expected. A
  collective runs at the pace of its slowest rank, so one lost adapter slows the whole job;
  an adapter that vanished from the bus does not come back by itself.
- ``IB_LINK_DOWN`` (critical, REBOOT): a port not ``ACTIVE`` or not ``LinkUp``.
- ``PORT_STATE_UNREADABLE`` (critical, REBOOT): the kernel could not say a port's state
  (sysfs answers the driver's query error), which we never read as good.
- ``IBSTAT_PANIC`` (critical, REBOOT): ibstat could not open an adapter it had listed.
- ``LINK_RATE_DEGRADED``: an active port below the rate it should run at ("present but at
  reduced bandwidth"). Against ``expected_link_gbps`` it is critical (REBOOT renegotiates
  the link); without it, ports slower than the fastest port of the same adapter model and
  link layer are a warning only, since that rule is a guess.
- ``LINK_RATE_UNREADABLE`` (warning): an active port whose rate could not be read.
- ``LINK_FLAPPED`` / ``IB_ERROR_COUNTER_RISING`` / ``EFA_ERROR_COUNTER_RISING`` (warning):
  see :func:`counter_deltas`.

``expected_link_gbps`` applies to the InfiniBand ports when the node has any (its Ethernet
ports are then the front-end network, often slower by design), else to every port (RoCE,
EFA). An Ethernet port next to InfiniBand ones is not a fault by itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import ClassVar

from gpuguard.checks.base import CheckContext
from gpuguard.checks.ibstat import IbPanic, IbstatPorts, parse_ibstat
from gpuguard.checks.network_sysfs import PortRecord, read_infiniband_sysfs
from gpuguard.errors import CheckFailed, NotApplicable, ToolMissing
from gpuguard.model import NODE, Action, Finding, Layer, Severity, nic
from gpuguard.sources import Artifact

__all__ = [
    "NetworkCheck",
    "PortRecord",
    "counter_deltas",
    "evaluate_ports",
    "parse_ibstat",
    "read_infiniband_sysfs",
]

INFINIBAND = "InfiniBand"

# Error counters whose rise between two samples is a finding. Any rise counts (threshold 1):
# the samples are about a second apart, and a healthy link makes no errors in that time.
# Absolute values are not judged: they accumulate over months of uptime (a healthy H100 node
# shows port_rcv_errors 14), so only the delta says something is wrong now.
IB_ERROR_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "port_rcv_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_rcv_remote_physical_errors",
)
LINK_DOWNED = "link_downed"
EFA_ERROR_COUNTERS = (
    "rx_drops",
    "rdma_read_wr_err",
    "rdma_write_wr_err",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
)


def _finding(
    code: str, severity: Severity, action: Action, port: PortRecord, source: str, message: str
) -> Finding:
    evidence = (
        f"state={port.state} phys_state={port.phys_state} rate_gbps={port.rate_gbps}"
        f" link_layer={port.link_layer}"
    )
    if port.notes:
        evidence += "; " + "; ".join(port.notes)
    return Finding(
        Layer.NETWORK,
        code,
        severity,
        action,
        nic(port.device, port.port),
        source,
        message,
        evidence,
    )


def evaluate_ports(
    ports: Sequence[PortRecord],
    expected_nics: int | None,
    expected_link_gbps: float | None,
    source: str,
) -> list[Finding]:
    """Findings for adapter count, port state and port rate of one sample."""
    findings: list[Finding] = []
    devices = sorted({port.device for port in ports})
    if expected_nics is not None and len(devices) < expected_nics:
        findings.append(nic_count_mismatch(expected_nics, devices, source))
    for port in ports:
        if port.state is None or port.phys_state is None:
            message = f"{port.name}: port state could not be read"
            findings.append(
                _finding(
                    "PORT_STATE_UNREADABLE", Severity.CRITICAL, Action.REBOOT, port, source, message
                )
            )
        elif not port.link_up:
            message = f"{port.name}: link down ({port.state}, {port.phys_state})"
            findings.append(
                _finding("IB_LINK_DOWN", Severity.CRITICAL, Action.REBOOT, port, source, message)
            )
    up = [port for port in ports if port.link_up]
    findings.extend(_rate_findings(up, expected_link_gbps, source))
    return findings


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
    up: Sequence[PortRecord], expected_gbps: float | None, source: str
) -> Iterable[Finding]:
    rated: list[tuple[PortRecord, float]] = []
    for port in up:
        if port.rate_gbps is None:
            message = f"{port.name}: link rate could not be read"
            yield _finding(
                "LINK_RATE_UNREADABLE", Severity.WARNING, Action.NONE, port, source, message
            )
        else:
            rated.append((port, port.rate_gbps))
    if expected_gbps is not None:
        # On an InfiniBand node the Ethernet ports are the front end, slower by design.
        fabric = [(p, rate) for p, rate in rated if p.link_layer == INFINIBAND] or rated
        for port, rate in fabric:
            if rate < expected_gbps:
                message = f"{port.name}: {rate:g} Gb/s, expected {expected_gbps:g}"
                yield _finding(
                    "LINK_RATE_DEGRADED", Severity.CRITICAL, Action.REBOOT, port, source, message
                )
        return
    # No expectation: compare each port with its peers (same link layer and adapter model).
    peak: dict[tuple[str | None, str | None], float] = {}
    for port, rate in rated:
        key = (port.link_layer, port.ca_type)
        peak[key] = max(peak.get(key, rate), rate)
    for port, rate in rated:
        best = peak[(port.link_layer, port.ca_type)]
        if rate < best:
            message = f"{port.name}: {rate:g} Gb/s, its peers run at {best:g}"
            yield _finding(
                "LINK_RATE_DEGRADED", Severity.WARNING, Action.NONE, port, source, message
            )


def counter_deltas(
    before: Sequence[PortRecord], after: Sequence[PortRecord], source: str = "sysfs"
) -> list[Finding]:
    """Warnings for error counters that rose between two samples of the same ports.

    A counter that went down was reset (driver reload, ``perfquery -R``): not an error.
    A counter missing or unreadable in either sample is skipped.
    """
    earlier = {(port.device, port.port): port for port in before}
    findings: list[Finding] = []
    for port in after:
        old = earlier.get((port.device, port.port))
        if old is None:
            continue
        checks = (
            ("LINK_FLAPPED", (LINK_DOWNED,), old.counters, port.counters),
            ("IB_ERROR_COUNTER_RISING", IB_ERROR_COUNTERS, old.counters, port.counters),
            ("EFA_ERROR_COUNTER_RISING", EFA_ERROR_COUNTERS, old.hw_counters, port.hw_counters),
        )
        for code, names, then, now in checks:
            rises = _rises(names, then, now)
            if rises:
                message = f"{port.name}: {', '.join(rises)} rising"
                evidence = "; ".join(f"{n} {then[n]} -> {now[n]}" for n in rises)
                findings.append(
                    Finding(
                        Layer.NETWORK,
                        code,
                        Severity.WARNING,
                        Action.NONE,
                        nic(port.device, port.port),
                        source,
                        message,
                        evidence,
                    )
                )
    return findings


def _rises(
    names: Iterable[str], then: dict[str, int | None], now: dict[str, int | None]
) -> list[str]:
    rising = []
    for name in names:
        old, new = then.get(name), now.get(name)
        if old is not None and new is not None and new > old:
            rising.append(name)
    return rising


def panic_finding(panic: IbPanic) -> Finding:
    component = NODE if panic.device is None else nic(panic.device)
    who = panic.device or "an adapter"
    return Finding(
        Layer.NETWORK,
        "IBSTAT_PANIC",
        Severity.CRITICAL,
        Action.REBOOT,
        component,
        "ibstat",
        f"ibstat could not read {who}; its ports are unknown",
        panic.line,
    )


class NetworkCheck:
    """RDMA adapters from sysfs, or from ibstat where sysfs is not available."""

    name: ClassVar[str] = "network"
    layer: ClassVar[Layer] = Layer.NETWORK

    def run(self, ctx: CheckContext) -> list[Finding]:
        expected = ctx.expectations
        root = ctx.sources.infiniband_root()
        ports: list[PortRecord]
        if root.is_dir():
            ports, panic, source = read_infiniband_sysfs(root), None, "sysfs"
        else:
            ibstat = self._read_ibstat(ctx)
            ports, panic, source = ibstat, ibstat.panic, "ibstat"
        findings = [] if panic is None else [panic_finding(panic)]
        if not ports and panic is None:
            if expected.nics:
                return [nic_count_mismatch(expected.nics, [], source)]
            if ctx.sources.live:
                raise NotApplicable(f"no RDMA adapters on this node ({source}), none expected")
            raise ToolMissing("the bundle has neither sysfs/ nor ibstat.txt")
        findings.extend(evaluate_ports(ports, expected.nics, expected.link_gbps, source))
        if source == "sysfs":
            later = self._later_sample(ctx, root)
            if later is not None:
                findings.extend(counter_deltas(ports, later, source))
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
            return None if later_root is None else read_infiniband_sysfs(later_root)
        # Leave at least half of the time budget for reading and judging.
        time.sleep(min(ctx.config.counter_sample_interval_s, ctx.timeout_s / 2))
        return read_infiniband_sysfs(root)
