"""One finished run of the deep suite, and what it says as a verdict.

Shared by the agent (which runs it and publishes the verdict in its report) and the
simulator (which judges simulated measurements by the same rule).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuguard.model import OUTCOME_CODES, CheckResult, Outcome, Severity


@dataclass(frozen=True)
class DeepRun:
    """One finished run of the deep check; ``requested_at`` is the verify stamp it answers."""

    trigger: str  # "schedule" or "verify"
    result: CheckResult
    finished_at: float  # epoch seconds, this node's clock
    requested_at: str | None = None

    @property
    def passed(self) -> bool:
        """A verdict with nothing above INFO; no verdict (no PyTorch, hung) never passes."""
        return self.result.outcome is Outcome.OK and not self.codes

    @property
    def codes(self) -> list[str]:
        """What kept it from passing: problem findings, or the reason there was no verdict."""
        no_verdict = set(OUTCOME_CODES.values())
        return sorted(
            {
                f.code
                for f in self.result.findings
                if f.severity > Severity.INFO or f.code in no_verdict
            }
        )

    @property
    def verdict(self) -> str:
        if self.result.outcome is not Outcome.OK:
            return str(self.result.outcome)
        return "passed" if self.passed else "failed"
