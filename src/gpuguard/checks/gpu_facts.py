"""Per-GPU facts, read the same way from NVML, nvidia-smi XML or nvidia-smi text.

The sources differ only in how they read; :func:`evaluate_gpus` decides what the facts mean,
so the three sources give the same findings for the same GPU state. ``None`` in a fact
means "the source could not measure it" (``N/A``, NOT_SUPPORTED); it is never read as good.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gpuguard.checks.gpu_rules import (
    NVLINK_WARNING_COUNTERS,
    RETIRED_PAGES_LIMIT,
    ROW_REMAP_UNCORRECTABLE_WARN,
    SLOWDOWN_CODES,
    Verdict,
    verdict,
)
from gpuguard.checks.xid_catalog import recovery_rule
from gpuguard.config import GpuFigures
from gpuguard.model import (
    NODE,
    Action,
    Component,
    Finding,
    Layer,
    Severity,
    gpu,
    normalize_pci_bus_id,
)


@dataclass
class NvLinkFacts:
    """One NVLink of one GPU."""

    link: int
    active: bool | None
    # Error counters by name: replay, recovery, crc_flit, crc_data, ecc_data.
    errors: dict[str, int] = field(default_factory=dict)


@dataclass
class GpuFacts:
    """What one source could read about one GPU."""

    pci_bus_id: str
    uuid: str | None = None
    name: str | None = None
    index: int | None = None
    # The GPU answered with an error that means it is unusable:
    # "GPU_IS_LOST", "RESET_REQUIRED", or the tool's own words ("Unknown Error").
    error: str | None = None
    ecc_uncorrected_volatile: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    remap_uncorrectable: int | None = None
    retired_pages_pending: bool | None = None
    # Pages retired so far, single- and double-bit causes together (pre-Ampere).
    retired_pages: int | None = None
    temperature_c: float | None = None
    slowdown_temp_c: float | None = None
    shutdown_temp_c: float | None = None
    # Active clock event (throttle) reasons, by the names in CLOCK_EVENT_REASONS.
    clock_event_reasons: frozenset[str] = frozenset()
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    nvlinks: list[NvLinkFacts] = field(default_factory=list)
    # The driver's recovery action in its own words: "None", "GPU Reset Required",
    # "Node Reboot Required", "Drain P2P", "Drain and Reset" (R565+ drivers).
    recovery_action: str | None = None
    reset_required: bool | None = None
    drain_and_reset_recommended: bool | None = None
    mig_enabled: bool | None = None
    # Ada and later report thresholds relative to T.Limit (nvidia-smi "T.Limit Temp", NVML
    # fields 194/195): the current margin below T.Limit, and the margins at which the GPU
    # slows down or shuts down (negative: that many degrees past T.Limit).
    tlimit_margin_c: float | None = None
    slowdown_tlimit_c: float | None = None
    shutdown_tlimit_c: float | None = None


CLOCK_EVENT_REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
)

# The figures a GPU model should reach, by the name the GPU reports (``None``: unknown model).
ExpectedFigures = Callable[[str], GpuFigures | None]


def no_expected_figures(name: str) -> GpuFigures | None:
    """No model is known: every link is judged against the card's maximum."""
    return None


def evaluate_gpus(
    facts: list[GpuFacts],
    expected_gpus: int | None,
    source: str,
    figures_for: ExpectedFigures = no_expected_figures,
) -> list[Finding]:
    """Every finding the facts support: the GPU count, then GPUs in PCI bus order.

    A fact that is ``None`` (not measured) yields no finding of its own, so the report
    never claims that a check it could not make passed or failed. ``figures_for`` gives a
    model's expected figures (the PCIe width it is installed at); the caller reads them.
    """
    findings: list[Finding] = []
    if expected_gpus is not None and len(facts) != expected_gpus:
        mismatch = _count_mismatch(len(facts), expected_gpus)
        findings.append(_finding(mismatch, NODE, source))
    for one in sorted(facts, key=lambda f: normalize_pci_bus_id(f.pci_bus_id)):
        component = gpu(one.pci_bus_id, one.uuid)
        for rule in _GPU_RULES:
            findings.extend(_finding(seen, component, source) for seen in rule(one))
        width = _pcie_width_rule(one, figures_for)
        findings.extend(_finding(seen, component, source) for seen in width)
    return findings


def _finding(seen: Verdict, component: Component, source: str) -> Finding:
    prefix = "" if component == NODE else f"{component.id}: "
    message = prefix + seen.message
    return seen.rule.finding(Layer.GPU, component, source, message, seen.evidence)


def _count_mismatch(found: int, expected: int) -> Verdict:
    evidence = f"gpus_found={found} gpus_expected={expected}"
    if found < expected:
        return verdict(
            "GPU_COUNT_MISMATCH", f"only {found} of {expected} expected GPUs visible", evidence
        )
    return verdict(
        "GPU_COUNT_MISMATCH",
        f"{found} GPUs visible, {expected} expected",
        evidence,
        Severity.WARNING,
        Action.NONE,
    )


def _error_rule(facts: GpuFacts) -> Iterator[Verdict]:
    if facts.error is None:
        return
    word = facts.error.strip().upper().replace(" ", "_")
    evidence = f"error={facts.error}"
    if "LOST" in word:
        yield verdict("GPU_LOST", "GPU is lost (off the bus)", evidence)
    elif "RESET" in word and "REQUIRE" in word:
        yield verdict("GPU_RESET_REQUIRED", "GPU must be reset before use", evidence)
    else:
        yield verdict("GPU_ERROR", f"GPU cannot be queried: {facts.error}", evidence)


def _memory_rule(facts: GpuFacts) -> Iterator[Verdict]:
    ecc = facts.ecc_uncorrected_volatile
    if ecc is not None and ecc > 0:
        yield verdict(
            "ECC_UNCORRECTABLE_VOLATILE",
            f"{ecc} uncorrectable ECC errors since the last reset",
            f"ecc_uncorrected_volatile={ecc}",
        )
    if facts.remap_failure:
        yield verdict("ROW_REMAP_FAILURE", "row remapping failed", "remap_failure=True")
    if facts.remap_pending:
        yield verdict(
            "ROW_REMAP_PENDING", "row remap pending: reset to activate", "remap_pending=True"
        )
    if facts.mig_enabled and facts.remap_pending is None and facts.remap_failure is None:
        yield verdict(
            "REMAP_STATUS_UNAVAILABLE",
            "row remap status not measured (unreadable with MIG enabled)",
            "mig_enabled=True remap_pending=None remap_failure=None",
        )
    remapped = facts.remap_uncorrectable
    if remapped is not None and remapped >= ROW_REMAP_UNCORRECTABLE_WARN:
        yield verdict(
            "ROW_REMAP_UNCORRECTABLE_HIGH",
            f"{remapped} rows remapped for uncorrectable errors: spares running out",
            f"remap_uncorrectable={remapped}",
        )
    if facts.retired_pages_pending:
        yield verdict(
            "RETIRED_PAGES_PENDING",
            "page retirement pending: reset to apply",
            "retired_pages_pending=True",
        )
    retired = facts.retired_pages
    if retired is not None and retired >= RETIRED_PAGES_LIMIT:
        yield verdict(
            "RETIRED_PAGES_LIMIT",
            f"{retired} pages retired: the retirement table has no room left",
            f"retired_pages={retired}",
        )


def _thermal_rule(facts: GpuFacts) -> Iterator[Verdict]:
    # "At or past the threshold" on either scale: absolute degrees, or the T.Limit margin
    # (which shrinks as the GPU warms). Only the worse finding is reported.
    temperature, margin = facts.temperature_c, facts.tlimit_margin_c
    evidence = " ".join(
        f"{name}={value:g}"
        for name, value in (
            ("temperature_c", temperature),
            ("slowdown_temp_c", facts.slowdown_temp_c),
            ("shutdown_temp_c", facts.shutdown_temp_c),
            ("tlimit_margin_c", margin),
            ("slowdown_tlimit_c", facts.slowdown_tlimit_c),
            ("shutdown_tlimit_c", facts.shutdown_tlimit_c),
        )
        if value is not None
    )
    if _reached(temperature, facts.shutdown_temp_c) or _reached_margin(
        margin, facts.shutdown_tlimit_c
    ):
        yield verdict("TEMPERATURE_AT_SHUTDOWN", "temperature at shutdown threshold", evidence)
    elif _reached(temperature, facts.slowdown_temp_c) or _reached_margin(
        margin, facts.slowdown_tlimit_c
    ):
        yield verdict(
            "TEMPERATURE_ABOVE_SLOWDOWN", "temperature at or above slowdown threshold", evidence
        )


def _clock_rule(facts: GpuFacts) -> Iterator[Verdict]:
    evidence = "clock_event_reasons=" + ",".join(sorted(facts.clock_event_reasons))
    for reason, code in SLOWDOWN_CODES.items():
        if reason in facts.clock_event_reasons:
            message = f"clocks held down: {reason.replace('_', ' ')} active"
            yield verdict(code, message, evidence)


def _pcie_width_rule(facts: GpuFacts, figures_for: ExpectedFigures) -> Iterator[Verdict]:
    """The link's width against the width the model is installed at (its expected figures),
    else against the card's maximum.

    Some machines wire an x16 card at x8 by design (the A10G in EC2 G5, the T4 in G4dn):
    judged against the card's maximum, every such node would be Degraded for good.
    """
    width, width_max = facts.pcie_width_current, facts.pcie_width_max
    figures = figures_for(facts.name) if facts.name else None
    expected = figures.pcie_width if figures and figures.pcie_width else width_max
    if width is not None and expected is not None and width < expected:
        against = f"the x{expected} {facts.name} is installed at" if figures else "the card's"
        yield verdict(
            "PCIE_WIDTH_DEGRADED",
            f"PCIe link runs at x{width}, below {against} x{expected}",
            f"pcie_width_current={width} pcie_width_max={width_max} pcie_width_expected={expected}",
        )


def _pcie_rule(facts: GpuFacts) -> Iterator[Verdict]:
    gen, gen_max = facts.pcie_gen_current, facts.pcie_gen_max
    if gen is not None and gen_max is not None and gen < gen_max:
        yield verdict(
            "PCIE_GEN_BELOW_MAX",
            f"PCIe link at Gen{gen} of Gen{gen_max} (normal when idle)",
            f"pcie_gen_current={gen} pcie_gen_max={gen_max}",
        )


def _nvlink_rule(facts: GpuFacts) -> Iterator[Verdict]:
    for link in sorted(facts.nvlinks, key=lambda nvlink: nvlink.link):
        if link.active is False:
            yield verdict(
                "NVLINK_DOWN", f"NVLink {link.link} is down", f"link={link.link} active=False"
            )
        counted = {name: count for name, count in sorted(link.errors.items()) if count > 0}
        if counted:
            warn = any(name in NVLINK_WARNING_COUNTERS for name in counted)
            yield verdict(
                "NVLINK_ERRORS",
                f"NVLink {link.link} error counters are non-zero",
                f"link={link.link} " + " ".join(f"{name}={n}" for name, n in counted.items()),
                Severity.WARNING if warn else Severity.INFO,
            )


def _recovery_rule(facts: GpuFacts) -> Iterator[Verdict]:
    if facts.recovery_action is not None:
        driver_says = _recovery_verdict(facts.recovery_action)
        if driver_says is not None:
            yield driver_says
    for name, value in (
        ("reset_required", facts.reset_required),
        ("drain_and_reset_recommended", facts.drain_and_reset_recommended),
    ):
        if value:
            message = f"the driver reports {name.replace('_', ' ')}"
            deferred = name == "drain_and_reset_recommended"
            yield verdict("RECOVERY_ACTION_REQUIRED", message, f"{name}=True", deferred=deferred)


def _recovery_verdict(text: str) -> Verdict | None:
    if text.strip().lower() == "none":
        return None
    evidence = f"recovery_action={text}"
    known = recovery_rule(text)
    if known is None:
        # An action this version does not know: fail the GPU, but do not guess a repair.
        message = f"the driver asks for an unknown recovery action '{text}'"
        return verdict("RECOVERY_ACTION_REQUIRED", message, evidence, action=Action.NONE)
    message = f"the driver's recovery action is '{text}'"
    # The driver's "Drain and Reset" (R570+) is a deferred repair (as ROW_REMAP_PENDING), in
    # its own words; its "Drain P2P" asks for the processes doing peer-to-peer traffic to
    # end now.
    return verdict(
        "RECOVERY_ACTION_REQUIRED",
        message,
        evidence,
        known.severity,
        known.action,
        deferred=known.deferred,
    )


def _reached(temperature: float | None, threshold: float | None) -> bool:
    return temperature is not None and threshold is not None and temperature >= threshold


def _reached_margin(margin: float | None, threshold: float | None) -> bool:
    return margin is not None and threshold is not None and margin <= threshold


_GPU_RULES = (
    _error_rule,
    _memory_rule,
    _thermal_rule,
    _clock_rule,
    _pcie_rule,
    _nvlink_rule,
    _recovery_rule,
)
