"""Clocks, temperature, power and throttle reasons sampled through NVML while the load
runs, and the Xids raised meanwhile: a GPU that slows itself under load says why here."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from gpuguard.checks.nvml import clock_event_names, nvml_session, read_xid_events
from gpuguard.checks.nvml_binding import DeviceHandle, Nvml
from gpuguard.checks.xid_catalog import xid_finding
from gpuguard.errors import CheckError
from gpuguard.model import NODE, Action, Finding, Layer, Severity, gpu

SOURCE = "deep-gpu"
SAMPLE_INTERVAL_S = 0.5
NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0
# Reasons that mean the GPU slowed itself under load (not idle, not an application cap).
THROTTLE_REASONS = frozenset(
    {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"}
)


@dataclass
class GpuSamples:
    pci_bus_id: str
    sm_mhz: list[float] = field(default_factory=list)
    temperature_c: list[float] = field(default_factory=list)
    power_w: list[float] = field(default_factory=list)
    reasons: set[str] = field(default_factory=set)


class LoadTelemetry:
    """Samples every GPU in a background thread between ``start`` and ``stop``."""

    def __init__(self, nvml: Nvml | None) -> None:
        """``nvml``: the pynvml module, or None where it is not installed."""
        self.nvml = nvml
        self.samples: dict[int, GpuSamples] = {}
        self.xids: list[tuple[str, int]] = []
        self.problem = "" if nvml is not None else "pynvml is not installed"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, expected_s: float) -> None:
        nvml = self.nvml
        if nvml is None:
            return
        self._threads = [
            threading.Thread(target=self._sample, args=(nvml,), name="deep-telemetry", daemon=True),
            threading.Thread(target=self._watch_xids, args=(nvml, expected_s), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2 * SAMPLE_INTERVAL_S)

    def _sample(self, nvml: Nvml) -> None:
        try:
            with nvml_session(nvml):
                handles = [
                    nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())
                ]
                while not self._stop.is_set():
                    for index, handle in enumerate(handles):
                        self._sample_one(nvml, index, handle)
                    self._stop.wait(SAMPLE_INTERVAL_S)
        except (CheckError, nvml.NVMLError) as exc:
            self.problem = f"NVML sampling failed: {exc}"

    def _sample_one(self, nvml: Nvml, index: int, handle: DeviceHandle) -> None:
        s = self.samples.get(index)
        if s is None:
            bus = nvml.nvmlDeviceGetPciInfo(handle).busId
            s = self.samples[index] = GpuSamples(bus.decode() if isinstance(bus, bytes) else bus)
        s.sm_mhz.append(float(nvml.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM)))
        s.temperature_c.append(float(nvml.nvmlDeviceGetTemperature(handle, NVML_TEMPERATURE_GPU)))
        s.power_w.append(nvml.nvmlDeviceGetPowerUsage(handle) / 1000)
        s.reasons |= clock_event_names(nvml.nvmlDeviceGetCurrentClocksEventReasons(handle))

    def _watch_xids(self, nvml: Nvml, expected_s: float) -> None:
        try:
            self.xids = read_xid_events(nvml, int(expected_s * 1000))
        except CheckError as exc:
            self.problem = f"Xid events not watched: {exc}"

    def findings(self) -> list[Finding]:
        return judge_telemetry(list(self.samples.values()), self.xids, self.problem)


def judge_telemetry(
    samples: list[GpuSamples], xids: list[tuple[str, int]], problem: str
) -> list[Finding]:
    findings = []
    for bus_id, xid in xids:
        findings.append(xid_finding(xid, gpu(bus_id), SOURCE, f"Xid {xid} during the deep load"))
    for s in samples:
        if not s.sm_mhz:
            continue
        summary = (
            f"under load: SM clock {min(s.sm_mhz):.0f}-{max(s.sm_mhz):.0f} MHz,"
            f" up to {max(s.temperature_c):.0f} C and {max(s.power_w):.0f} W"
        )
        throttled = sorted(s.reasons & THROTTLE_REASONS)
        severity = Severity.WARNING if throttled else Severity.INFO
        code = "DEEP_THROTTLED_UNDER_LOAD" if throttled else "DEEP_LOAD_TELEMETRY"
        reasons = ", ".join(sorted(s.reasons)) or "none"
        component = gpu(s.pci_bus_id)
        message = f"{component.id}: {summary}" + (
            f"; slowed itself: {', '.join(throttled)}" if throttled else ""
        )
        findings.append(
            Finding(
                Layer.GPU,
                code,
                severity,
                Action.NONE,
                component,
                SOURCE,
                message,
                f"clock event reasons seen: {reasons}",
            )
        )
    if problem:
        message = f"no clocks, temperatures or Xids during the load: {problem}"
        findings.append(
            Finding(
                Layer.GPU,
                "DEEP_TELEMETRY_UNAVAILABLE",
                Severity.INFO,
                Action.NONE,
                NODE,
                SOURCE,
                message,
            )
        )
    return findings
