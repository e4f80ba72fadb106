"""What each GPU finding code means: its severity, action and deferral with the reason for
the choice (:data:`RULES`), the thresholds the rules judge by, and the verdict one rule gives.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuguard.checks.rules import Rule, table
from gpuguard.model import Action, Severity

# Severity, action and deferral of each finding code, with the reason for the choice.
RULES: dict[str, Rule] = table(
    # More GPUs than expected harms nothing (the expectation is stale): see
    # gpu_facts._count_mismatch.
    Rule(
        "GPU_COUNT_MISMATCH",
        Severity.CRITICAL,
        Action.REBOOT,
        "fewer GPUs than expected: one fell off the bus or failed to initialise, and a"
        " reboot re-enumerates the bus",
    ),
    Rule(
        "GPU_NOT_REPORTED",
        Severity.CRITICAL,
        Action.REBOOT,
        "nvidia-smi counts a GPU it does not describe: it could not be queried, which is"
        " treated like a GPU missing from the expected count",
    ),
    Rule(
        "GPU_LOST",
        Severity.CRITICAL,
        Action.REBOOT,
        "a lost GPU has fallen off the bus; a GPU reset cannot reach it",
    ),
    Rule("GPU_RESET_REQUIRED", Severity.CRITICAL, Action.RESET_GPU, "the GPU asks for a reset"),
    Rule(
        "GPU_ERROR",
        Severity.CRITICAL,
        Action.RESET_GPU,
        "any other error from the GPU itself: try the least disruptive repair first",
    ),
    Rule(
        "ECC_UNCORRECTABLE_VOLATILE",
        Severity.CRITICAL,
        Action.RESET_GPU,
        "any uncorrectable error since the last reset may have corrupted a job's data",
    ),
    Rule(
        "ROW_REMAP_FAILURE",
        Severity.CRITICAL,
        Action.REPLACE,
        "a failing row that no spare could replace: the memory is beyond in-field repair",
    ),
    # Deferred: the failing row is already out of use, so its jobs may finish first.
    Rule(
        "ROW_REMAP_PENDING",
        Severity.CRITICAL,
        Action.RESET_GPU,
        "the spare row takes effect only after a reset: no new work until then (DCGM's"
        " DCGM_FR_PENDING_ROW_REMAP severity is RESET; NVIDIA's recovery action, drain and"
        " reset)",
        deferred=True,
    ),
    Rule(
        "REMAP_STATUS_UNAVAILABLE",
        Severity.INFO,
        Action.NONE,
        "NVML cannot read remap state while MIG is on: say it was not measured rather than"
        " fail every MIG node for good",
    ),
    Rule(
        "ROW_REMAP_UNCORRECTABLE_HIGH",
        Severity.WARNING,
        Action.NONE,
        "DCGM warns at ROW_REMAP_UNCORRECTABLE_WARN remaps: spare rows are running out",
    ),
    Rule(
        "RETIRED_PAGES_PENDING",
        Severity.WARNING,
        Action.RESET_GPU,
        "pre-Ampere page retirement, like a remap, is applied at the next reset",
        deferred=True,
    ),
    Rule(
        "RETIRED_PAGES_LIMIT",
        Severity.CRITICAL,
        Action.REPLACE,
        "the page-retirement table is (nearly) full: the next weak page cannot be retired,"
        " so the memory is beyond in-field repair (DCGM fails a GPU here; NVIDIA's maximum"
        " is 64)",
    ),
    Rule(
        "TEMPERATURE_ABOVE_SLOWDOWN",
        Severity.WARNING,
        Action.NONE,
        "heat is a cooling or workload problem, not a broken GPU: no action on the GPU",
    ),
    Rule(
        "TEMPERATURE_AT_SHUTDOWN",
        Severity.CRITICAL,
        Action.NONE,
        "heat is a cooling or workload problem, not a broken GPU: no action on the GPU",
    ),
    *(
        Rule(
            code,
            Severity.WARNING,
            Action.NONE,
            "clocks held down to protect the part (power brake is often the PSU or the"
            " chassis): jobs run slowly, but the GPU is not faulty",
        )
        for code in (
            "CLOCK_HW_SLOWDOWN",
            "CLOCK_HW_THERMAL_SLOWDOWN",
            "CLOCK_HW_POWER_BRAKE",
            "CLOCK_SW_THERMAL_SLOWDOWN",
        )
    ),
    Rule(
        "PCIE_WIDTH_DEGRADED",
        Severity.WARNING,
        Action.NONE,
        "a link trained narrower than it can may be a seating or riser fault; flag, do not"
        " repair: some cloud machines wire an x16 GPU at x8 by design (the real A10G and T4"
        " captures do), and rebooting cannot change that",
    ),
    Rule(
        "PCIE_GEN_BELOW_MAX",
        Severity.INFO,
        Action.NONE,
        "GPUs lower the link generation when idle to save power: informational only",
    ),
    Rule("NVLINK_DOWN", Severity.CRITICAL, Action.RESET_GPU, "a reset retrains the link"),
    Rule(
        "NVLINK_ERRORS",
        Severity.INFO,
        Action.NONE,
        "corrected errors accumulate on healthy links (see NVLINK_WARNING_COUNTERS for when"
        " this is raised to WARNING)",
    ),
    Rule(
        "RECOVERY_ACTION_REQUIRED",
        Severity.CRITICAL,
        Action.RESET_GPU,
        "the driver's own verdict; the action text is mapped by xid_catalog.RECOVERY_ACTIONS",
    ),
)

# Clock event reasons that mean the hardware or the driver is holding clocks down. Idle,
# SW power cap, sync boost and the clock settings are normal operation.
SLOWDOWN_CODES = {
    "hw_slowdown": "CLOCK_HW_SLOWDOWN",
    "hw_thermal_slowdown": "CLOCK_HW_THERMAL_SLOWDOWN",
    "hw_power_brake_slowdown": "CLOCK_HW_POWER_BRAKE",
    "sw_thermal_slowdown": "CLOCK_SW_THERMAL_SLOWDOWN",
}

# DCGM's memory health watch warns at this many uncorrectable row remaps.
ROW_REMAP_UNCORRECTABLE_WARN = 512
# DCGM_LIMIT_MAX_RETIRED_PAGES: DCGM fails a GPU with this many retired pages (SBE + DBE).
RETIRED_PAGES_LIMIT = 63

# NVLink counters are cumulative and one snapshot has no rate. CRC, replay and ECC errors
# are corrected by retransmission and accumulate slowly on healthy links: INFO. A recovery
# means the link went down and retrained, a counter DCGM requires to stay 0: WARNING (not
# CRITICAL, since one snapshot cannot tell an old event from an ongoing one).
NVLINK_WARNING_COUNTERS = frozenset({"recovery"})


@dataclass(frozen=True)
class Verdict:
    """What one rule saw on one GPU, before it is a finding about a component."""

    rule: Rule
    message: str
    evidence: str


def verdict(
    code: str,
    message: str,
    evidence: str,
    severity: Severity | None = None,
    action: Action | None = None,
    *,
    deferred: bool | None = None,
) -> Verdict:
    """A verdict with the code's severity, action and deferral from RULES unless given."""
    rule = RULES[code]
    rule = replace(
        rule,
        severity=rule.severity if severity is None else severity,
        action=rule.action if action is None else action,
        deferred=rule.deferred if deferred is None else deferred,
    )
    return Verdict(rule, message, evidence)
