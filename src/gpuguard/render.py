"""Human and machine renderings of a node report."""

from __future__ import annotations

import json
import textwrap

from gpuguard.model import NodeReport, Severity, Status

_MARK = {
    Status.HEALTHY: "ok",
    Status.DEGRADED: "!!",
    Status.UNKNOWN: "??",
    Status.UNHEALTHY: "XX",
}


# The version of `gpuguard check --json`'s document (docs/checks.md, "JSON output"): a
# change that removes or renames a field gets a new one.
CHECK_SCHEMA = "gpuguard.io/check/v1"


def to_json(report: NodeReport, **extra: object) -> str:
    return json.dumps({"schema": CHECK_SCHEMA, **report.to_dict(), **extra}, indent=2)


def to_table(report: NodeReport, *, verbose: bool = False, width: int = 100) -> str:
    """A readable summary: one block per layer, worst findings first.

    Informational findings (a tool that is not installed, a fact the source cannot
    measure) are only listed with ``verbose``.
    """
    lines = [f"node: {report.status} (recommended action: {report.action})"]
    for layer, health in report.layers.items():
        answered = ", ".join(health.answered_by) or "no source answered: " + ", ".join(
            health.not_answered
        )
        lines.append(f"\n[{_MARK[health.status]}] {layer:<8} {health.status:<10} via {answered}")
        shown = [f for f in health.findings if verbose or f.severity > Severity.INFO]
        hidden = len(health.findings) - len(shown)
        for finding in shown:
            head = f"  {finding.severity!s:<8} {finding.code:<26} {finding.action!s:<9} "
            named = finding.component.id in finding.message
            subject = "" if named else f"{finding.component}: "
            body = f"{subject}{finding.message} [{finding.source}]"
            wrapped = textwrap.wrap(body, width=max(40, width - len(head)))
            lines.append(head + wrapped[0])
            lines.extend(" " * len(head) + rest for rest in wrapped[1:])
        if hidden:
            lines.append(f"  ({hidden} informational finding(s); --verbose shows them)")
    return "\n".join(lines)
