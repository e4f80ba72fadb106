"""The findings the agent makes of in-job verdicts and of its passive clock sampling.

The real codes are being added to ``gpuguard.checks`` and the agent (issue 17); the
simulator states here the rules it assumes for them, and builds the findings with
``model.Finding`` so that they go through the same ``runner.assess`` and layer reports as
every other check's:

- ``IN_JOB_FAIL_SLOW``: a rank's compute is consistently slower than its peers' (the job's
  ``FAIL_SLOW`` verdict). Warning, replace, deferred: its answers are right, so the repair
  waits for the job's next checkpoint.
- ``IN_JOB_REPLICA_MISMATCH``: a replica's parameters differ from the majority's (the
  job's ``REPLICA_MISMATCH`` verdict). Critical, replace, at once: results are wrong.
- ``LOAD_CLOCK_BELOW_SIBLINGS``: under load a GPU clocks below its same-model siblings
  with a throttle reason. Warning, reset, deferred.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuguard.model import Action, CheckResult, Finding, Layer, Outcome, Severity, gpu
from gpuguard.sim.faults import gpu_bus_id

FAIL_SLOW = "IN_JOB_FAIL_SLOW"
REPLICA_MISMATCH = "IN_JOB_REPLICA_MISMATCH"
LOAD_CLOCK = "LOAD_CLOCK_BELOW_SIBLINGS"


@dataclass(frozen=True)
class Rule:
    severity: Severity
    action: Action
    source: str
    message: str


RULES = {
    FAIL_SLOW: Rule(
        Severity.WARNING, Action.REPLACE, "in-job", "the job's ranks name this GPU slow"
    ),
    REPLICA_MISMATCH: Rule(
        Severity.CRITICAL,
        Action.REPLACE,
        "in-job",
        "this GPU's replica differs from the majority: its results are wrong",
    ),
    LOAD_CLOCK: Rule(
        Severity.WARNING,
        Action.RESET_GPU,
        "nvml-load",
        "under load this GPU clocks below its siblings, with a throttle reason",
    ),
}


@dataclass(frozen=True, order=True)
class InJobFinding:
    """One in-job or passive finding on one GPU (hashable: part of the agent view's key).
    ``deferred`` goes False once the job has saved a checkpoint after a fail-slow verdict
    (the verdict file's ``checkpointed_at``): the repair need not wait any longer."""

    code: str
    gpu: int
    deferred: bool


def in_job_result(findings: tuple[InJobFinding, ...]) -> CheckResult:
    """The check result the agent would fold into the GPU layer."""
    built = []
    for found in findings:
        rule = RULES[found.code]
        built.append(
            Finding(
                Layer.GPU,
                found.code,
                rule.severity,
                rule.action,
                gpu(gpu_bus_id(found.gpu)),
                rule.source,
                rule.message,
                deferred=found.deferred,
            )
        )
    return CheckResult("in-job", Layer.GPU, Outcome.OK, built)
