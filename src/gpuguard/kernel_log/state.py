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
from collections import Counter
from collections.abc import Callable, Iterable

from gpuguard.clock import SYSTEM_CLOCK, Clock
from gpuguard.contract.errors import ContractError
from gpuguard.contract.memory import decode_memory
from gpuguard.kernel_log.check import KernelLogCheck, RepeatScanner, has_kernel_record
from gpuguard.kernel_log.incidents import Incident, IncidentKey
from gpuguard.kernel_log.tally import IncidentTally
from gpuguard.model import Finding, Severity
from gpuguard.model import normalize_pci_bus_id as gpu_id

log = logging.getLogger("gpuguard.agent")
SOURCE = KernelLogCheck.name
REMEMBERED_SOURCE = f"{SOURCE} (remembered across agent restart)"


class KernelState:
    """The log's incidents (counted, never its lines: ``tally``)."""

    def __init__(
        self,
        application_ttl_s: float,
        boot_id: Callable[[], str],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._ttl = application_ttl_s
        self._boot_id = boot_id
        self._clock = clock
        self._lock = threading.Lock()
        self._scanner = RepeatScanner()
        self._tally = IncidentTally()
        self._remembered: tuple[str, list[Finding]] = ("", [])
        self._events_boot = boot_id()
        # Bytes read before the first kernel record (or line the grammar reads): a followed
        # file of garbage is no kernel log, and must not read healthy.
        self.unrecognised_bytes = 0
        self._recognised = False

    def add_block(self, block: bytes, reset: bool) -> Counter[int]:
        """Take new log lines (``block``: complete lines); returns how many lines of each
        Xid code it held.

        ``reset`` says the log started over. Only a new boot clears what was seen: a
        rotated log file does not heal a GPU that fell off the bus.
        """
        boot = self._boot_id() if reset else self._events_boot
        xids: Counter[int] = Counter()
        with self._lock:
            if boot != self._events_boot:
                self._tally = IncidentTally()
                self._scanner.forget()
                self._events_boot = boot
            now = self._clock.monotonic()
            tally = self._tally
            events = self._scanner.events(block)
            for event in events:
                tally.add(event, now)
                if event.kind == "xid" and event.code is not None:
                    xids[event.code] += 1
            if not self._recognised:
                self._recognised = bool(events) or has_kernel_record(block)
                self.unrecognised_bytes = (
                    0 if self._recognised else self.unrecognised_bytes + len(block.strip())
                )
            if tally.dropped:
                log.warning("kernel log: %d line(s) of new incidents dropped", tally.dropped)
                tally.dropped = 0
        return xids

    def add_lines(self, lines: Iterable[str], reset: bool) -> Counter[int]:
        """:meth:`add_block` for lines as text."""
        return self.add_block("\n".join(lines).encode("utf-8", errors="surrogatepass"), reset)

    def findings(self) -> list[Finding]:
        now = self._clock.monotonic()
        with self._lock:
            if self._tally.drop(lambda key, incident: self._expired(key, incident, now)):
                self._scanner.forget()  # its lines would stand for a new incident's
            found = self._tally.findings(SOURCE)
            boot, remembered = self._remembered
        if boot != self._boot_id():
            remembered = []  # a new boot healed what the old one remembered
        seen = {(f.code, f.component) for f in found}
        return found + [f for f in remembered if (f.code, f.component) not in seen]

    def forget_gpus(self, gpus: Iterable[str]) -> None:
        """A reset handled these GPUs' faults: drop their incidents (and remembered findings).
        A driver message is about the GPU named on the line before it, when its own names
        none: the whole message goes."""
        names = {gpu_id(g) for g in gpus}
        with self._lock:
            if self._tally.drop(lambda _, incident: gpu_id(incident.device) in names):
                self._scanner.forget()
            boot, remembered = self._remembered
            kept = [
                f for f in remembered if not (f.component.kind == "gpu" and f.component.id in names)
            ]
            self._remembered = (boot, kept)

    def remember(self, boot_id: str, findings: Iterable[Finding]) -> None:
        """Findings stored before an agent restart; they count while the boot is the same."""
        with self._lock:
            self._remembered = (boot_id, list(findings))

    def _expired(self, key: IncidentKey, incident: Incident, now: float) -> bool:
        """An application fault or a link flap (an event, not a state: the port's own check
        says whether the link is up now) ages out a time to live after its last line."""
        return key[0] in ("app", "link") and now - incident.last_at > self._ttl


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
