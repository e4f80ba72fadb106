"""Kernel log events folded into counted incidents, in memory bounded whatever the log.

A log line is not kept: it is counted in its incident (per code and GPU for an Xid, see
``incidents.key_for``), which keeps its first line as a sample, when it was first and last
seen and how many lines it had. A flood of a million Xid 13 lines is one incident with a
count, not a million lines. At most :data:`MAX_INCIDENTS` are kept; past that the least
recently seen ones that are not critical make room (application faults first), and when
every one is critical the new line is only counted as dropped: the node is unhealthy
anyway, and no fault the driver reports as fatal is ever made to read healthy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gpuguard.kernel_log.findings import incident_findings
from gpuguard.kernel_log.incidents import (
    NAMED_WITHIN,
    Incident,
    IncidentKey,
    key_for,
    sample,
    sxid_details,
)
from gpuguard.kernel_log.messages import KernelEvent
from gpuguard.kernel_log.rules import DRIVER_RULES
from gpuguard.kernel_log.topology import PciTopology
from gpuguard.model import Finding, Severity, gpu

MAX_INCIDENTS = 512
_MAX_NUMBERS = 64  # GPU numbers remembered (a node has at most a few dozen GPUs)
_MAX_LINKS = 256  # network links whose state is remembered
_EVICT_AT_ONCE = 64  # room made in one go, so that a flood of new keys stays cheap
# Kinds whose incident depends on the event alone (a driver message's may borrow its GPU
# from the line before), and to which a repeat adds nothing but a line.
_SAME_KEY_WHEN_REPEATED = frozenset({"xid", "sxid", "efa", "kernel"})


class IncidentTally:
    def __init__(self, limit: int = MAX_INCIDENTS) -> None:
        self._limit = limit
        self._incidents: dict[IncidentKey, Incident] = {}
        self._index = 0  # events seen, for the GPU a driver message borrows
        self._named: tuple[int, str] | None = None  # (index, address) of the last GPU named
        self._numbers: dict[int, str] = {}  # GPU numbers ("GPU6") an Xid tied to an address
        self._links_up: set[str] = set()  # network links last seen up
        self._topology = PciTopology()
        self._last_app: int | None = None  # the latest application Xid's code
        self.dropped = 0
        # The last event and its incident: a repeat of the same event object (a flood,
        # through RepeatScanner's cache) goes to the same incident.
        self._last: tuple[KernelEvent, Incident] | None = None
        self._critical: set[IncidentKey] = set()  # keys known to be critical
        self._saturated = False  # every incident kept is critical

    def __len__(self) -> int:
        return len(self._incidents)

    def add(self, event: KernelEvent, now: float) -> None:
        """Count one event (in log order)."""
        self._index += 1
        if self._last is not None and self._last[0] is event:
            self._last[1].lines += 1  # a flood's next line: already known to the incident
            self._last[1].last_at = now
            return
        self._last = None
        device = event.device
        if event.kind == "gpu_named":
            self._named = (self._index, device)
            return
        if event.gpu_number is not None and device and len(self._numbers) < _MAX_NUMBERS:
            self._numbers[event.gpu_number] = device
        if not device and event.kind in DRIVER_RULES:
            device = self._borrowed_device(event)
        if event.kind == "link" and not self._flapped(device, event.text):
            return
        if self._topology.learn(event):
            return
        if event.kind == "pcie_fatal" and (gpus := self._topology.gpus_at_or_below(device)):
            for below in gpus:  # the GPUs' own fault, as if their driver had said so
                self._count(event, ("driver", "gpu_pcie_fatal", gpu(below)), below, now)
            return
        key = key_for(event, device, self._last_app)
        if key is not None:
            self._count(event, key, device, now)

    def _count(self, event: KernelEvent, key: IncidentKey, device: str, now: float) -> None:
        incident = self._incidents.get(key)
        if incident is None:
            if len(self._incidents) >= self._limit and not self._make_room():
                self.dropped += 1
                return
            incident = self._incidents[key] = Incident(sample(event), device, now, now)
        incident.add(event, now)
        if event.kind in _SAME_KEY_WHEN_REPEATED:
            self._last = (event, incident)
        if key[0] == "app":
            assert isinstance(key[1], int)
            self._last_app = key[1]
            if event.code != key[1] and event.code is not None:
                incident.followers.add(event.code)
        elif key[0] == "sxid":
            sxid_details(event, incident)

    def _flapped(self, link: str, state: str) -> bool:
        """Whether a carrier line is a flap: a link seen up going down. A link comes up
        through "down" when it is opened, which is no flap."""
        if state == "up":
            if len(self._links_up) < _MAX_LINKS:
                self._links_up.add(link)
            return False
        if link not in self._links_up:
            return False
        self._links_up.discard(link)
        return True

    def _borrowed_device(self, event: KernelEvent) -> str:
        """The GPU a driver message that names no address is about: the one its number
        was tied to, else (no number) the GPU named by the line of the same message just
        before it; "" when neither is known."""
        if event.gpu_number is not None:
            return self._numbers.get(event.gpu_number, "")
        if self._named is None:
            return ""
        index, named = self._named
        return named if self._index - index <= NAMED_WITHIN else ""

    def drop(self, unwanted: Callable[[IncidentKey, Incident], bool]) -> bool:
        """Forget the incidents ``unwanted`` names; True when there were any."""
        self._last = None
        gone = [key for key, incident in self._incidents.items() if unwanted(key, incident)]
        for key in gone:
            del self._incidents[key]
            self._critical.discard(key)
        self._saturated = self._saturated and not gone
        if self._last_app is not None and not any(
            k[0] == "app" and k[1] == self._last_app for k in self._incidents
        ):
            self._last_app = None
        return bool(gone)

    def findings(self, source: str) -> list[Finding]:
        return incident_findings(list(self._incidents.items()), source)

    def _make_room(self) -> bool:
        """Forget the least recently seen incidents that are not critical (job faults
        first); False when every one is critical. An incident once critical stays so (a
        key's first line decides, an SXid only ever turns fatal), so that is known until
        one is dropped, and a flood of new keys then costs nothing."""
        self._last = None
        if self._saturated:
            return False

        def rank(item: tuple[IncidentKey, Incident]) -> tuple[bool, float]:
            return item[0][0] != "app", item[1].last_at

        evictable = []
        for key, incident in sorted(self._incidents.items(), key=rank):
            if key in self._critical or self._is_critical(key, incident):
                self._critical.add(key)
            else:
                evictable.append(key)
        for key in evictable[:_EVICT_AT_ONCE]:
            del self._incidents[key]
        self._saturated = not evictable
        return bool(evictable)

    @staticmethod
    def _is_critical(key: IncidentKey, incident: Incident) -> bool:
        found = incident_findings([(key, incident)], "")
        return any(f.severity is Severity.CRITICAL for f in found)


def findings_for_events(events: Iterable[KernelEvent], source: str) -> list[Finding]:
    """One finding per incident of ``events`` (a whole log), in the order they appear."""
    tally = IncidentTally()
    for event in events:
        tally.add(event, 0.0)
    return tally.findings(source)
