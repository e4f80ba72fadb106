"""The shape every check's rule table shares: what a finding code calls for, and why."""

from __future__ import annotations

from dataclasses import dataclass

from gpuguard.model import Action, Component, Finding, Layer, Severity


@dataclass(frozen=True)
class Rule:
    """The severity and action of one finding code, with the reason for the choice."""

    code: str
    severity: Severity
    action: Action
    why: str
    # The repair waits for running work (``Finding.deferred``): drain and reset.
    deferred: bool = False

    def finding(
        self, layer: Layer, component: Component, source: str, message: str, evidence: str = ""
    ) -> Finding:
        """This rule's finding about ``component``."""
        return Finding(
            layer,
            self.code,
            self.severity,
            self.action,
            component,
            source,
            message,
            evidence,
            self.deferred,
        )


def table(*rules: Rule) -> dict[str, Rule]:
    """A rules table by code; each code has one row."""
    by_code = {rule.code: rule for rule in rules}
    if len(by_code) != len(rules):
        raise ValueError("a rules table names a code twice")
    return by_code
