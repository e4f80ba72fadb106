"""Parser for ``dcgmi health -c -j``: DCGM's background health watches, per entity and system.

Shape (dcgmi ``Health.cpp`` through ``DcgmiOutputJson``; no real capture is public)::

    {"header": ["Health Monitor Report"],
     "body": {"Overall Health": {"value": "Warning"},
              "GPU": {"children": {"0": {"value": "Warning", "children": {"Errors": {
                  "children": {"PCIe system": {
                      "value": "Warning", "overflow": ["message wrapped", "into chunks"]}}}}}}}}}

Health words are "Healthy", "Warning", "Failure" and "Internal error". A word we do not
know is never read as healthy: it becomes a ``DCGM_HEALTH_UNKNOWN_STATE`` warning (the watch
answered, but with nothing we can judge), rather than a parse error that would hide the
other entities' verdicts.

What each watched system's verdict calls for:

=================  ======================  ===========  =================================
system label       code                    on Warning   on Failure (always CRITICAL)
=================  ======================  ===========  =================================
PCIe system        DCGM_HEALTH_PCIE        NONE         REBOOT (bus-level fault, cf. Xid 79)
NVLINK system      DCGM_HEALTH_NVLINK      NONE         RESET_GPU
Memory system      DCGM_HEALTH_MEMORY      NONE         RESET_GPU (DBE, remap failure)
SM system          DCGM_HEALTH_SM          NONE         RESET_GPU
NvSwitch ...       DCGM_HEALTH_NVSWITCH    NONE         REBOOT (fatal switch error)
InfoROM system     DCGM_HEALTH_INFOROM     NONE         NONE (reflash or RMA: a human)
Thermal system     DCGM_HEALTH_THERMAL     NONE         NONE (cooling, not the GPU)
Power system       DCGM_HEALTH_POWER       NONE         NONE (power feed, not the GPU)
Driver             DCGM_HEALTH_DRIVER      NONE         NONE
PMU / MCU system   DCGM_HEALTH_PMU / _MCU  NONE         NONE
ConnectX system    DCGM_HEALTH_CONNECTX    NONE         NONE
anything else      DCGM_HEALTH_OTHER       NONE         NONE
=================  ======================  ===========  =================================

A warning never repairs anything on its own: DCGM warns on rates and thresholds (PCIe
replays, pending retirements) that call for watching, not for a reset.

Some watches have no system label of their own (DcgmHealthWatch.cpp, dcgmi Health.cpp):
devastating Xids and NVSwitch errors print as "Internal error", the driver's recovery
action as "Driver", an IMEX problem as "NVLINK system" on no GPU. Their message says what
they are, and is read first: an Xid follows the Xid catalog, a recovery action the
driver's verdict, an NVSwitch error the NVSwitch rule, IMEX is a warning (software).
"""

from __future__ import annotations

import re

from gpuguard.checks.dcgm.common import (
    JsonObject,
    dcgm_entity,
    expect_list,
    expect_object,
    expect_str,
    load_dcgmi_json,
)
from gpuguard.checks.rules import Rule
from gpuguard.checks.xid_catalog import recovery_rule, xid_finding
from gpuguard.model import NODE, Action, Component, Finding, Layer, Severity

SOURCE = "dcgmi health"
OVERALL = "Overall Health"
UNKNOWN_STATE = "DCGM_HEALTH_UNKNOWN_STATE"


def _failure(code: str, action: Action, why: str) -> Rule:
    return Rule(code, Severity.CRITICAL, action, why)


# What a Failure of each watched system calls for; a Warning only flags (no repair).
SYSTEM_RULES: dict[str, Rule] = {
    "pcie": _failure("DCGM_HEALTH_PCIE", Action.REBOOT, "a PCIe-level fault needs a restart"),
    "nvlink": _failure("DCGM_HEALTH_NVLINK", Action.RESET_GPU, "reset, then verify links"),
    "memory": _failure("DCGM_HEALTH_MEMORY", Action.RESET_GPU, "reset applies row remaps"),
    "sm": _failure("DCGM_HEALTH_SM", Action.RESET_GPU, "reset the GPU"),
    "nvswitch": _failure("DCGM_HEALTH_NVSWITCH", Action.REBOOT, "switch faults reset the tray"),
    "inforom": _failure("DCGM_HEALTH_INFOROM", Action.NONE, "reflash or RMA: for a human"),
    "thermal": _failure("DCGM_HEALTH_THERMAL", Action.NONE, "cooling, not the GPU"),
    "power": _failure("DCGM_HEALTH_POWER", Action.NONE, "power feed, not the GPU"),
    "driver": _failure("DCGM_HEALTH_DRIVER", Action.NONE, "cause unclear: for a human"),
    "pmu": _failure("DCGM_HEALTH_PMU", Action.NONE, "no automatic repair known"),
    "mcu": _failure("DCGM_HEALTH_MCU", Action.NONE, "no automatic repair known"),
    "connectx": _failure("DCGM_HEALTH_CONNECTX", Action.NONE, "network adapter: for a human"),
}
OTHER_RULE = _failure("DCGM_HEALTH_OTHER", Action.NONE, "system not known to gpuguard")
# DCGM's messages for the watches it files under no named system (DCGM_FR_*_MSG):
# "Detected XID %u for GPU %u", "... (triggered by XID 79 ...)", "Detected fatal NvSwitch
# SXID %u", "... Recovery action: 2 (NODE_REBOOT).", "IMEX domain status is ...".
_XID_IN_MESSAGE = re.compile(r"\bXID (?P<xid>\d+)", re.IGNORECASE)
_SWITCH_IN_MESSAGE = re.compile(r"NvSwitch|\bSXID\b", re.IGNORECASE)
_RECOVERY_IN_MESSAGE = re.compile(r"Recovery action: \d+ \((?P<name>[A-Za-z0-9_ ]+)\)")
RECOVERY_CODE = "DCGM_HEALTH_RECOVERY_ACTION"
# DCGM_FR_PENDING_PAGE_RETIREMENTS / DCGM_FR_PENDING_ROW_REMAP ("A pending retired page has
# been detected in GPU %u", "... row remapping ... pending").
_PENDING_IN_MESSAGE = re.compile(
    r"pending (?:retired page|page retirement|row remap)|row remap\w* (?:is |are )?pending",
    re.IGNORECASE,
)
# DCGM's table: a pending retirement or remap is severity RESET; NVIDIA's drain and reset
# (the spare takes over at the next reset; running work may finish).
PENDING = Rule(
    "DCGM_HEALTH_MEMORY_PENDING",
    Severity.WARNING,
    Action.RESET_GPU,
    "drain, then reset the GPU",
    deferred=True,
)


def _software(code: str, why: str) -> Rule:
    return Rule(code, Severity.WARNING, Action.NONE, why)


# NVLINK incidents about the software around the links, not the GPU: as dcgmi diag's
# DCGM_FR_IMEX_UNHEALTHY, and DCGM's own table for the fabric (DCGM_FR_FABRIC_PROBE_STATE
# MONITOR, DCGM_FR_FABRIC_MANAGER_TRAINING_ERROR CONFIG). No GPU repair changes them.
_SOFTWARE = (
    (
        re.compile(r"\bIMEX\b", re.IGNORECASE),
        _software(
            "DCGM_HEALTH_IMEX",
            "IMEX is a software daemon, not the GPU: for a human, no GPU repair",
        ),
    ),
    (
        re.compile(r"\bFabric (?:State|Health|Manager)\b", re.IGNORECASE),
        _software(
            "DCGM_HEALTH_FABRIC",
            "the NVLink fabric is not ready or not configured (Fabric Manager): not the GPU",
        ),
    ),
)

# Health words, case-folded; None means healthy.
_SEVERITY_OF_WORD: dict[str, Severity | None] = {
    "healthy": None,
    "pass": None,
    "warning": Severity.WARNING,
    "warn": Severity.WARNING,
    "failure": Severity.CRITICAL,
    "fail": Severity.CRITICAL,
}


def parse_health(text: str) -> list[Finding]:
    """Findings from ``dcgmi health -c -j``; ``[]`` means every watched system is healthy."""
    document = load_dcgmi_json(text, SOURCE)
    body = expect_object(document.get("body"), f"{SOURCE}: body")
    overall = _word(body.get(OVERALL), f"{SOURCE}: {OVERALL}")
    findings: list[Finding] = []
    said: list[Severity] = []  # the severities DCGM's own words gave, before our rules
    for group, node in body.items():
        if group != OVERALL:
            findings += _group_findings(group, expect_object(node, f"{SOURCE}: {group}"), said)
    folded = overall.casefold()
    if folded not in _SEVERITY_OF_WORD:
        if not findings:  # entities' own verdicts, when given, say more
            findings.append(_unknown_state(NODE, "overall health", overall))
        return findings
    severity = _SEVERITY_OF_WORD[folded]
    worst = max([f.severity for f in findings] + said, default=None)
    if severity is not None and (worst is None or severity > worst):
        # DCGM's overall verdict is worse than any entity it names: keep the worse one.
        message = f"DCGM overall health is {overall}, worse than any entity it names"
        findings.append(_finding(OTHER_RULE.code, severity, Action.NONE, NODE, message, overall))
    return findings


def _group_findings(group: str, node: JsonObject, said: list[Severity]) -> list[Finding]:
    entities = expect_object(node.get("children"), f"{SOURCE}: {group}.children")
    findings: list[Finding] = []
    for entity_id, entity_node in entities.items():
        where = f"{SOURCE}: {group} {entity_id}"
        entity = expect_object(entity_node, where)
        component = dcgm_entity(group, entity_id)
        own = _system_findings(component, entity, where, said)
        word = _word(entity, where)
        if not own and word.casefold() not in _SEVERITY_OF_WORD:
            own.append(_unknown_state(component, f"{group} {entity_id}", word))
        elif not own and (severity := _SEVERITY_OF_WORD[word.casefold()]) is not None:
            message = f"DCGM health of {component} is {word} with no system named"
            own.append(_finding(OTHER_RULE.code, severity, Action.NONE, component, message, word))
        findings += own
    return findings


def _system_findings(
    component: Component, entity: JsonObject, where: str, said: list[Severity]
) -> list[Finding]:
    children = entity.get("children")
    if children is None:
        return []
    errors = expect_object(children, f"{where}.children").get("Errors")
    if errors is None:
        return []
    systems = expect_object(expect_object(errors, f"{where}.Errors").get("children"), where)
    findings: list[Finding] = []
    for label, system_node in systems.items():
        system = expect_object(system_node, f"{where} {label}")
        word = _word(system, f"{where} {label}")
        message = _rejoin(system.get("overflow"), f"{where} {label}.overflow")
        folded = word.casefold()
        if folded not in _SEVERITY_OF_WORD:
            findings.append(_unknown_state(component, label, word, message))
            continue
        severity = _SEVERITY_OF_WORD[folded]
        if severity is not None:
            said.append(severity)
            findings.append(_incident(label, word, severity, component, message))
    return findings


def _incident(
    label: str, word: str, severity: Severity, component: Component, message: str
) -> Finding:
    """One watch's incident. DCGM names the system only for some watches: an Xid or an
    NVSwitch error comes as "Internal error", the driver's recovery action as "Driver"
    (DcgmHealthWatch.cpp), so the message says what it is about."""
    if (recovery := _RECOVERY_IN_MESSAGE.search(message)) and (
        known := recovery_rule(recovery["name"])
    ):
        text = f"DCGM reports {component}'s recovery action {recovery['name']}: {message}"
        severity, action = known.severity, known.action
        return _finding(RECOVERY_CODE, severity, action, component, text, message, known.deferred)
    if xid := _XID_IN_MESSAGE.search(message):
        return xid_finding(int(xid["xid"]), component, SOURCE, message, message)
    if _PENDING_IN_MESSAGE.search(message):
        text = f"DCGM {label} of {component}: {word}: {message} ({PENDING.why})"
        return PENDING.finding(Layer.GPU, component, SOURCE, text, message)
    for pattern, software in _SOFTWARE:
        if pattern.search(message):
            text = f"DCGM {label} of {component}: {word}: {message} ({software.why})"
            return software.finding(Layer.GPU, component, SOURCE, text, message)
    rule = _rule_for(label)
    if rule is OTHER_RULE and (component.kind == "nvswitch" or _SWITCH_IN_MESSAGE.search(message)):
        rule = SYSTEM_RULES["nvswitch"]
    action = rule.action if severity is Severity.CRITICAL else Action.NONE
    text = f"DCGM {label} of {component}: {word}: {message or 'no message'}"
    if severity is Severity.CRITICAL:
        text += f" ({rule.why})"
    return _finding(rule.code, severity, action, component, text, message)


def _rule_for(label: str) -> Rule:
    key = label.casefold().removesuffix(" system").strip()
    if key.startswith("nvswitch"):
        key = "nvswitch"
    return SYSTEM_RULES.get(key, OTHER_RULE)


def _word(node: object, where: str) -> str:
    return expect_str(expect_object(node, where).get("value"), f"{where}.value").strip()


def _rejoin(overflow: object, where: str) -> str:
    """dcgmi wraps a message into ``overflow`` chunks at word boundaries; join them back."""
    if overflow is None:
        return ""
    chunks = [expect_str(chunk, where).strip() for chunk in expect_list(overflow, where)]
    return " ".join(chunk for chunk in chunks if chunk)


def _unknown_state(component: Component, what: str, word: str, message: str = "") -> Finding:
    text = f"DCGM reports {what} as {word!r}, a state gpuguard cannot judge (not read as healthy)"
    if message:
        text += f": {message}"
    return _finding(UNKNOWN_STATE, Severity.WARNING, Action.NONE, component, text, word)


def _finding(
    code: str,
    severity: Severity,
    action: Action,
    component: Component,
    message: str,
    evidence: str,
    deferred: bool = False,
) -> Finding:
    return Finding(
        Layer.GPU, code, severity, action, component, SOURCE, message, evidence, deferred
    )
