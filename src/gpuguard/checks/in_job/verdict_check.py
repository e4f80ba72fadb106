"""The verdicts running jobs wrote about their own ranks on this node (check ``in-job``).

A job's ranks time their steps and compare their parameters (``gpuguard.training``); the
rank a verdict names writes it on its own node, into the directory this check reads. A
verdict holds until its job withdraws it (the GPU recovered) or a repair of the GPU it
names forgets it; a job that ends leaves it standing. A fail-slow verdict is also
forgotten when the deep suite, started after it was written, passes: slowness a second
measurement does not confirm is not acted on (docs/remediation.md, "Confirming slowness").
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import ClassVar

from gpuguard.checks.base import CheckContext
from gpuguard.checks.in_job.rules import (
    IN_JOB_COMPUTE_MISMATCH,
    IN_JOB_FAIL_SLOW,
    IN_JOB_LINK_SLOW,
    IN_JOB_REPLICA_MISMATCH,
    IN_JOB_VERDICT_INVALID,
    RULES,
)
from gpuguard.clock import SYSTEM_CLOCK
from gpuguard.errors import CheckFailed, ToolMissing
from gpuguard.model import NODE, Component, Finding, Layer, Severity, gpu
from gpuguard.training.verdicts import (
    NODE_NAME_ENV,
    Verdict,
    VerdictKind,
    read_verdicts,
    withdraw_verdict,
)

SOURCE = "in-job"
_CODE = {
    VerdictKind.FAIL_SLOW: (IN_JOB_FAIL_SLOW, Layer.GPU),
    VerdictKind.LINK_SLOW: (IN_JOB_LINK_SLOW, Layer.NETWORK),
    VerdictKind.REPLICA_MISMATCH: (IN_JOB_REPLICA_MISMATCH, Layer.GPU),
    VerdictKind.COMPUTE_MISMATCH: (IN_JOB_COMPUTE_MISMATCH, Layer.GPU),
}
_MISMATCHED = {
    VerdictKind.REPLICA_MISMATCH: "parameters differ from the other replicas'",
    VerdictKind.COMPUTE_MISMATCH: "gradients of the probe batch differ from the other replicas'",
}


class InJobCheck:
    name: ClassVar[str] = "in-job"
    layer: ClassVar[Layer] = Layer.GPU

    def __init__(self, node: str | None = None) -> None:
        """``node``: this node's name (default ``$NODE_NAME``); a verdict about another
        node is reported, not acted on. None and no variable: not compared."""
        self.node = node if node is not None else os.environ.get(NODE_NAME_ENV) or None

    def run(self, ctx: CheckContext) -> list[Finding]:
        directory = ctx.sources.in_job_root()
        if directory is None:
            raise ToolMissing("in_job.directory is null: job verdicts are not read")
        if not directory.exists():
            return []  # no job on this node has written one yet
        if not directory.is_dir():
            raise CheckFailed(f"{directory}: the in-job verdict directory is not a directory")
        verdicts, errors = read_verdicts(directory)
        findings = [_invalid(NODE, str(error)) for error in errors]
        now = SYSTEM_CLOCK.now()
        for verdict in verdicts:
            if self.node is not None and verdict.node != self.node:
                why = f"{verdict.file_name()}: written for node {verdict.node!r}, not {self.node!r}"
                findings.append(_invalid(component_of(verdict), why))
                continue
            findings.append(finding_for(verdict, now))
        return findings


def component_of(verdict: Verdict) -> Component:
    return gpu(verdict.gpu) if verdict.gpu else NODE


def finding_for(verdict: Verdict, now: float) -> Finding:
    """The finding a verdict stands for. A fail-slow waits for the job's next checkpoint;
    once the job has saved one, the repair need wait no longer. A verdict its job stopped
    refreshing still stands: the job ended or crashed, the GPU it judged did not get
    better (its repair forgets it; a job that sees the GPU recover withdraws it)."""
    code, layer = _CODE[verdict.kind]
    component = component_of(verdict)
    where = f"rank {verdict.rank} of {verdict.world_size} of job {verdict.job}"
    if verdict.kind in _MISMATCHED:
        message = f"{where}: {_MISMATCHED[verdict.kind]}"
    else:
        part = "compute" if verdict.kind is VerdictKind.FAIL_SLOW else "communication"
        message = f"{where}: {part} {verdict.ratio:.2f}x its peers' median"
    lasting = max(0.0, verdict.written_at - verdict.since)
    evidence = (
        f"steps {verdict.steps[0]}-{verdict.steps[1]}, for {lasting:.0f}s; {verdict.evidence}"
    )
    if verdict.lapsed(now):
        evidence += f"; not refreshed for {now - verdict.written_at:.0f}s (the job has ended)"
    found = RULES[code].finding(layer, component, SOURCE, _prefixed(component, message), evidence)
    if found.deferred and verdict.checkpointed_at is not None:
        message = f"{found.message}; checkpoint saved: repair now"
        return dataclasses.replace(
            found, severity=Severity.CRITICAL, deferred=False, message=message
        )
    return found


def forget_verdicts(
    directory: Path | None,
    gpus: Iterable[str],
    before: float,
    kinds: Collection[VerdictKind] = tuple(VerdictKind),
) -> int:
    """A repair finished at ``before``, or a measurement began then: delete the verdicts
    of ``kinds`` it answered (those naming ``gpus``, every one when ``gpus`` is empty) not
    refreshed since. How many."""
    if directory is None or not directory.is_dir():
        return 0
    named = {gpu(bus).id for bus in gpus}
    verdicts, _ = read_verdicts(directory)
    gone = 0
    for verdict in verdicts:
        answered = not named or component_of(verdict).id in named
        if verdict.written_at <= before and answered and verdict.kind in kinds:
            withdraw_verdict(directory, verdict.job, verdict.rank)
            gone += 1
    return gone


def _prefixed(component: Component, message: str) -> str:
    return message if component == NODE else f"{component.id}: {message}"


def _invalid(component: Component, why: str) -> Finding:
    return RULES[IN_JOB_VERDICT_INVALID].finding(Layer.GPU, component, SOURCE, why)
