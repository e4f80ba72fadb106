"""The providers' scheduled-event documents, parsed; malformed ones are a clear error."""

from __future__ import annotations

import datetime

import pytest

from gpuguard.checks.maintenance.events import parse_aws, parse_azure, parse_gce
from gpuguard.errors import ParseError
from gpuguard.model import Action

# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/monitoring-instances-status-check_sched.html
AWS_EXAMPLE = """[ {
  "NotBefore" : "21 Jan 2019 09:00:43 GMT",
  "Code" : "system-reboot",
  "Description" : "scheduled reboot",
  "EventId" : "instance-event-0d59937288b749b32",
  "NotAfter" : "21 Jan 2019 09:17:23 GMT",
  "State" : "active"
} ]"""

# https://learn.microsoft.com/azure/virtual-machines/linux/scheduled-events
AZURE_EXAMPLE = """{
    "DocumentIncarnation": 1,
    "Events": [
        {
            "EventId": "f020ba2e-3bc0-4c40-a10b-86575a9eabd5",
            "EventType": "Freeze",
            "ResourceType": "VirtualMachine",
            "Resources": ["myVM"],
            "EventStatus": "Scheduled",
            "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
            "Description": "Host server is undergoing maintenance.",
            "EventSource" : "Platform",
            "DurationInSeconds": 9
        }
    ]
}"""


def test_aws_documented_example() -> None:
    """The example of the EC2 user guide's "scheduled events" section (URL above)."""
    (event,) = parse_aws(AWS_EXAMPLE)
    assert event.kind == "system-reboot"
    assert event.action is Action.REBOOT
    assert event.event_id == "instance-event-0d59937288b749b32"
    assert event.starts == datetime.datetime(2019, 1, 21, 9, 0, 43, tzinfo=datetime.UTC)


def test_aws_retirement_replaces_and_finished_events_are_dropped() -> None:
    document = """[
      {"NotBefore": "1 Jan 2021 02:00:00 GMT", "Code": "instance-retirement",
       "EventId": "instance-event-1", "State": "active"},
      {"NotBefore": "1 Jan 2021 02:00:00 GMT", "Code": "instance-stop",
       "EventId": "instance-event-2", "State": "completed"},
      {"NotBefore": "1 Jan 2021 02:00:00 GMT", "Code": "system-maintenance",
       "EventId": "instance-event-3", "State": "canceled"}]"""
    (event,) = parse_aws(document)
    assert (event.kind, event.action) == ("instance-retirement", Action.REPLACE)
    assert parse_aws("[]") == []


def test_azure_documented_example() -> None:
    """The example of Azure's Scheduled Events article (URL above): a Freeze, no drain."""
    incarnation, (event,) = parse_azure(AZURE_EXAMPLE)
    assert incarnation == 1
    assert (event.kind, event.action) == ("Freeze", Action.NONE)
    assert event.starts == datetime.datetime(2016, 9, 19, 18, 29, 47, tzinfo=datetime.UTC)


def test_azure_event_types() -> None:
    document = AZURE_EXAMPLE.replace('"Freeze"', '"Preempt"').replace('"Scheduled"', '"Started"')
    _, (event,) = parse_azure(document)
    assert (event.action, event.starts) == (Action.REPLACE, None)
    reboot = AZURE_EXAMPLE.replace('"Freeze"', '"Reboot"')
    assert parse_azure(reboot)[1][0].action is Action.REBOOT
    assert parse_azure('{"DocumentIncarnation": 7, "Events": []}') == (7, [])


def test_gce_values() -> None:
    """https://cloud.google.com/compute/docs/metadata/predefined-metadata-keys
    (instance/maintenance-event: NONE, MIGRATE_ON_HOST_MAINTENANCE,
    TERMINATE_ON_HOST_MAINTENANCE)."""
    assert parse_gce("NONE") == []
    (migrate,) = parse_gce("MIGRATE_ON_HOST_MAINTENANCE")
    assert migrate.action is Action.NONE
    (terminate,) = parse_gce("TERMINATE_ON_HOST_MAINTENANCE\n")
    assert (terminate.action, terminate.starts) == (Action.REPLACE, None)


@pytest.mark.parametrize(
    ("document", "error"),
    [
        ("", "not JSON"),
        ("<html>", "not JSON"),
        ('{"Code": "system-reboot"}', "expected a JSON list"),
        ("[1]", "not an object"),
        ('[{"Code": "bogus", "NotBefore": "x", "EventId": "e"}]', "unknown Code"),
        ('[{"Code": "system-reboot", "EventId": "e"}]', "missing NotBefore"),
        ('[{"Code": "system-reboot", "NotBefore": "tomorrow", "EventId": "e"}]', "bad time"),
        ("[" * 100000, "not JSON"),
    ],
)
def test_aws_malformed(document: str, error: str) -> None:
    with pytest.raises(ParseError, match=error):
        parse_aws(document)


@pytest.mark.parametrize(
    ("document", "error"),
    [
        ("[]", "not an object"),
        ('{"Events": []}', "DocumentIncarnation"),
        ('{"DocumentIncarnation": 1, "Events": {}}', "Events list"),
        (AZURE_EXAMPLE.replace('"Freeze"', '"Explode"'), "unknown EventType"),
        (AZURE_EXAMPLE.replace("Mon, 19 Sep", "19 Sep"), "bad time"),
        (
            AZURE_EXAMPLE.replace('"EventId": "f020ba2e-3bc0-4c40-a10b-86575a9eabd5",', ""),
            "EventId",
        ),
    ],
)
def test_azure_malformed(document: str, error: str) -> None:
    with pytest.raises(ParseError, match=error):
        parse_azure(document)


@pytest.mark.parametrize("document", ["", "TERMINATE", "<html>500</html>", "none"])
def test_gce_malformed(document: str) -> None:
    with pytest.raises(ParseError, match="unexpected value"):
        parse_gce(document)
