"""The ``maintenance`` check: polls the cloud's metadata service for scheduled events.

An event that starts inside ``maintenance.window_s`` becomes a critical finding on the
kernel (host) layer whose action drains the node: REBOOT for a reboot or maintenance,
REPLACE for a retirement, stop, termination, redeploy or eviction. A metadata service that
is slow, down or answers garbage is not a node fault: the poll's failure is an INFO
finding (``MAINTENANCE_POLL_FAILED``, logged), never an exception, because the runner
would fail closed on one and quarantine the node. Drains already confirmed stay while the
service is unreachable. A far event is trusted only on its second consecutive sighting.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import ClassVar

from gpuguard.checks.base import CheckContext
from gpuguard.checks.maintenance.events import (
    MaintenanceEvent,
    parse_aws,
    parse_azure,
    parse_gce,
)
from gpuguard.clock import SYSTEM_CLOCK
from gpuguard.contract.maintenance import (
    MAINTENANCE_EVENT,
    MAINTENANCE_NOTICE,
    MAINTENANCE_POLL_FAILED,
    MAINTENANCE_RETIREMENT,
)
from gpuguard.errors import ParseError
from gpuguard.maintenance_config import MaintenanceConfig
from gpuguard.model import NODE, Action, Finding, Layer, Severity

LOG = logging.getLogger(__name__)
MAX_DOCUMENT_BYTES = 256 * 1024
AWS_TOKEN_TTL_S = "21600"


class PollFailed(Exception):
    """The metadata service gave no usable answer (slow, down, refused, too big)."""


class MaintenanceCheck:
    """Scheduled events of this instance; keeps the sightings between polls."""

    name: ClassVar[str] = "maintenance"
    layer: ClassVar[Layer] = Layer.KERNEL

    def __init__(self, now: Callable[[], datetime.datetime] | None = None) -> None:
        self._now = now or (lambda: datetime.datetime.now(datetime.UTC))
        self._sightings: dict[str, int] = {}
        self._confirmed: list[Finding] = []
        self._lock = threading.Lock()

    def run(self, ctx: CheckContext) -> list[Finding]:
        settings = ctx.config.maintenance
        if settings.provider is None:
            return []
        # Well inside the runner's limit: its timeout would read as a node fault.
        budget = min(settings.timeout_s, ctx.timeout_s / 3)
        try:
            events = poll(settings, budget)
        except (PollFailed, ParseError) as exc:
            LOG.warning("maintenance: %s metadata poll failed: %s", settings.provider, exc)
            with self._lock:
                return [_poll_failed(settings.provider, str(exc)), *self._confirmed]
        with self._lock:
            return self._judge(events, settings)

    def _judge(self, events: list[MaintenanceEvent], settings: MaintenanceConfig) -> list[Finding]:
        now = self._now()
        self._sightings = {e.event_id: self._sightings.get(e.event_id, 0) + 1 for e in events}
        findings, confirmed = [], []
        for event in events:
            lead = None if event.starts is None else (event.starts - now).total_seconds()
            in_window = lead is None or lead <= settings.window_s
            near = lead is None or lead <= 2 * settings.interval_s
            sure = near or self._sightings[event.event_id] >= 2
            if event.action is not Action.NONE and in_window and sure:
                confirmed.append(_drain(event, lead))
            else:
                findings.append(_notice(event, lead, in_window))
        self._confirmed = confirmed
        return confirmed + findings


def poll(settings: MaintenanceConfig, budget_s: float) -> list[MaintenanceEvent]:
    """The provider's events now; raises PollFailed or ParseError, nothing else."""
    base = settings.base_url
    if settings.provider == "aws":
        token = _fetch(
            f"{base}/latest/api/token",
            {"X-aws-ec2-metadata-token-ttl-seconds": AWS_TOKEN_TTL_S},
            budget_s,
            method="PUT",
        )
        headers = {"X-aws-ec2-metadata-token": token.strip()}
        return parse_aws(
            _fetch(f"{base}/latest/meta-data/events/maintenance/scheduled", headers, budget_s)
        )
    if settings.provider == "gcp":
        url = f"{base}/computeMetadata/v1/instance/maintenance-event"
        return parse_gce(_fetch(url, {"Metadata-Flavor": "Google"}, budget_s))
    url = f"{base}/metadata/scheduledevents?api-version=2020-07-01"
    return parse_azure(_fetch(url, {"Metadata": "true"}, budget_s))[1]


def acknowledge_azure(settings: MaintenanceConfig, budget_s: float) -> list[str]:
    """Approve every pending Azure event that needs a drain (the node is drained): Azure
    then starts it at once. Returns the EventIds; raises PollFailed or ParseError."""
    url = f"{settings.base_url}/metadata/scheduledevents?api-version=2020-07-01"
    headers = {"Metadata": "true"}
    _, events = parse_azure(_fetch(url, headers, budget_s))
    ids = [e.event_id for e in events if e.action is not Action.NONE]
    if ids:
        body = json.dumps({"StartRequests": [{"EventId": i} for i in ids]}).encode()
        headers["Content-Type"] = "application/json"
        _fetch(url, headers, budget_s, method="POST", data=body)
    return ids


def _fetch(
    url: str,
    headers: dict[str, str],
    budget_s: float,
    method: str = "GET",
    data: bytes | None = None,
) -> str:
    """The body, read within about ``budget_s`` even from a server that trickles it."""
    deadline = SYSTEM_CLOCK.monotonic() + budget_s
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=budget_s) as response:
            body = b""
            while chunk := response.read1(65536):
                body += chunk
                if len(body) > MAX_DOCUMENT_BYTES:
                    raise PollFailed(f"{url}: answer over {MAX_DOCUMENT_BYTES} bytes")
                if SYSTEM_CLOCK.monotonic() > deadline:
                    raise PollFailed(f"{url}: no full answer within {budget_s:g}s")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise PollFailed(f"{url}: {exc}") from None
    try:
        return body.decode()
    except UnicodeDecodeError:
        raise ParseError(f"{url}: answer is not UTF-8") from None


def _drain(event: MaintenanceEvent, lead: float | None) -> Finding:
    replace = event.action is Action.REPLACE
    return Finding(
        layer=Layer.KERNEL,
        code=MAINTENANCE_RETIREMENT if replace else MAINTENANCE_EVENT,
        severity=Severity.CRITICAL,
        action=event.action,
        component=NODE,
        source=MaintenanceCheck.name,
        message=f"{event.provider} scheduled {event.kind} {_when(lead)}: draining the node",
        evidence=f"event {event.event_id}: {event.description}".strip(": "),
    )


def _notice(event: MaintenanceEvent, lead: float | None, in_window: bool) -> Finding:
    why = "confirming on the next poll" if in_window else "outside the drain window"
    if event.action is Action.NONE:
        why = "no drain needed"
    return Finding(
        layer=Layer.KERNEL,
        code=MAINTENANCE_NOTICE,
        severity=Severity.INFO,
        action=Action.NONE,
        component=NODE,
        source=MaintenanceCheck.name,
        message=f"{event.provider} scheduled {event.kind} {_when(lead)} ({why})",
        evidence=f"event {event.event_id}",
    )


def _poll_failed(provider: str, detail: str) -> Finding:
    return Finding(
        layer=Layer.KERNEL,
        code=MAINTENANCE_POLL_FAILED,
        severity=Severity.INFO,
        action=Action.NONE,
        component=NODE,
        source=MaintenanceCheck.name,
        message=f"{provider} metadata service gave no usable answer; not a node fault",
        evidence=detail[:500],
    )


def _when(lead: float | None) -> str:
    return "now" if lead is None or lead <= 0 else f"in {lead:.0f}s"
