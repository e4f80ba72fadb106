"""What a preflight run found, as the result the init container writes: the local load
check's results judged fail closed, then the gang check's verdict for this member.

A finding that takes a layer out of service (critical, or a deferred repair such as a slow
GPU) fails the preflight; so does a check that gave no verdict (hung, crashed, no GPU
seen: the pod asked for GPUs). An image without PyTorch fails it too, as ``NOT_EQUIPPED``:
the setup's fault, which the controller never holds against the node. A warning alone
(Degraded) passes, with its codes listed: a preflight that blocked every start on a mere
degradation would stall jobs on nodes the policy keeps in service. The adapters'
loopback check may find nothing to test
(no RDMA port, no perftest): that is a note, not a failure.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuguard.checks.gang.rendezvous import GangSpec
from gpuguard.checks.gang.series import GangOutcome
from gpuguard.contract.gpu_ids import normal_gpu_id
from gpuguard.contract.preflight import FAILED, NOT_EQUIPPED, PASSED, PreflightResult
from gpuguard.model import CheckResult, Finding, Outcome, Severity

# Checks whose "nothing here to test" is a fact about the node, not a missing verdict.
OPTIONAL_CHECKS = frozenset({"deep-network"})
_QUIET = (Outcome.NOT_APPLICABLE, Outcome.TOOL_MISSING)


def local_result(results: Sequence[CheckResult]) -> PreflightResult:
    """Passed, Passed with warnings (codes listed), or Failed naming codes and GPUs."""
    if not results:
        return PreflightResult(FAILED, ("CHECK_FAILED",), message="no check ran")
    blocking: list[Finding] = []
    warnings: list[Finding] = []
    notes: list[str] = []
    missing: list[str] = []
    for result in results:
        if result.outcome is not Outcome.OK:
            if result.check in OPTIONAL_CHECKS and result.outcome in _QUIET:
                notes.append(result.detail)
            elif result.outcome is Outcome.TOOL_MISSING:
                missing.append(result.detail)
            else:
                blocking.extend(result.findings)
            continue
        for finding in result.findings:
            if finding.severity is Severity.CRITICAL or finding.deferred:
                blocking.append(finding)
            elif finding.severity > Severity.INFO:
                warnings.append(finding)
    listed = blocking or warnings
    codes = tuple(dict.fromkeys(f.code for f in listed))
    gpus = tuple(
        sorted({normal_gpu_id(f.component.id) for f in listed if f.component.kind == "gpu"})
    )
    if blocking:
        return PreflightResult(FAILED, codes, gpus, message=_messages(blocking))
    if missing:  # nothing was measured: the image's fault, not the node's
        message = "; ".join(missing) + " (preflight.image must carry it: docs/preflight.md)"
        return PreflightResult(FAILED, (NOT_EQUIPPED,), message=message)
    if warnings:
        return PreflightResult(
            PASSED, codes, gpus, message="load check passed with warnings: " + _messages(warnings)
        )
    return PreflightResult(PASSED, message="; ".join(["load check passed", *notes]))


def with_gang(local: PreflightResult, spec: GangSpec, outcome: GangOutcome) -> PreflightResult:
    """This member's result after the gang check: it fails only when it is the member named
    slow; the others pass and list the named node(s) in ``slow_nodes``."""
    verdict = outcome.verdict
    if verdict is None:
        return _add(local, status=local.status, codes=(), slow=(), note=outcome.note)
    me = next((m for m in verdict.members if m.timings.rank == spec.rank), None)
    if me is not None and me.slow:
        return _add(
            local, status=FAILED, codes=verdict.codes, slow=verdict.slow_nodes, note=verdict.message
        )
    listed = tuple(c for c in verdict.codes if not verdict.slow_nodes)  # gang-wide slowness only
    return _add(
        local, status=local.status, codes=listed, slow=verdict.slow_nodes, note=verdict.message
    )


def _add(
    local: PreflightResult, *, status: str, codes: tuple[str, ...], slow: tuple[str, ...], note: str
) -> PreflightResult:
    return PreflightResult(
        status,
        tuple(dict.fromkeys((*local.codes, *codes))),
        local.gpus,
        slow,
        f"{note}; {local.message}" if note else local.message,
    )


def _messages(findings: Sequence[Finding]) -> str:
    return "; ".join(dict.fromkeys(f.message for f in findings))
