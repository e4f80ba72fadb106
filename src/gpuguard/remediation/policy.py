"""The remediation policy: every safety limit of the controller, as validated data.

Defaults lean on what the node-repair tools in production use (shared/research/
k8s_remediation.md): Medik8s NHC's 300 s grace for ``Unknown`` and its ``healthyDelay``
flap damping, Karpenter RFC #3192's 10 % per-pool disruption budget, GDC's
``max(3, 10 %)`` repair pacing, AKS's "at least 5 min unhealthy" before its first reboot.
The first rungs of our ladder are cheap and the node is tainted the moment it turns bad,
so the default tolerance (120 s) is far shorter than Karpenter's replace-only 10/30 min.
Errors name the file and the key, like gpuguard's other configuration. The top-level
keys are here; each section (budget, breaker, verify, ...) is a model of ``policy_sections``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from gpuguard.config import describe_invalid, read_yaml_mapping
from gpuguard.errors import ConfigError
from gpuguard.model import Action
from gpuguard.remediation.policy_sections import (
    CODE_SHAPE,
    Attribution,
    Breaker,
    Budget,
    Confirm,
    Correlation,
    Crashes,
    DrainAndReset,
    Positions,
    Preflight,
    Seconds,
    StrictModel,
    Verify,
)

# A GPU that fell off the PCIe bus does not come back by itself (NVIDIA's bucket for Xid 79
# is RESTART_BM): waiting only keeps a dead node in the pool, so act at once.
DEFAULT_TOLERANCES: dict[str, float] = {"XID_79": 0.0, "GPU_FALLEN_OFF_BUS": 0.0}

# A code written without its "_" (XID79), named in the hint for the one meant.
XID_WITHOUT_UNDERSCORE = re.compile(r"(S?XID)([0-9]+)")

# Killing a job twice is cheap (a restarted job may hit a leftover fault once more); every
# heavier rung is tried once before the next one, as AKS's reboot -> reimage -> redeploy.
# 0 switches a rung off (REPLACE: 0 keeps scarce reserved capacity from being handed back).
DEFAULT_MAX_ATTEMPTS: dict[str, int] = {
    "KILL_JOB": 2,
    "RESET_GPU": 1,
    "REBOOT": 1,
    "REPLACE": 1,
}


class Policy(StrictModel):
    """Everything ``decide`` is told besides the fleet's state and the time."""

    pool_label: str = Field(
        default="karpenter.sh/nodepool",
        min_length=1,
        description="Node label whose value names the pool",
    )
    unknown_grace_s: Seconds = Field(
        default=300, description="Unknown counts as unhealthy after this long (NHC: 300 s)"
    )
    agent_timeout_s: Seconds = Field(
        default=600,
        gt=0,
        description="An agent whose report has not changed for this long (the controller's "
        "clock) is silent: what it said was True reads Unknown (keep it above 3x the "
        "agent's heartbeat_interval_s, 180 s)",
    )
    tolerance_s: Seconds = Field(
        default=120, description="A False condition must last this long before any action"
    )
    tolerances: dict[str, Seconds] = Field(
        default_factory=lambda: dict(DEFAULT_TOLERANCES),
        description="Per finding code; merged over the defaults (XID_79 and GPU_FALLEN_OFF_BUS: 0)",
    )
    clear_after_s: Seconds = Field(
        default=60, description="Healthy this long before the taint comes off (flap damping)"
    )
    max_attempts: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default_factory=lambda: dict(DEFAULT_MAX_ATTEMPTS),
        description="Per rung (KILL_JOB, RESET_GPU, REBOOT, REPLACE); merged over the defaults",
    )
    min_action_interval_s: Seconds = Field(
        default=300, description="Least time between two actions on one node (AKS: 5 min)"
    )
    drain_timeout_s: Seconds = Field(
        default=900, description="Give a drain this long (GKE honours PDBs up to 30 min)"
    )
    on_drain_timeout: Literal["quarantine", "force"] = Field(
        default="quarantine",
        description="quarantine: give up the attempt and uncordon; force: delete the pods",
    )
    action_timeout_s: Seconds = Field(
        default=900, description="Wait this long for the agent's answer (a GPU node reboot)"
    )
    verify_timeout_s: Seconds = Field(
        default=600,
        description="Wait this long for a fresh healthy report (a heartbeat and a DCGM cycle)",
    )
    lemon_episodes: int = Field(
        default=3, ge=1, description="This many episodes within the window: replace"
    )
    lemon_window_s: Seconds = Field(default=7 * 24 * 3600)
    budget: Budget = Budget()
    breaker: Breaker = Breaker()
    verify: Verify = Verify()
    karpenter_repair: bool = Field(
        default=False,
        description="Karpenter's node repair runs (feature gate NodeRepair) and acts on the "
        "EKS condition names: a node whose AcceleratedHardwareReady, NetworkingReady or "
        "KernelReady is False is its to replace; gpuguard quarantines it and takes no rung",
    )
    correlation: Correlation = Correlation()
    drain_and_reset: DrainAndReset = DrainAndReset()
    positions: Positions = Positions()
    confirm: Confirm = Confirm()
    crashes: Crashes = Crashes()
    attribution: Attribution = Attribution()
    preflight: Preflight = Preflight()

    @field_validator("tolerances", mode="after")
    @classmethod
    def _merge_tolerances(cls, value: dict[str, float]) -> dict[str, float]:
        """Codes are upper-case (``xid_48`` means XID_48, as rungs are read); a key that
        is no code's shape is refused. A well-formed code is kept even if this version
        never emits it: agents of a newer version may."""
        value = {code.upper(): seconds for code, seconds in value.items()}
        bad = sorted(code for code in value if not CODE_SHAPE.fullmatch(code))
        if bad:
            hints = [_code_hint(code) for code in bad]
            raise ValueError(
                f"not a finding code: {', '.join(hints)} (codes are words joined by '_', "
                "e.g. XID_79, GPU_FALLEN_OFF_BUS, IB_LINK_DOWN)"
            )
        return {**DEFAULT_TOLERANCES, **value}

    @field_validator("max_attempts", mode="after")
    @classmethod
    def _merge_attempts(cls, value: dict[str, int]) -> dict[str, int]:
        value = {rung.upper(): count for rung, count in value.items()}
        unknown = sorted(set(value) - set(DEFAULT_MAX_ATTEMPTS))
        if unknown:
            raise ValueError(
                f"unknown rung {', '.join(unknown)} (rungs: {', '.join(DEFAULT_MAX_ATTEMPTS)})"
            )
        return {**DEFAULT_MAX_ATTEMPTS, **value}

    def attempts_allowed(self, rung: Action) -> int:
        return self.max_attempts.get(rung.name, 0)

    @property
    def history_s(self) -> float:
        """How far back closed episodes matter to any rule (lemons, the breaker): what a
        caller of ``decide`` must keep in the history it passes (positions too)."""
        return max(self.lemon_window_s, self.breaker.window_s, self.positions.window_s)

    def tolerance_for(self, codes: tuple[str, ...]) -> float:
        """How long one False layer must last: its most urgent code wins.

        The soonest expiry, as Karpenter picks among matching repair policies: a finding
        known not to clear by itself (tolerance 0) is not held back by a milder one.
        A layer without codes gets ``tolerance_s``.
        """
        tolerances = (self.tolerances.get(code, self.tolerance_s) for code in codes)
        return min(tolerances, default=self.tolerance_s)


def _code_hint(code: str) -> str:
    xid = XID_WITHOUT_UNDERSCORE.fullmatch(code)
    return f"{code} (did you mean {xid[1]}_{xid[2]}?)" if xid else code


def build_policy(data: Mapping[str, object], origin: str) -> Policy:
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        message = describe_invalid(exc, origin, "remediation policy", _model_at)
        raise ConfigError(message) from None


def load_policy(path: Path) -> Policy:
    """Read and validate a remediation policy YAML file; an empty file gives the defaults."""
    return build_policy(read_yaml_mapping(Path(path), "remediation policy"), origin=str(path))


_SECTIONS: dict[str, type[BaseModel]] = {
    "budget": Budget,
    "breaker": Breaker,
    "verify": Verify,
    "correlation": Correlation,
    "drain_and_reset": DrainAndReset,
    "positions": Positions,
    "confirm": Confirm,
    "crashes": Crashes,
    "attribution": Attribution,
    "preflight": Preflight,
}


def _model_at(loc: list[str]) -> type[BaseModel]:
    return _SECTIONS.get(loc[0], Policy) if len(loc) > 1 else Policy
