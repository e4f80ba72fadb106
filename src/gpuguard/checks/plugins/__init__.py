"""Custom checks: a team's own programs run through the fail-closed runner (docs/checks.md)."""
