"""One NVML sample of every GPU under load: clocks, power, temperature, utilisation,
throttle reasons, and which pods' processes it runs (the job it works for)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from gpuguard.checks.nvml import clock_event_names, nvml_session
from gpuguard.checks.nvml_binding import DeviceHandle, Nvml
from gpuguard.errors import CheckFailed

T = TypeVar("T")

NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0
# The kubelet's cgroup path names the pod: .../kubepods-burstable-pod<uid>.slice or
# .../kubepods/burstable/pod<uid>/<container> (systemd writes the uid's dashes as "_").
_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)


@dataclass(frozen=True)
class GpuSample:
    pci_bus_id: str
    model: str
    utilization_percent: float
    sm_mhz: float
    power_w: float | None
    temperature_c: float | None
    reasons: frozenset[str]
    job: str  # the pods whose processes run on it, sorted and joined ("": not known)


def sample_gpus(nvml: Nvml, proc: Path = Path("/proc")) -> list[GpuSample]:
    """Every GPU NVML can read now; a GPU that fails a read is left out (the ``nvml``
    check reports a lost GPU); NVML itself failing raises `CheckFailed`."""
    samples = []
    with nvml_session(nvml):
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            raise CheckFailed(f"nvmlDeviceGetCount failed: {exc}") from None
        for index in range(count):
            try:
                samples.append(_sample(nvml, nvml.nvmlDeviceGetHandleByIndex(index), proc))
            except nvml.NVMLError:
                continue
    return samples


def _sample(nvml: Nvml, handle: DeviceHandle, proc: Path) -> GpuSample:
    bus = nvml.nvmlDeviceGetPciInfo(handle).busId
    name = nvml.nvmlDeviceGetName(handle)
    return GpuSample(
        pci_bus_id=_text(bus),
        model=_text(name),
        utilization_percent=float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
        sm_mhz=float(nvml.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM)),
        power_w=_optional(nvml, lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000),
        temperature_c=_optional(
            nvml, lambda: float(nvml.nvmlDeviceGetTemperature(handle, NVML_TEMPERATURE_GPU))
        ),
        reasons=clock_event_names(
            _optional(nvml, lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)) or 0
        ),
        job=_job_of(nvml, handle, proc),
    )


def _job_of(nvml: Nvml, handle: DeviceHandle, proc: Path) -> str:
    """The pods behind the GPU's compute processes, read from their cgroups ("" when the
    agent cannot see them: no host PID namespace, or no process)."""
    try:
        processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except nvml.NVMLError:
        return ""
    pods: set[str] = set()
    for process in processes:
        try:
            text = (proc / str(process.pid) / "cgroup").read_text()
        except OSError:
            continue
        pods.update(uid.replace("_", "-") for uid in _POD_UID.findall(text))
    return ",".join(sorted(pods))


def _optional(nvml: Nvml, read: Callable[[], T]) -> T | None:
    try:
        return read()
    except nvml.NVMLError:
        return None


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
