"""What the agent makes of in-job verdicts and of its clock sampling under load: the real
code (``checks.in_job``), from the simulator's compact key.

A verdict is built as the ``training.verdicts.Verdict`` a job would write and turned into
its finding by ``checks.in_job.verdict_check.finding_for``: ``IN_JOB_FAIL_SLOW`` (replace,
deferred until the job has saved a checkpoint after the verdict, then critical and at
once), ``IN_JOB_REPLICA_MISMATCH`` and ``IN_JOB_COMPUTE_MISMATCH`` (critical, replace,
at once). A GPU clocked below
its busy siblings is the ``LOAD_CLOCK_BELOW_SIBLINGS`` finding of the ``load-clocks``
rules (reset, deferred).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuguard.checks.in_job.load_clocks import SOURCE as LOAD_CLOCKS
from gpuguard.checks.in_job.rules import LOAD_CLOCK_BELOW_SIBLINGS, RULES
from gpuguard.checks.in_job.verdict_check import SOURCE as IN_JOB
from gpuguard.checks.in_job.verdict_check import finding_for
from gpuguard.model import CheckResult, Finding, Layer, Outcome, gpu
from gpuguard.sim.faults import gpu_bus_id
from gpuguard.training.verdicts import Verdict, VerdictKind

FAIL_SLOW = str(VerdictKind.FAIL_SLOW)
REPLICA_MISMATCH = str(VerdictKind.REPLICA_MISMATCH)
COMPUTE_MISMATCH = str(VerdictKind.COMPUTE_MISMATCH)
LOAD_CLOCK = LOAD_CLOCK_BELOW_SIBLINGS


@dataclass(frozen=True, order=True)
class InJobFinding:
    """One verdict (``kind`` a ``VerdictKind``) or a load-clock finding on one GPU:
    hashable, part of the agent view's key. ``checkpointed``: the job has saved a
    checkpoint since the verdict (the verdict file's ``checkpointed_at``)."""

    kind: str
    gpu: int
    checkpointed: bool = False


def in_job_result(found: tuple[InJobFinding, ...]) -> CheckResult:
    """The results the agent's ``in-job`` and ``load-clocks`` checks fold into the GPU
    layer (one result: ``runner.assess`` reads their findings alike)."""
    return CheckResult(IN_JOB, Layer.GPU, Outcome.OK, [_finding(f) for f in found])


def _finding(found: InJobFinding) -> Finding:
    bus = gpu_bus_id(found.gpu)
    if found.kind == LOAD_CLOCK:
        message = f"{gpu(bus).id}: SM clock under load below its busy siblings'"
        return RULES[LOAD_CLOCK].finding(Layer.GPU, gpu(bus), LOAD_CLOCKS, message)
    verdict = Verdict(
        kind=VerdictKind(found.kind),
        job="simulated",
        rank=0,
        world_size=0,
        node="simulated",
        gpu=bus,
        since=0.0,
        written_at=0.0,
        ratio=0.0,
        steps=(0, 0),
        evidence="simulated",
        checkpointed_at=0.0 if found.checkpointed else None,
    )
    return finding_for(verdict, now=0.0)
