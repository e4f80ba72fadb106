"""The Xid rules, checked row by row against the catalog and our documented overrides."""

from __future__ import annotations

import pytest

from gpuguard.checks.xid_catalog import BUCKET_RULES, DEFAULT_RULE, OVERRIDES, catalog, rule_for
from gpuguard.model import Action, Severity

APPLICATION_XIDS = [13, 31, 43, 68, 69, 94]


def test_catalog_ships_inside_the_package_with_every_code():
    rows = catalog()
    assert len(rows) == 172
    assert set(rows) == set(range(1, 173))


@pytest.mark.parametrize("xid", sorted(catalog()))
def test_every_catalog_row_maps_to_a_rule(xid):
    rule = rule_for(xid)
    bucket = catalog()[xid]["immediate_action"]
    expected = OVERRIDES.get(xid) or BUCKET_RULES.get(bucket, DEFAULT_RULE)
    if xid not in range(144, 151):
        assert (rule.severity, rule.action) == (expected.severity, expected.action)
    assert rule.why


@pytest.mark.parametrize("xid", APPLICATION_XIDS)
def test_application_faults_never_drain(xid):
    rule = rule_for(xid)
    assert rule.application
    assert rule.action <= Action.KILL_JOB


@pytest.mark.parametrize(
    ("xid", "at_least"),
    [
        (79, Action.REBOOT),
        (48, Action.RESET_GPU),
        (95, Action.RESET_GPU),
        (119, Action.RESET_GPU),
        (54, Action.REPLACE),
    ],
)
def test_hardware_xids_call_for_repair(xid, at_least):
    assert rule_for(xid).action >= at_least
    assert rule_for(xid).severity is Severity.CRITICAL


def test_empty_bucket_and_unknown_code_get_the_explicit_default():
    for xid in (162, 171, 4000):
        rule = rule_for(xid)
        assert (rule.severity, rule.action) == (DEFAULT_RULE.severity, DEFAULT_RULE.action)
    assert rule_for(4000).mnemonic == "UNKNOWN"
