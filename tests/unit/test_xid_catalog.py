"""The Xid rules, checked against NVIDIA's catalog file and a hand-checked table of actions.

The expected actions below were read off NVIDIA's "Xid Catalog for Ampere and newer"
(its immediate-action column, tests/data/nvidia_xid_catalog_ampere_plus.csv) and written
out by hand, so a change to the bucket mapping or the overrides has to agree with them.
"""

from __future__ import annotations

import csv

import pytest

from gpuguard.checks import nvlink5
from gpuguard.checks.xid_catalog import BUCKET_RULES, OVERRIDES, catalog, rule_for
from gpuguard.kernel_log.check import classify_log
from gpuguard.model import Action, Severity
from tests.conftest import DATA

W, INFO, C = Severity.WARNING, Severity.INFO, Severity.CRITICAL

# xid -> (NVIDIA's immediate action, the severity and rung gpuguard gives it).
DOCUMENTED: dict[int, tuple[str, Severity, Action]] = {
    # RESTART_APP: the application failed, the GPU is fine.
    8: ("RESTART_APP", W, Action.KILL_JOB),
    13: ("RESTART_APP", W, Action.KILL_JOB),
    31: ("RESTART_APP", W, Action.KILL_JOB),
    32: ("RESTART_APP", W, Action.KILL_JOB),
    68: ("RESTART_APP", W, Action.KILL_JOB),
    69: ("RESTART_APP", W, Action.KILL_JOB),
    94: ("RESTART_APP", W, Action.KILL_JOB),
    # IGNORE.
    38: ("IGNORE", INFO, Action.NONE),
    63: ("IGNORE", INFO, Action.NONE),
    92: ("IGNORE", INFO, Action.NONE),
    121: ("IGNORE", INFO, Action.NONE),
    137: ("IGNORE", INFO, Action.NONE),
    # RESET_GPU and the workflows that end in a reset.
    48: ("WORKFLOW_XID_48", C, Action.RESET_GPU),
    62: ("RESET_GPU", C, Action.RESET_GPU),
    64: ("RESET_GPU", C, Action.RESET_GPU),
    74: ("WORKFLOW_NVLINK_ERR", C, Action.RESET_GPU),
    95: ("RESET_GPU", C, Action.RESET_GPU),
    109: ("RESET_GPU", C, Action.RESET_GPU),
    110: ("RESET_GPU", C, Action.RESET_GPU),
    119: ("RESET_GPU", C, Action.RESET_GPU),
    120: ("RESET_GPU", C, Action.RESET_GPU),
    136: ("RESET_GPU", C, Action.RESET_GPU),
    140: ("RESET_GPU", C, Action.RESET_GPU),
    143: ("RESET_GPU", C, Action.RESET_GPU),
    155: ("RESET_GPU", C, Action.RESET_GPU),
    156: ("RESET_GPU", C, Action.RESET_GPU),
    158: ("RESET_GPU", C, Action.RESET_GPU),
    # Restart the machine; a physical fault replaces it.
    79: ("RESTART_BM", C, Action.REBOOT),
    151: ("RESTART_VM", C, Action.REBOOT),
    54: ("CHECK_MECHANICALS", C, Action.REPLACE),
    # Nothing automatic: flag for a human.
    56: ("CONTACT_SUPPORT", W, Action.NONE),
    61: ("CONTACT_SUPPORT", W, Action.NONE),
    159: ("CHECK_UVM", W, Action.NONE),
    162: ("", W, Action.NONE),
    172: ("", W, Action.NONE),
    # Our documented overrides.
    43: ("IGNORE", W, Action.KILL_JOB),
    45: ("WORKFLOW_XID_45", INFO, Action.NONE),
}


def fixture_rows() -> dict[int, dict[str, str]]:
    with (DATA / "nvidia_xid_catalog_ampere_plus.csv").open(newline="") as handle:
        return {int(row["xid"]): row for row in csv.DictReader(handle)}


def test_the_packaged_catalog_is_nvidias_file_row_for_row():
    assert catalog() == fixture_rows()


@pytest.mark.parametrize("xid", sorted(DOCUMENTED))
def test_documented_action(xid):
    bucket, severity, action = DOCUMENTED[xid]
    assert fixture_rows()[xid]["immediate_action"] == bucket
    rule = rule_for(xid)
    assert (rule.severity, rule.action) == (severity, action)
    assert rule.why


def test_every_bucket_in_the_catalog_has_a_rule_or_an_override():
    for xid, row in fixture_rows().items():
        bucket = row["immediate_action"]
        assert bucket in BUCKET_RULES or xid in OVERRIDES or xid in nvlink5.XIDS or not bucket, (
            xid,
            bucket,
        )


@pytest.mark.parametrize(
    "xid", sorted(x for x, (b, _, _) in DOCUMENTED.items() if b == "RESTART_APP")
)
def test_application_faults_never_drain(xid):
    assert rule_for(xid).application
    (finding,) = classify_log(f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=1, name=python, Ch 01")
    assert finding.action <= Action.KILL_JOB


def test_unknown_code_gets_the_explicit_default():
    rule = rule_for(4000)
    assert (rule.severity, rule.action, rule.mnemonic) == (W, Action.NONE, "UNKNOWN")


@pytest.mark.parametrize(
    ("recovery", "severity", "action", "deferred"),
    [
        ("None", INFO, Action.NONE, False),
        ("GPU Reset Required", C, Action.RESET_GPU, False),
        ("Node Reboot Required", C, Action.REBOOT, False),
        ("Drain P2P", C, Action.RESET_GPU, False),  # end the P2P processes now
        ("Drain and Reset", C, Action.RESET_GPU, True),  # running work may finish first
    ],
)
def test_xid154_follows_nvidias_recovery_actions(recovery, severity, action, deferred):
    line = f"NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 ({recovery})"
    (finding,) = classify_log(line)
    assert (finding.severity, finding.action, finding.deferred) == (severity, action, deferred)
