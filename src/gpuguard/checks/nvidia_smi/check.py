"""The nvidia-smi check: the GPU facts of ``nvidia-smi -q -x``, or of ``-q`` without XML.

Parsing lives in :mod:`~gpuguard.checks.nvidia_smi.xml_format` and
:mod:`~gpuguard.checks.nvidia_smi.text_format`;
what the facts mean is decided by :func:`~gpuguard.checks.gpu_facts.evaluate_gpus`, the
same as for NVML.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from gpuguard.checks.base import CheckContext
from gpuguard.checks.gpu_facts import evaluate_gpus
from gpuguard.checks.gpu_rules import RULES
from gpuguard.checks.load.figures import expected_figures
from gpuguard.checks.nvidia_smi.common import SmiReport, split_lost_gpus
from gpuguard.checks.nvidia_smi.text_format import parse_smi_text, read_smi_text
from gpuguard.checks.nvidia_smi.xml_format import parse_smi_xml, read_smi_xml
from gpuguard.errors import CheckFailed, ParseError, ToolMissing
from gpuguard.model import NODE, Action, Finding, Layer, Severity
from gpuguard.sources import Artifact, ToolOutput

__all__ = ["SmiCheck", "parse_smi_text", "parse_smi_xml"]

SOURCE = "nvidia-smi"


class SmiCheck:
    """GPU health from nvidia-smi's full query report."""

    name: ClassVar[str] = SOURCE
    layer: ClassVar[Layer] = Layer.GPU

    def run(self, ctx: CheckContext) -> list[Finding]:
        read: Callable[[str], SmiReport]
        try:
            output = ctx.sources.read(Artifact.NVIDIA_SMI_XML, ctx.timeout_s)
            read = read_smi_xml
        except ToolMissing:
            output = ctx.sources.read(Artifact.NVIDIA_SMI_TEXT, ctx.timeout_s)
            read = read_smi_text
        report = _parse(output, read)
        figures = expected_figures(ctx.config.deep)
        findings = evaluate_gpus(report.gpus, ctx.expectations.gpus, SOURCE, figures)
        if len(report.gpus) < report.attached_gpus:
            findings.insert(0, _unlisted_gpus(report))
        if report.only:
            findings.insert(0, _filtered(report))
        return findings


def _filtered(report: SmiReport) -> Finding:
    only = ", ".join(report.only)
    return Finding(
        Layer.GPU,
        "NVIDIA_SMI_REPORT_FILTERED",
        Severity.INFO,
        Action.NONE,
        NODE,
        SOURCE,
        f"an nvidia-smi -q -d report: only {only} judged",
        f"sections={only}",
    )


def _parse(output: ToolOutput, read: Callable[[str], SmiReport]) -> SmiReport:
    """The report; a failed run whose output is unreadable is a failure, not garbage. An
    output that is nothing but "Unable to determine the device handle" messages (nvidia-smi
    stops there, exit status non-zero) is a report of those lost GPUs."""
    try:
        return read(output.text)
    except ParseError as exc:
        rest, lost = split_lost_gpus(output.text)
        if lost and not any(line.strip() for line in rest):
            return SmiReport(len(lost), lost)
        if output.exit_code != 0:
            raise CheckFailed(f"{output.origin} exited {output.exit_code}: {exc}") from exc
        raise


def _unlisted_gpus(report: SmiReport) -> Finding:
    message = (
        f"nvidia-smi counts {report.attached_gpus} attached GPUs "
        f"but reports on only {len(report.gpus)}"
    )
    evidence = f"attached_gpus={report.attached_gpus} gpus_reported={len(report.gpus)}"
    return RULES["GPU_NOT_REPORTED"].finding(Layer.GPU, NODE, SOURCE, message, evidence)
