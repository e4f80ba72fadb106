"""Error counters of RDMA ports that rose between two samples: a link erring now, told
apart from the errors a healthy link gathers over months of uptime."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuguard.checks.network.sysfs import CounterNames, PortRecord
from gpuguard.model import Action, Finding, Layer, Severity, nic

# Error counters whose rise between two samples is a finding. Every rise counts (threshold 1):
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

# The counters the check reads: the ones judged here, no other.
JUDGED = CounterNames(
    port=frozenset((*IB_ERROR_COUNTERS, LINK_DOWNED)),
    port_hw=frozenset(EFA_ERROR_COUNTERS),
    device_hw=frozenset(),
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
