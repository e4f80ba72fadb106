"""Azure Scheduled Events acknowledged once the node is drained.

The controller asks for a reboot only after cordoning and draining the node, so that is
when the agent approves the pending Azure events (``StartRequests``): Azure then reboots
or redeploys the VM at once instead of at the event's deadline. A failed approval is
logged and never blocks the reboot.
"""

from __future__ import annotations

import logging

from gpuguard.agent.repair import RepairBackend
from gpuguard.checks.maintenance.check import PollFailed, acknowledge_azure
from gpuguard.errors import ParseError
from gpuguard.maintenance_config import MaintenanceConfig

LOG = logging.getLogger(__name__)


class AzureAcknowledgingRepair:
    """A repair backend that approves Azure's pending events before each reboot."""

    def __init__(self, inner: RepairBackend, settings: MaintenanceConfig) -> None:
        self.inner = inner
        self.settings = settings

    def reset_gpus(self, gpus: tuple[str, ...]) -> tuple[bool, str]:
        return self.inner.reset_gpus(gpus)

    def reboot(self) -> tuple[bool, str]:
        try:
            acknowledged = acknowledge_azure(self.settings, self.settings.timeout_s)
        except (PollFailed, ParseError) as exc:
            LOG.warning("maintenance: could not acknowledge Azure events: %s", exc)
        else:
            if acknowledged:
                LOG.info("maintenance: acknowledged Azure events %s", ", ".join(acknowledged))
        return self.inner.reboot()


def with_maintenance_ack(backend: RepairBackend, settings: MaintenanceConfig) -> RepairBackend:
    """The backend, approving Azure events before reboots when Azure is configured."""
    if settings.provider != "azure":
        return backend
    return AzureAcknowledgingRepair(backend, settings)
