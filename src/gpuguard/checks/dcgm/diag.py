"""Parser for ``dcgmi diag -r N -j``, DCGM 4 and DCGM 3 documents alike.

DCGM 4 (NVIDIA's ``dcgm_diag_schema.json``): ``{"DCGM Diagnostic": {"test_categories":
[{"tests": [{"name", "results": [{"entity_group", "entity_id", "status", "warnings":
[{"error_id", "error_severity", "error_category", "warning"}]}], "test_summary"}]}],
"runtime_error"}}``. DCGM 3: top key ``"DCGM GPU Diagnostic"``, results name GPUs by
``"gpu_ids"``/``"gpu_id"`` strings ("0", "0,1"), test names are human ("GPU Memory") and a
warning may be a bare string.

The exit status and the document are read separately: dcgmi exits 226 (-30,
DCGM_ST_NVVS_ERROR) when the diagnostic ran and found a problem, and still prints a complete
document, which is then what we judge. Fail-closed rules:

* a document with no test result at all is not a pass (ParseError);
* a status word we do not know is a finding, never a pass;
* ``runtime_error`` (the diagnostic did not finish) and a non-zero exit that no failing
  result explains are inconclusive findings (``CHECK_FAILED``): the layer reads Unknown;
* ids and severities near 2^63 are DCGM's "no value" sentinels, never codes.

How a failing warning's DCGM severity (the document's ``error_severity``, else the
``error_id``'s row in ``data/dcgm_error_codes.csv``) becomes a verdict:

========  ==================  ========  =========  =========================================
DCGM      code                severity  action     why
========  ==================  ========  =========  =========================================
RESET     DCGM_DIAG_HARDWARE  critical  RESET_GPU  DCGM: drain and reset
ISOLATE   DCGM_DIAG_HARDWARE  critical  RESET_GPU  cannot run work; one run does not justify
                                                   replacing a part, so reset first
TRIAGE    DCGM_DIAG_TRIAGE    warning   NONE       a human looks
CONFIG    DCGM_DIAG_CONFIG    warning   NONE       node misconfigured, not a broken part
MONITOR   DCGM_DIAG_MONITOR   info      NONE       can run work (warning on a Fail result)
other     DCGM_DIAG_FAIL      critical  NONE       failed, cause unclassified: drain for a human
========  ==================  ========  =========  =========================================

Overrides by error id are in :data:`ERROR_OVERRIDES`. A ``Fail`` result is at least a
warning (MONITOR included: a failed test never reads as healthy). A ``Warn`` result caps
the severity at warning, and a repair it still asks for (RESET_GPU and up) is deferred: it
waits for the GPU's running work to end (``Finding.deferred``); warnings on a ``Pass``
result are info; skipped tests are one info finding per test.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources

from gpuguard.checks.dcgm.common import describe_exit, load_dcgmi_json
from gpuguard.checks.dcgm.diag_document import (
    SOURCE,
    DiagWarning,
    EntityResult,
    diagnostic_body,
    read_results,
    runtime_error,
)
from gpuguard.checks.rules import Rule
from gpuguard.errors import ParseError
from gpuguard.model import CHECK_FAILED, NODE, Action, Finding, Layer, Severity


@dataclass(frozen=True)
class ErrorCode:
    """One DCGM_FR_* error code from DCGM's own table."""

    id: int
    name: str
    severity: str
    category: str
    description: str


SEVERITY_NAMES = {1: "MONITOR", 2: "ISOLATE", 3: "UNKNOWN", 4: "TRIAGE", 5: "CONFIG", 6: "RESET"}

VERDICTS: dict[str, Rule] = {
    "RESET": Rule(
        "DCGM_DIAG_HARDWARE", Severity.CRITICAL, Action.RESET_GPU, "DCGM: drain and reset the GPU"
    ),
    "ISOLATE": Rule(
        "DCGM_DIAG_HARDWARE",
        Severity.CRITICAL,
        Action.RESET_GPU,
        "DCGM: the GPU cannot run work; drain and reset it first (one run does not justify "
        "replacing a part)",
    ),
    "TRIAGE": Rule("DCGM_DIAG_TRIAGE", Severity.WARNING, Action.NONE, "DCGM: needs triage"),
    "CONFIG": Rule(
        "DCGM_DIAG_CONFIG", Severity.WARNING, Action.NONE, "node misconfigured, not a broken part"
    ),
    "MONITOR": Rule("DCGM_DIAG_MONITOR", Severity.INFO, Action.NONE, "DCGM: can run work"),
}
UNCLASSIFIED = Rule(
    "DCGM_DIAG_FAIL",
    Severity.CRITICAL,
    Action.NONE,
    "the test failed for a reason DCGM does not classify: drained for a human",
)
WARNED = Rule("DCGM_DIAG_WARN", Severity.WARNING, Action.NONE, "the test warned")

# Where an error id calls for something other than its severity's verdict.
ERROR_OVERRIDES: dict[int, Rule] = {
    120: Rule(  # DCGM_FR_FALLEN_OFF_BUS
        "DCGM_DIAG_HARDWARE",
        Severity.CRITICAL,
        Action.REBOOT,
        "GPU fell off the bus: restart the node (as for Xid 79)",
    ),
    122: Rule(  # DCGM_FR_IMEX_UNHEALTHY
        "DCGM_DIAG_TRIAGE",
        Severity.WARNING,
        Action.NONE,
        "IMEX is software, and DCGM reports it falsely on single-node systems (NVSentinel #1471)",
    ),
    126: Rule(  # DCGM_FR_GPU_RECOVERY_REBOOT
        "DCGM_DIAG_HARDWARE", Severity.CRITICAL, Action.REBOOT, "the driver asks for a reboot"
    ),
}


@dataclass
class _Tally:
    findings: list[Finding] = field(default_factory=list)
    skipped: dict[str, list[EntityResult]] = field(default_factory=dict)


@cache
def error_codes() -> dict[int, ErrorCode]:
    """DCGM_FR_* codes by id, loaded once from the package data."""
    text = resources.files("gpuguard").joinpath("data/dcgm_error_codes.csv").read_text()
    return {
        int(row["error_id"]): ErrorCode(
            int(row["error_id"]), row["name"], row["severity"], row["category"], row["description"]
        )
        for row in csv.DictReader(text.splitlines())
    }


def parse_diag(text: str, exit_code: int) -> list[Finding]:
    """Findings from one ``dcgmi diag -j`` run; raises ParseError unless it is a full document."""
    document = load_dcgmi_json(text, SOURCE)
    body = diagnostic_body(document)
    stopped = runtime_error(body)
    results = read_results(body)
    if not results and stopped is None:
        raise ParseError(f"{SOURCE}: the document holds no test result (not a pass)")
    tally = _Tally()
    if stopped is not None:
        message = f"the diagnostic did not finish: {stopped}"
        tally.findings.append(_inconclusive(message, stopped))
    for result in results:
        _judge(result, tally)
    tally.findings += [_skipped(test, skipped) for test, skipped in tally.skipped.items()]
    if results and all(r.status == "skip" for r in results):
        tally.findings.append(_nothing_tested(len(results)))
    explained = stopped is not None or any(r.status in ("fail", "warn", None) for r in results)
    if exit_code != 0 and not explained:
        tally.findings.append(
            _inconclusive(
                f"dcgmi diag exited {describe_exit(exit_code)} although its document reports no "
                "failure; not taken as a pass",
                f"exit status {exit_code}",
            )
        )
    return tally.findings


def _judge(result: EntityResult, tally: _Tally) -> None:
    status = result.status
    if status == "skip":
        tally.skipped.setdefault(result.test, []).append(result)
    elif status is None:
        why = "a status word gpuguard does not know: not read as a pass"
        unknown = Rule("DCGM_DIAG_UNKNOWN_STATUS", Severity.WARNING, Action.NONE, why)
        tally.findings.append(_finding(result, unknown, None))
    elif not result.warnings:
        if status in ("fail", "warn"):
            tally.findings.append(_finding(result, UNCLASSIFIED if status == "fail" else WARNED))
    else:
        for warning in result.warnings:
            tally.findings.append(_finding(result, _verdict(warning, status), warning))


def _verdict(warning: DiagWarning, status: str) -> Rule:
    if status == "pass":
        return Rule(
            "DCGM_DIAG_PASSED_WITH_WARNING", Severity.INFO, Action.NONE, "the test still passed"
        )
    verdict = ERROR_OVERRIDES.get(warning.error_id or 0) or VERDICTS.get(
        _severity_name(warning), UNCLASSIFIED
    )
    if status == "warn" and verdict.severity > Severity.WARNING:
        # The test only warned: the GPU still runs work, so a repair it asks for is
        # deferred until that work ends (drain and reset) rather than dropped or done now.
        capped = f"{verdict.why} (the test only warned)"
        deferred = verdict.action >= Action.RESET_GPU
        return replace(verdict, severity=Severity.WARNING, why=capped, deferred=deferred)
    if status == "fail" and verdict.severity < Severity.WARNING:
        # A failed test never reads as healthy, even when DCGM says its error only wants
        # watching (MONITOR): flagged, nothing repaired.
        floor = f"{verdict.why}, but the test failed"
        return replace(verdict, severity=Severity.WARNING, why=floor)
    return verdict


def _severity_name(warning: DiagWarning) -> str:
    """The document's own severity when it gives a usable one, else DCGM's table."""
    named = SEVERITY_NAMES.get(warning.severity_value or 0)
    if named in VERDICTS:
        return named
    known = error_codes().get(warning.error_id or 0)
    return known.severity if known else "UNKNOWN"


def _finding(result: EntityResult, verdict: Rule, warning: DiagWarning | None = None) -> Finding:
    detail = ""
    if warning is not None:
        known = error_codes().get(warning.error_id or 0)
        label = f"{known.name} ({known.severity}, {known.category}): " if known else ""
        detail = f": {label}{warning.text or 'no message'}"
    message = f"{result.test} on {result.component}: {result.word}{detail} ({verdict.why})"
    return verdict.finding(Layer.GPU, result.component, SOURCE, message, result.evidence)


def _skipped(test: str, results: list[EntityResult]) -> Finding:
    components = sorted({r.component for r in results})
    component = components[0] if len(components) == 1 else NODE
    reasons = sorted({w.text for r in results for w in r.warnings if w.text})
    message = f"{test} skipped on {', '.join(c.id for c in components)}"
    if reasons:
        message += ": " + "; ".join(reasons)
    return Finding(
        Layer.GPU,
        "DCGM_DIAG_SKIPPED",
        Severity.INFO,
        Action.NONE,
        component,
        SOURCE,
        message,
        results[0].evidence,
    )


def _nothing_tested(count: int) -> Finding:
    return Finding(
        Layer.GPU,
        "DCGM_DIAG_NOTHING_TESTED",
        Severity.WARNING,
        Action.NONE,
        NODE,
        SOURCE,
        f"all {count} diagnostic results were skipped: nothing was tested, not a pass",
    )


def _inconclusive(message: str, evidence: str) -> Finding:
    # CHECK_FAILED marks the finding inconclusive, so the GPU layer reads Unknown.
    return Finding(
        Layer.GPU, CHECK_FAILED, Severity.WARNING, Action.NONE, NODE, SOURCE, message, evidence
    )
