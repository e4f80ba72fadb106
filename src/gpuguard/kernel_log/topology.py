"""Which GPUs sit below which PCIe bridge, as the boot's own enumeration lines say.

A bridge that reports a fatal error is reporting its link downstream, and the kernel's
recovery touches every device below it (drivers/pci/pcie/err.c). The kernel log names
the NVIDIA GPUs it enumerates ("pci 0000:9b:00.0: [10de:2330] type 00 class 0x030200")
and each bridge's bus range ("pci 0000:97:01.0: PCI bridge to [bus 98-9c]"), so a bridge's
report can be tied to the GPUs on its buses. Both tables are bounded.
"""

from __future__ import annotations

from gpuguard.kernel_log.messages import KernelEvent
from gpuguard.model import normalize_pci_bus_id

MAX_GPUS = 64
MAX_BRIDGES = 1024


class PciTopology:
    def __init__(self) -> None:
        self._gpus: set[str] = set()
        self._bridges: dict[str, tuple[str, int, int]] = {}  # bridge -> (domain, buses)

    def learn(self, event: KernelEvent) -> bool:
        """Take in an enumeration line; False for any other event."""
        if event.kind == "pci_gpu":
            if len(self._gpus) < MAX_GPUS:
                self._gpus.add(normalize_pci_bus_id(event.device))
            return True
        if event.kind == "pci_bridge":
            first, last = (int(bus, 16) for bus in event.text.split("-"))
            bridge = normalize_pci_bus_id(event.device)
            if len(self._bridges) < MAX_BRIDGES or bridge in self._bridges:
                self._bridges[bridge] = (bridge[:4], first, last)
            return True
        return False

    def gpus_at_or_below(self, device: str) -> list[str]:
        """The known GPUs that are ``device`` or on a bus below it, in bus order."""
        where = normalize_pci_bus_id(device)
        if where in self._gpus:
            return [where]
        if where not in self._bridges:
            return []
        domain, first, last = self._bridges[where]
        return sorted(g for g in self._gpus if g[:4] == domain and first <= int(g[5:7], 16) <= last)
