"""DCGM as a GPU health source: dcgmi's health watches and diagnostic, and dcgm-exporter.

The parsers live in :mod:`~gpuguard.checks.dcgm.health`, :mod:`~gpuguard.checks.dcgm.diag`
and :mod:`~gpuguard.checks.dcgm.exporter`; this module reads the artifacts and decides what a
failed read means. ``DcgmCheck`` uses whichever of the two dcgmi outputs it gets: it has no
verdict (raises) only when neither answered. When one answered and the other failed, the
answer stands and the failure becomes an inconclusive finding, so that, say, a hung
``dcgmi diag`` does not hide a memory failure the health watches saw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from gpuguard.checks.base import CheckContext
from gpuguard.checks.dcgm.common import describe_exit
from gpuguard.checks.dcgm.diag import parse_diag
from gpuguard.checks.dcgm.exporter import (
    ExporterSample,
    MetricSample,
    evaluate_exporter,
    parse_exporter_metrics,
)
from gpuguard.checks.dcgm.health import parse_health
from gpuguard.clock import SYSTEM_CLOCK
from gpuguard.errors import CheckError, CheckFailed, CheckTimedOut, ParseError, ToolMissing
from gpuguard.model import (
    CHECK_FAILED,
    CHECK_TIMED_OUT,
    NODE,
    OUTPUT_UNPARSEABLE,
    Action,
    Finding,
    Layer,
    Severity,
)
from gpuguard.sources import Artifact, ToolOutput

T = TypeVar("T")

__all__ = [
    "DcgmCheck",
    "DcgmExporterCheck",
    "ExporterSample",
    "MetricSample",
    "evaluate_exporter",
    "parse_diag",
    "parse_exporter_metrics",
    "parse_health",
]


@dataclass(frozen=True)
class DcgmiPart:
    """One dcgmi output the check reads, and how to parse it."""

    artifact: Artifact
    command: str
    parse: Callable[[ToolOutput], list[Finding]]


# Health first: it is quick, and the slow diagnostic then gets what is left of the budget.
PARTS = (
    DcgmiPart(Artifact.DCGMI_HEALTH, "dcgmi health -c -j", lambda out: parse_health(out.text)),
    DcgmiPart(
        Artifact.DCGMI_DIAG, "dcgmi diag -j", lambda out: parse_diag(out.text, out.exit_code)
    ),
)


class DcgmCheck:
    """DCGM's background health watches and (when enabled or captured) its diagnostic."""

    name: ClassVar[str] = "dcgm"
    layer: ClassVar[Layer] = Layer.GPU

    def run(self, ctx: CheckContext) -> list[Finding]:
        deadline = SYSTEM_CLOCK.monotonic() + ctx.timeout_s
        findings: list[Finding] = []
        missing: list[str] = []
        failed: list[tuple[DcgmiPart, CheckError]] = []
        for part in PARTS:
            try:
                findings += _read_part(ctx, part, deadline - SYSTEM_CLOCK.monotonic())
            except ToolMissing as exc:
                missing.append(str(exc))
            except CheckError as exc:
                failed.append((part, exc))
        if len(missing) == len(PARTS):
            raise ToolMissing("; ".join(missing))
        if len(missing) + len(failed) == len(PARTS):
            raise failed[0][1]  # nothing answered: the failure is the check's outcome
        return findings + [_no_verdict(part, exc) for part, exc in failed]


class DcgmExporterCheck:
    """The counters dcgm-exporter publishes (a scrape of its /metrics page, or a capture)."""

    name: ClassVar[str] = "dcgm-exporter"
    layer: ClassVar[Layer] = Layer.GPU

    def run(self, ctx: CheckContext) -> list[Finding]:
        output = ctx.sources.read(Artifact.DCGM_METRICS, ctx.timeout_s)
        sample = _parsed(
            output, "dcgm-exporter /metrics", lambda out: parse_exporter_metrics(out.text)
        )
        return evaluate_exporter(sample, ctx.expectations.gpus)


def _read_part(ctx: CheckContext, part: DcgmiPart, budget_s: float) -> list[Finding]:
    if budget_s <= 0:
        raise CheckTimedOut(f"{part.command}: no time left of the check's {ctx.timeout_s:g}s")
    output = ctx.sources.read(part.artifact, budget_s)
    return _parsed(output, part.command, part.parse)


def _parsed(output: ToolOutput, command: str, parse: Callable[[ToolOutput], T]) -> T:
    """Parse output; garbage after a non-zero exit is the tool failing, not a format change."""
    try:
        return parse(output)
    except ParseError as exc:
        if output.exit_code == 0:
            raise
        raise CheckFailed(
            f"{command} exited {describe_exit(output.exit_code)} without a usable document: {exc}"
        ) from None


_NO_VERDICT_CODES: tuple[tuple[type[CheckError], str], ...] = (
    (CheckTimedOut, CHECK_TIMED_OUT),
    (ParseError, OUTPUT_UNPARSEABLE),
)


def _no_verdict(part: DcgmiPart, exc: CheckError) -> Finding:
    code = next((c for kind, c in _NO_VERDICT_CODES if isinstance(exc, kind)), CHECK_FAILED)
    return Finding(
        Layer.GPU,
        code,
        Severity.WARNING,
        Action.NONE,
        NODE,
        part.command,
        f"{part.command} gave no verdict: {exc}",
    )
