"""The ``plugins:`` settings: a team's own check programs, run like the built-in checks.

The contract a plugin keeps is in docs/checks.md, "Custom checks". What a plugin's finding
does to the node is the operator's word, here, never the plugin's: its code picks the
severity and action from ``codes``; an unmapped code keeps the plugin's severity and asks
for no repair (a critical one still quarantines the node).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpuguard.model import Action, Layer, Severity

PLUGIN_PREFIX = "plugin-"
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
CODE_PATTERN = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
SeverityName = Literal["info", "warning", "critical"]
ActionName = Literal["NONE", "KILL_JOB", "RESET_GPU", "REBOOT", "REPLACE"]


class CodeMapping(BaseModel):
    """What one of the plugin's codes means to gpuguard."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    severity: SeverityName = Field(description="info, warning or critical")
    action: ActionName = Field(default="NONE", description="The repair it asks for")

    @property
    def as_severity(self) -> Severity:
        return Severity[self.severity.upper()]

    @property
    def as_action(self) -> Action:
        return Action[self.action]


class PluginConfig(BaseModel):
    """One check program: how to run it, how often, and how to read what it says."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        pattern=NAME_PATTERN,
        description="Lower-case letters, digits, dashes; the check is named plugin-<name>",
    )
    command: list[str] = Field(
        min_length=1, description="The program (absolute path or on PATH) and its arguments"
    )
    layer: Layer = Field(
        default=Layer.KERNEL, description="gpu, network or kernel: the condition it speaks to"
    )
    interval_s: float = Field(default=60.0, gt=0, le=86400, description="Run period")
    timeout_s: float = Field(
        default=10.0, gt=0, le=3600, description="Killed past this; its verdict is Unknown"
    )
    output: Literal["exit-code", "json"] = Field(
        default="exit-code",
        description="exit-code: 0 OK, 1 a problem, anything else Unknown (node-problem-"
        "detector's convention); json: a findings document on stdout",
    )
    problem_code: str | None = Field(
        default=None,
        description="exit-code: the finding's code for exit status 1 (default PLUGIN_<NAME>)",
    )
    problem_severity: SeverityName = Field(
        default="critical", description="exit-code: the severity of exit status 1"
    )
    codes: dict[str, CodeMapping] = Field(
        default_factory=dict,
        description="The plugin's codes mapped to a severity and an action (overrides its own)",
    )

    @field_validator("command", mode="after")
    @classmethod
    def _program_named(cls, value: list[str]) -> list[str]:
        if not value[0].strip():
            raise ValueError("the first word must name the program")
        return value

    @field_validator("problem_code", mode="after")
    @classmethod
    def _code_shape(cls, value: str | None) -> str | None:
        if value is not None and not CODE_PATTERN.match(value):
            raise ValueError("a code is upper-case letters, digits and _ (like NFS_STALE)")
        return value

    @field_validator("codes", mode="after")
    @classmethod
    def _codes_shape(cls, value: dict[str, CodeMapping]) -> dict[str, CodeMapping]:
        bad = sorted(code for code in value if not CODE_PATTERN.match(code))
        if bad:
            raise ValueError(f"{', '.join(bad)}: a code is upper-case letters, digits and _")
        return value

    @property
    def check_name(self) -> str:
        return PLUGIN_PREFIX + self.name

    @property
    def exit_problem_code(self) -> str:
        return self.problem_code or "PLUGIN_" + self.name.upper().replace("-", "_")


def unique_names(plugins: list[PluginConfig]) -> list[PluginConfig]:
    """The list, if no two plugins share a name (their checks, metrics and timers would)."""
    names = [p.name for p in plugins]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"plugin name {', '.join(twice)} is used twice")
    return plugins
