"""What the followed kernel log currently says, as findings.

Hardware findings hold until the node boots again: an Xid 79 does not heal by being old,
nor by the log file being rotated. Application faults (a crashing job's Xid 13) fall out
after a time to live: the job died with them. Findings remembered from before an agent
restart (stored on the Node, same boot) count too, so a restart never turns a known-bad
node healthy just because the ring buffer no longer holds the line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from gpuguard.checks.kernel_log.check import KernelLogCheck, scan
from gpuguard.checks.kernel_log.incidents import devices_named, findings_for_events
from gpuguard.checks.kernel_log.messages import KernelEvent
from gpuguard.checks.xid_catalog import rule_for
from gpuguard.contract.errors import ContractError
from gpuguard.contract.memory import decode_memory
from gpuguard.model import Finding, Severity
from gpuguard.model import normalize_pci_bus_id as gpu_id

log = logging.getLogger("gpuguard.agent")
SOURCE = KernelLogCheck.name
REMEMBERED_SOURCE = f"{SOURCE} (remembered across agent restart)"


class KernelState:
    def __init__(
        self,
        application_ttl_s: float,
        boot_id: Callable[[], str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl = application_ttl_s
        self._boot_id = boot_id
        self._clock = clock
        self._lock = threading.Lock()
        self._events: list[tuple[float, KernelEvent]] = []
        self._remembered: tuple[str, list[Finding]] = ("", [])
        self._events_boot = boot_id()

    def add_lines(self, lines: Iterable[str], reset: bool) -> list[KernelEvent]:
        """Take new log lines; returns the events found in them.

        ``reset`` says the log started over. Only a new boot clears what was seen: a
        rotated log file does not heal a GPU that fell off the bus.
        """
        now = self._clock()
        events = scan("\n".join(lines))
        boot = self._boot_id() if reset else self._events_boot
        with self._lock:
            if boot != self._events_boot:
                self._events.clear()
                self._events_boot = boot
            self._events.extend((now, event) for event in events)
        return events

    def findings(self) -> list[Finding]:
        now = self._clock()
        with self._lock:
            self._events = [(t, e) for t, e in self._events if not self._expired(t, e, now)]
            events = [e for _, e in self._events]
            boot, remembered = self._remembered
        if boot != self._boot_id():
            remembered = []  # a new boot healed what the old one remembered
        found = findings_for_events(events, SOURCE)
        seen = {(f.code, f.component) for f in found}
        return found + [f for f in remembered if (f.code, f.component) not in seen]

    def forget_gpus(self, gpus: Iterable[str]) -> None:
        """A reset handled these GPUs' faults: drop their events (and remembered findings)."""
        names = {gpu_id(g) for g in gpus}
        with self._lock:
            about = devices_named([e for _, e in self._events])
            self._events = [
                (t, e)
                for (t, e), device in zip(self._events, about, strict=True)
                if gpu_id(device) not in names
            ]
            boot, remembered = self._remembered
            kept = [
                f for f in remembered if not (f.component.kind == "gpu" and f.component.id in names)
            ]
            self._remembered = (boot, kept)

    def remember(self, boot_id: str, findings: Iterable[Finding]) -> None:
        """Findings stored before an agent restart; they count while the boot is the same."""
        with self._lock:
            self._remembered = (boot_id, list(findings))

    def _expired(self, received: float, event: KernelEvent, now: float) -> bool:
        application = event.kind == "xid" and rule_for(event.code or -1).application
        return application and now - received > self._ttl


def recall(text: str, node: str) -> tuple[str, list[Finding]]:
    """The boot id and findings stored on the Node; none when there are none, and none
    (said in the log) when the annotation cannot be read."""
    if not text:
        return "", []
    try:
        return decode_memory(text, f"Node/{node}", REMEMBERED_SOURCE)
    except ContractError as exc:
        log.warning("ignoring the kernel memory: %s", exc)
        return "", []


def lasting(findings: Iterable[Finding]) -> list[Finding]:
    """The findings worth remembering across an agent restart: critical hardware ones."""
    sources = (SOURCE, REMEMBERED_SOURCE)
    return [f for f in findings if f.severity is Severity.CRITICAL and f.source in sources]
