"""NVIDIA's Xid catalog as data, and gpuguard's rule for turning an Xid into a finding.

The catalog (``data/xid_catalog.csv``, NVIDIA's "Xid Catalog for Ampere and newer") gives
each Xid an immediate resolution bucket. :data:`BUCKET_RULES` maps buckets onto our action
ladder; :data:`OVERRIDES` lists where we deliberately differ, each with its reason. Both
are printed by ``gpuguard xid N``.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from gpuguard.checks import nvlink5
from gpuguard.checks.rules import Rule
from gpuguard.model import Action, Component, Finding, Layer, Severity


@dataclass(frozen=True)
class XidRule:
    """What gpuguard does about one Xid code."""

    xid: int
    mnemonic: str
    description: str
    bucket: str
    investigatory: str
    severity: Severity
    action: Action
    application: bool
    why: str


@dataclass(frozen=True)
class BucketRule:
    severity: Severity
    action: Action
    why: str


BUCKET_RULES: dict[str, BucketRule] = {
    "RESTART_APP": BucketRule(
        Severity.WARNING,
        Action.KILL_JOB,
        "NVIDIA: restart the application; the GPU itself is fine, so never drain for it",
    ),
    "IGNORE": BucketRule(Severity.INFO, Action.NONE, "NVIDIA: no action needed"),
    "RESET_GPU": BucketRule(Severity.CRITICAL, Action.RESET_GPU, "NVIDIA: reset the GPU"),
    "WORKFLOW_XID_48": BucketRule(
        Severity.CRITICAL,
        Action.RESET_GPU,
        "uncorrectable ECC error: reset the GPU so the row remap takes effect",
    ),
    "WORKFLOW_NVLINK_ERR": BucketRule(
        Severity.CRITICAL, Action.RESET_GPU, "NVLink error: reset the GPU, then verify the links"
    ),
    "RESTART_BM": BucketRule(Severity.CRITICAL, Action.REBOOT, "NVIDIA: restart the machine"),
    "RESTART_VM": BucketRule(Severity.CRITICAL, Action.REBOOT, "NVIDIA: restart the VM"),
    "CHECK_MECHANICALS": BucketRule(
        Severity.CRITICAL,
        Action.REPLACE,
        "a physical fault (power, seating) that software cannot repair: replace the machine",
    ),
    "CONTACT_SUPPORT": BucketRule(
        Severity.WARNING,
        Action.NONE,
        "NVIDIA: contact support; no automatic action, flag the node for a human",
    ),
    "UPDATE_SWFW": BucketRule(
        Severity.WARNING, Action.NONE, "software or firmware must be updated; not a broken part"
    ),
    "CHECK_UVM": BucketRule(
        Severity.WARNING, Action.NONE, "NVIDIA: check whether unified memory is in use"
    ),
}

# A known Xid with no bucket (catalog rows 162-172) or an Xid the catalog does not list.
DEFAULT_RULE = BucketRule(
    Severity.WARNING,
    Action.NONE,
    "no resolution in NVIDIA's catalog: flag for a human rather than guess a repair",
)

# Our deliberate departures from the bucket mapping, with the reason for each.
OVERRIDES: dict[int, BucketRule] = {
    43: BucketRule(
        Severity.WARNING,
        Action.KILL_JOB,
        "follows Xid 13/31 when a channel is killed: part of the same application incident",
    ),
    45: BucketRule(
        Severity.INFO,
        Action.NONE,
        "preemptive cleanup after an earlier error: the Xid it names decides the action",
    ),
    154: BucketRule(
        Severity.WARNING,
        Action.NONE,
        "the driver's own recovery verdict: the action is read from the line's text",
    ),
}

NVLINK5_FATAL = BucketRule(
    Severity.CRITICAL, Action.RESET_GPU, "NVLink5 error the driver marks Fatal: reset the GPU"
)
NVLINK5_NONFATAL = BucketRule(
    Severity.INFO, Action.NONE, "NVLink5 error the driver marks Nonfatal: no action"
)
# NVIDIA's Xid 144-150 decode of the line's unit and error status (checks.nvlink5).
NVLINK5_DECODED: dict[str, BucketRule] = {
    nvlink5.RESET_GPU: BucketRule(
        Severity.CRITICAL,
        Action.RESET_GPU,
        "NVIDIA's NVLink5 decode of this unit and error status: reset the GPU",
    ),
    nvlink5.XID_154_EVAL: BucketRule(
        Severity.WARNING,
        Action.KILL_JOB,
        "NVIDIA's NVLink5 decode: the application fails; the driver's Xid 154, when it "
        "prints one, says what the GPU needs",
    ),
    nvlink5.ACTION2: BucketRule(
        Severity.WARNING,
        Action.NONE,
        "NVIDIA's NVLink5 decode: may need a GPU reset under a condition the line does not "
        "show; flagged for a human",
    ),
    nvlink5.IGNORE: NVLINK5_NONFATAL,
}

# Xid 154 text (recovery action names printed by the driver) -> action.
RECOVERY_ACTIONS: dict[str, tuple[Severity, Action]] = {
    "none": (Severity.INFO, Action.NONE),
    "gpu reset required": (Severity.CRITICAL, Action.RESET_GPU),
    # NVIDIA: running work may finish; no new work, then reset (a deferred repair).
    "drain and reset": (Severity.CRITICAL, Action.RESET_GPU),
    # NVIDIA: end the processes doing peer-to-peer traffic now, then ask again.
    "drain p2p": (Severity.CRITICAL, Action.RESET_GPU),
    "bus reset": (Severity.CRITICAL, Action.RESET_GPU),
    "node reboot required": (Severity.CRITICAL, Action.REBOOT),
    "system reboot": (Severity.CRITICAL, Action.REBOOT),
    "recover imex domain": (Severity.CRITICAL, Action.REBOOT),
}
# The recovery action that is a deferred repair (Finding.deferred).
DEFERRED_RECOVERY = "drain and reset"

# Error containment (Xid 94, 95): the driver ends each line with whether it marked the GPU
# for a reset and for a drain and reset (open-gpu-kernel-modules,
# _gpuGenerateErrorLog_GA100: "RST: %s, D-RST: %s" from bGpuResetReqd and
# bGpuDrainAndResetReqd, which gpuMarkDeviceForReset / gpuMarkDeviceForDrainAndReset act on).
_CONTAINMENT_MARKS = re.compile(r"\bRST: (?P<rst>Yes|No), D-RST: (?P<drst>Yes|No)", re.IGNORECASE)
MARKED_FOR_RESET = BucketRule(
    Severity.CRITICAL, Action.RESET_GPU, "the driver marked the GPU for reset (RST: Yes)"
)
MARKED_FOR_DRAIN_AND_RESET = BucketRule(
    Severity.CRITICAL,
    Action.RESET_GPU,
    "the driver marked the GPU for drain and reset (D-RST: Yes): running work may end first",
)
_RECOVERY_CHANGE = re.compile(r"to 0x[0-9a-fA-F]+ \((?P<to>[^)]*)\)")


@cache
def catalog() -> dict[int, dict[str, str]]:
    """The catalog rows by Xid code, loaded once from the package data."""
    text = resources.files("gpuguard").joinpath("data/xid_catalog.csv").read_text()
    return {int(row["xid"]): row for row in csv.DictReader(text.splitlines())}


def rule_for(xid: int) -> XidRule:
    """The rule gpuguard applies to an Xid, before reading the line's own text."""
    row = catalog().get(xid)
    bucket = row["immediate_action"] if row else ""
    if xid in OVERRIDES:
        base = OVERRIDES[xid]
    elif bucket in BUCKET_RULES:
        base = BUCKET_RULES[bucket]
    else:
        base = DEFAULT_RULE
    return XidRule(
        xid=xid,
        mnemonic=row["mnemonic"] if row else "UNKNOWN",
        description=row["description"] if row else "not in NVIDIA's Xid catalog",
        bucket=bucket or "(none)",
        investigatory=row["investigatory_action"] if row else "",
        severity=base.severity,
        action=base.action,
        application=bucket == "RESTART_APP" or xid == 43,
        why=base.why,
    )


def judge_line(xid: int, text: str) -> Rule:
    """The rule for one Xid (code ``XID_<n>``), using the line's text where it decides."""
    rule = rule_for(xid)
    code = f"XID_{xid}"
    if xid == 154:
        recovery = recovery_action(text)
        known = recovery_rule(recovery) if recovery else None
        if known:
            why = f"driver recovery action is now '{recovery}'"
            return Rule(code, known.severity, known.action, why, known.deferred)
        return Rule(code, rule.severity, rule.action, rule.why)
    marked = reset_marks(text)
    if marked != (False, False) and rule.action <= Action.RESET_GPU:
        reset, _ = marked
        chosen = MARKED_FOR_RESET if reset else MARKED_FOR_DRAIN_AND_RESET
        return Rule(code, chosen.severity, chosen.action, chosen.why, not reset)
    if xid in nvlink5.XIDS:
        chosen = _nvlink5_rule(xid, text)
        return Rule(code, chosen.severity, chosen.action, chosen.why)
    return Rule(code, rule.severity, rule.action, rule.why)


def _nvlink5_rule(xid: int, text: str) -> BucketRule:
    """The graver of the driver's Fatal/Nonfatal word and NVIDIA's decode of the status."""
    decoded = nvlink5.decode(xid, text)
    if decoded is None:
        return DEFAULT_RULE
    word = NVLINK5_FATAL if decoded.fatal else NVLINK5_NONFATAL
    table = NVLINK5_DECODED.get(decoded.resolution or "", word)
    return max(word, table, key=lambda r: (r.action, r.severity))


def reset_marks(text: str) -> tuple[bool, bool]:
    """(marked for reset, marked for drain and reset) as an error-containment Xid line says;
    (False, False) for a line that says neither or no."""
    match = _CONTAINMENT_MARKS.search(text)
    if match is None:
        return False, False
    return match["rst"].lower() == "yes", match["drst"].lower() == "yes"


def recovery_action(text: str) -> str | None:
    """The recovery action an Xid 154 line changes to ("Drain and Reset"), if it names one."""
    match = _RECOVERY_CHANGE.search(text)
    return match["to"].strip() if match else None


@dataclass(frozen=True)
class RecoveryRule:
    severity: Severity
    action: Action
    deferred: bool  # NVIDIA's "drain and reset": the repair waits for running work


def recovery_rule(name: str) -> RecoveryRule | None:
    """What a driver recovery action asks for, in any spelling the tools use: the kernel
    log's "Drain and Reset", nvidia-smi's "GPU Reset", NVML's and DCGM's "NODE_REBOOT".
    None for an action this table does not know."""
    key = name.strip().lower().replace("_", " ")
    known = RECOVERY_ACTIONS.get(key) or RECOVERY_ACTIONS.get(f"{key} required")
    return None if known is None else RecoveryRule(*known, deferred=key == DEFERRED_RECOVERY)


def xid_finding(
    xid: int, component: Component, source: str, evidence: str, text: str = ""
) -> Finding:
    """The finding for one Xid on one GPU; ``text`` is the driver's message after the code."""
    rule = judge_line(xid, text or evidence)
    message = f"Xid {xid} ({rule_for(xid).description}) on {component.id}: {rule.why}"
    return rule.finding(Layer.GPU, component, source, message, evidence)
