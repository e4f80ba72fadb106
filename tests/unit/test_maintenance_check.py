"""The ``maintenance`` check against a metadata service on loopback: each provider's
documents, and the slow, malformed and flapping answers that must never drain."""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

import pytest

from gpuguard.agent.maintenance_ack import with_maintenance_ack
from gpuguard.agent.repair import BundleRepair
from gpuguard.checks.base import CheckContext
from gpuguard.checks.maintenance.check import (
    MAINTENANCE_EVENT,
    MAINTENANCE_NOTICE,
    MAINTENANCE_POLL_FAILED,
    MAINTENANCE_RETIREMENT,
    MaintenanceCheck,
)
from gpuguard.config import Config, build_config
from gpuguard.errors import ConfigError
from gpuguard.model import Action, Outcome, Severity
from gpuguard.runner import run_check
from gpuguard.sources import LiveSources
from tests.support.metadata_server import MetadataService, metadata_service
from tests.unit.test_maintenance_events import AWS_EXAMPLE, AZURE_EXAMPLE


def _from_now(delta: datetime.timedelta) -> datetime.datetime:
    """A start ``delta`` after this moment: the suite may run long after it was collected."""
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0) + delta


def _config(service: MetadataService, **settings: object) -> Config:
    maintenance = {"provider": service.provider, "endpoint": service.url, "timeout_s": 1.0}
    maintenance.update(settings)
    return build_config({"maintenance": maintenance}, origin="test")


def _poll(
    check: MaintenanceCheck, config: Config, timeout_s: float = 5.0
) -> list[tuple[str, Action]]:
    result = run_check(check, CheckContext(LiveSources(config), config, timeout_s))
    assert result.outcome is Outcome.OK, result.detail
    return [(f.code, f.action) for f in result.findings]


def _aws(code: str, starts: datetime.datetime, event_id: str = "instance-event-1") -> str:
    when = starts.strftime("%d %b %Y %H:%M:%S GMT")
    return (
        f'[{{"NotBefore": "{when}", "Code": "{code}", "EventId": "{event_id}",'
        f' "Description": "test", "State": "active"}}]'
    )


def test_aws_documented_event_drains_at_once() -> None:
    """Its start is past: no second sighting is awaited."""
    with metadata_service("aws") as service:
        service.answer(AWS_EXAMPLE)
        assert _poll(MaintenanceCheck(), _config(service)) == [(MAINTENANCE_EVENT, Action.REBOOT)]


def test_aws_retirement_in_window_replaces_on_second_sighting() -> None:
    with metadata_service("aws") as service:
        service.answer(_aws("instance-retirement", _from_now(datetime.timedelta(minutes=30))))
        check, config = MaintenanceCheck(), _config(service, window_s=3600)
        assert _poll(check, config) == [(MAINTENANCE_NOTICE, Action.NONE)]
        assert _poll(check, config) == [(MAINTENANCE_RETIREMENT, Action.REPLACE)]


def test_aws_event_outside_the_window_is_a_notice() -> None:
    with metadata_service("aws") as service:
        service.answer(_aws("system-reboot", _from_now(datetime.timedelta(days=3))))
        check, config = MaintenanceCheck(), _config(service, window_s=3600)
        for _ in range(3):
            assert _poll(check, config) == [(MAINTENANCE_NOTICE, Action.NONE)]


def test_flapping_event_never_drains() -> None:
    """A far event that comes and goes is never seen twice in a row."""
    with metadata_service("aws") as service:
        check, config = MaintenanceCheck(), _config(service, window_s=3600)
        for _ in range(3):
            service.answer(_aws("system-reboot", _from_now(datetime.timedelta(minutes=40))))
            assert _poll(check, config) == [(MAINTENANCE_NOTICE, Action.NONE)]
            service.answer("[]")
            assert _poll(check, config) == []


def test_gcp_terminate_replaces_and_migrate_does_not_drain() -> None:
    with metadata_service("gcp") as service:
        check, config = MaintenanceCheck(), _config(service)
        service.answer("NONE")
        assert _poll(check, config) == []
        service.answer("MIGRATE_ON_HOST_MAINTENANCE")
        assert _poll(check, config) == [(MAINTENANCE_NOTICE, Action.NONE)]
        service.answer("TERMINATE_ON_HOST_MAINTENANCE")
        assert _poll(check, config) == [(MAINTENANCE_RETIREMENT, Action.REPLACE)]


def test_azure_events() -> None:
    with metadata_service("azure") as service:
        check, config = MaintenanceCheck(), _config(service)
        service.answer(AZURE_EXAMPLE)  # a Freeze
        assert _poll(check, config) == [(MAINTENANCE_NOTICE, Action.NONE)]
        service.answer(AZURE_EXAMPLE.replace('"Freeze"', '"Reboot"'))
        assert _poll(check, config) == [(MAINTENANCE_EVENT, Action.REBOOT)]
        started = AZURE_EXAMPLE.replace('"Freeze"', '"Preempt"').replace("Scheduled", "Started")
        service.answer(started)
        assert _poll(check, config) == [(MAINTENANCE_RETIREMENT, Action.REPLACE)]


@pytest.mark.parametrize(
    ("provider", "body", "status"),
    [
        ("aws", "<html>gateway</html>", 200),
        ("aws", "[]", 500),
        ("gcp", "SOMETHING_NEW", 200),
        ("azure", '{"Events": "no"}', 200),
        ("azure", "x" * 300_000, 200),
    ],
)
def test_malformed_or_failing_answer_is_no_finding(provider: str, body: str, status: int) -> None:
    with metadata_service(provider) as service:
        service.answer(body, status)
        result = run_check(
            MaintenanceCheck(), CheckContext(LiveSources(Config()), _config(service), 5.0)
        )
    assert result.outcome is Outcome.OK
    assert [(f.code, f.severity) for f in result.findings] == [
        (MAINTENANCE_POLL_FAILED, Severity.INFO)
    ]


def test_slow_answer_is_no_finding_and_within_the_runner_limit() -> None:
    with metadata_service("azure") as service:
        service.answer(AZURE_EXAMPLE.replace('"Freeze"', '"Reboot"'), delay_s=30)
        config = _config(service, timeout_s=30)  # clamped to a third of the runner's limit
        started = time.monotonic()
        assert _poll(MaintenanceCheck(), config, timeout_s=3.0) == [
            (MAINTENANCE_POLL_FAILED, Action.NONE)
        ]
        assert time.monotonic() - started < 3.0


def test_unreachable_service_keeps_a_confirmed_drain() -> None:
    with metadata_service("aws") as service:
        check, config = MaintenanceCheck(), _config(service)
        service.answer(AWS_EXAMPLE)
        assert _poll(check, config) == [(MAINTENANCE_EVENT, Action.REBOOT)]
    # The server has stopped: connection refused.
    assert _poll(check, config) == [
        (MAINTENANCE_POLL_FAILED, Action.NONE),
        (MAINTENANCE_EVENT, Action.REBOOT),
    ]


def test_off_by_default_and_config() -> None:
    config = Config()
    assert config.maintenance.provider is None
    assert _poll(MaintenanceCheck(), config) == []
    assert (
        build_config({"maintenance": {"provider": "gcp", "interval_s": 5}}, "t").interval_for(
            "maintenance"
        )
        == 5
    )
    assert Config().maintenance.model_copy(update={"provider": "gcp"}).base_url == (
        "http://metadata.google.internal"
    )
    with pytest.raises(ConfigError, match="provider"):
        build_config({"maintenance": {"provider": "oracle"}}, "t")


def test_azure_events_are_acknowledged_before_the_reboot(tmp_path: Path) -> None:
    """The reboot rung comes after the drain: Azure is told to go ahead, Freezes left alone."""
    reboot = json.loads(AZURE_EXAMPLE.replace('"Freeze"', '"Reboot"'))["Events"][0]
    freeze = json.loads(AZURE_EXAMPLE)["Events"][0] | {"EventId": "freeze-1"}
    document = json.dumps({"DocumentIncarnation": 3, "Events": [reboot, freeze]})
    with metadata_service("azure") as service:
        service.answer(document)
        settings = _config(service).maintenance
        backend = with_maintenance_ack(BundleRepair(tmp_path / "repairs.log"), settings)
        assert backend.reboot()[0]
        assert service.acknowledged == [{"StartRequests": [{"EventId": reboot["EventId"]}]}]
        service.answer("", 503)
        assert backend.reboot()[0]  # a failed approval never blocks the reboot
    assert (tmp_path / "repairs.log").read_text() == "reboot\nreboot\n"
    plain = BundleRepair(tmp_path / "other.log")
    assert with_maintenance_ack(plain, Config().maintenance) is plain
