"""Parsers of the providers' scheduled-event documents (pure: text in, events out).

AWS: ``/latest/meta-data/events/maintenance/scheduled`` (a JSON list); GCE:
``/computeMetadata/v1/instance/maintenance-event`` (one word); Azure:
``/metadata/scheduledevents`` (a JSON object). A document that is not the documented shape
raises :class:`gpuguard.errors.ParseError`, never yields an event.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass

from gpuguard.errors import ParseError
from gpuguard.model import Action

AWS_REPLACE = frozenset({"instance-retirement", "instance-stop"})
AWS_DRAIN = frozenset({"system-reboot", "system-maintenance", "instance-reboot"})
GCE_EVENTS = {
    "NONE": Action.NONE,
    # Live migration keeps the VM running (GPU VMs cannot use it; seen only on others).
    "MIGRATE_ON_HOST_MAINTENANCE": Action.NONE,
    "TERMINATE_ON_HOST_MAINTENANCE": Action.REPLACE,
}
AZURE_EVENTS = {
    "Freeze": Action.NONE,  # a pause of seconds: not worth a drain
    "Reboot": Action.REBOOT,
    "Redeploy": Action.REPLACE,
    "Preempt": Action.REPLACE,
    "Terminate": Action.REPLACE,
}


@dataclass(frozen=True)
class MaintenanceEvent:
    """One scheduled event; ``starts`` is None when it is under way or has no time."""

    provider: str
    event_id: str
    kind: str
    action: Action
    starts: datetime.datetime | None
    description: str = ""


def parse_aws(text: str) -> list[MaintenanceEvent]:
    """Active events of the EC2 document; completed and canceled ones are dropped."""
    items = _json(text, "aws")
    if not isinstance(items, list):
        raise ParseError("aws scheduled events: expected a JSON list")
    events = []
    for item in items:
        entry = _mapping(item, "aws")
        code = _str(entry, "Code", "aws")
        if code not in AWS_REPLACE | AWS_DRAIN:
            raise ParseError(f"aws scheduled event: unknown Code {code!r}")
        if entry.get("State", "active") != "active":
            continue
        action = Action.REPLACE if code in AWS_REPLACE else Action.REBOOT
        starts = _time(_str(entry, "NotBefore", "aws"), "%d %b %Y %H:%M:%S GMT", "aws")
        event_id = _str(entry, "EventId", "aws")
        description = str(entry.get("Description", ""))
        events.append(MaintenanceEvent("aws", event_id, code, action, starts, description))
    return events


def parse_gce(text: str) -> list[MaintenanceEvent]:
    """The one pending event of the GCE instance, if any (GCE gives no start time)."""
    word = text.strip()
    if word not in GCE_EVENTS:
        raise ParseError(f"gcp maintenance-event: unexpected value {word[:60]!r}")
    if word == "NONE":
        return []
    return [MaintenanceEvent("gcp", word, word, GCE_EVENTS[word], None)]


def parse_azure(text: str) -> tuple[int, list[MaintenanceEvent]]:
    """The document's incarnation and its events (Scheduled or Started)."""
    document = _mapping(_json(text, "azure"), "azure")
    incarnation = document.get("DocumentIncarnation")
    items = document.get("Events")
    if not isinstance(incarnation, int) or not isinstance(items, list):
        raise ParseError("azure scheduled events: no DocumentIncarnation or Events list")
    events = []
    for item in items:
        entry = _mapping(item, "azure")
        kind = _str(entry, "EventType", "azure")
        status = _str(entry, "EventStatus", "azure")
        if kind not in AZURE_EVENTS or status not in ("Scheduled", "Started"):
            raise ParseError(f"azure scheduled event: unknown EventType/Status {kind}/{status}")
        raw = str(entry.get("NotBefore") or "")
        starts = _time(raw, "%a, %d %b %Y %H:%M:%S GMT", "azure") if raw else None
        if status == "Started":
            starts = None
        event_id = _str(entry, "EventId", "azure")
        description = str(entry.get("Description", ""))
        events.append(
            MaintenanceEvent("azure", event_id, kind, AZURE_EVENTS[kind], starts, description)
        )
    return incarnation, events


def _json(text: str, provider: str) -> object:
    try:
        document: object = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ParseError(f"{provider} scheduled events: not JSON ({exc})") from None
    return document


def _mapping(item: object, provider: str) -> dict[str, object]:
    if not isinstance(item, dict):
        raise ParseError(f"{provider} scheduled event: not an object")
    return {str(k): v for k, v in item.items()}


def _str(entry: dict[str, object], key: str, provider: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value:
        raise ParseError(f"{provider} scheduled event: missing {key}")
    return value


def _time(raw: str, layout: str, provider: str) -> datetime.datetime:
    try:
        return datetime.datetime.strptime(raw, layout).replace(tzinfo=datetime.UTC)
    except ValueError:
        raise ParseError(f"{provider} scheduled event: bad time {raw[:40]!r}") from None
