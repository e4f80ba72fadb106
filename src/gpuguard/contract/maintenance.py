"""The codes of the cloud's scheduled maintenance, shared by the check and the policy."""

from __future__ import annotations

MAINTENANCE_EVENT = "MAINTENANCE_EVENT"
MAINTENANCE_RETIREMENT = "MAINTENANCE_RETIREMENT"
MAINTENANCE_NOTICE = "MAINTENANCE_NOTICE"
MAINTENANCE_POLL_FAILED = "MAINTENANCE_POLL_FAILED"

# Work the cloud does on its own schedule: a reboot of ours does not complete it (AWS keeps
# an instance-reboot event open after a user-initiated reboot, and a system-reboot one
# unless the reboot migrated the instance), so no rung past the one the event asks for can.
CLOUD_SCHEDULED = frozenset({MAINTENANCE_EVENT})
