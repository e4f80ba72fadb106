"""Per-GPU facts, read the same way from NVML, nvidia-smi XML or nvidia-smi text.

The sources differ only in how they read; :func:`evaluate_gpus` decides what the facts mean,
so the three sources give the same findings for the same GPU state. ``None`` in a fact
means "the source could not measure it" (``N/A``, NOT_SUPPORTED); it is never read as good.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
