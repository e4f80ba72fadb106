"""The passive load-clock comparison (check ``load-clocks``) against a fake pynvml that
raises the real pynvml errors: a GPU slower than its busy siblings is named, load and
sibling differences that are not a slow GPU are not."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest

from gpuguard.checks.base import CheckContext
from gpuguard.checks.in_job.load_clocks import LoadClockCheck
from gpuguard.checks.in_job.load_samples import sample_gpus
from gpuguard.config import Config
from gpuguard.model import Action, Outcome
from gpuguard.runner import run_check
from gpuguard.sources import BundleSources, LiveSources
from tests.support.clock import FakeClock

POD_A = "0f3c2a10-9d1e-4a7b-8c55-1e2d3f4a5b6c"
POD_B = "7a6b5c4d-3e2f-4a1b-9c8d-7e6f5a4b3c2d"
HW_SLOWDOWN = 0x8


@dataclass
class Gpu:
    sm_mhz: int = 1980
    busy: int = 99
    reasons: int = 0x4  # sw_power_cap: normal at full load
    pids: list[int] = field(default_factory=lambda: [100])
    lost: bool = False


class LoadNvml:
    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[Gpu]) -> None:
        self.gpus = gpus

    def _gpu(self, handle: int) -> Gpu:
        if self.gpus[handle].lost:
            raise pynvml.NVMLError_GpuIsLost()
        return self.gpus[handle]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        self._gpu(handle)
        return SimpleNamespace(busId=f"00000000:{0x19 + handle:02X}:00.0".encode())

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=self._gpu(handle).busy, memory=40)

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return self._gpu(handle).sm_mhz

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return 650_000

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 71

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return self._gpu(handle).reasons

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid) for pid in self._gpu(handle).pids]


def proc_with(tmp_path: Path, pods: dict[int, str]) -> Path:
    for pid, uid in pods.items():
        (tmp_path / str(pid)).mkdir(parents=True)
        # The systemd cgroup driver's spelling (the uid's dashes as underscores).
        pod = f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
        line = f"0::/kubepods.slice/kubepods-burstable.slice/{pod}/cri-containerd-ab.scope\n"
        (tmp_path / str(pid) / "cgroup").write_text(line)
    return tmp_path


def sample_for(check: LoadClockCheck, clock: FakeClock, rounds: int, **config: object) -> list:
    ctx = CheckContext(LiveSources(Config()), Config.model_validate({"load_clocks": config}), 5.0)
    found = []
    for _ in range(rounds):
        result = run_check(check, ctx)
        assert result.outcome is Outcome.OK, result.detail
        found = result.findings
        clock.step(30)
    return found


def eight(**slow: Gpu) -> list[Gpu]:
    gpus = [Gpu() for _ in range(8)]
    for index, gpu in slow.items():
        gpus[int(index[1:])] = gpu
    return gpus


def test_a_gpu_clocking_below_its_busy_siblings_is_named_after_the_window_fills():
    nvml, clock = LoadNvml(eight(g3=Gpu(sm_mhz=1410, reasons=HW_SLOWDOWN))), FakeClock(1000.0)
    check = LoadClockCheck(nvml, clock)
    assert sample_for(check, clock, 9) == []  # min_samples 10
    (found,) = sample_for(check, clock, 1)
    assert found.code == "LOAD_CLOCK_BELOW_SIBLINGS" and found.deferred
    assert found.action is Action.RESET_GPU and found.component.id == "0000:1c:00.0"
    assert "1410 MHz" in found.message and "71% of its 7 busy siblings' 1980 MHz" in found.message
    assert "hw_slowdown" in found.evidence and "10 of 10 loaded samples" in found.evidence


def test_a_small_difference_or_a_short_dip_is_not_a_finding():
    nvml, clock = LoadNvml(eight(g3=Gpu(sm_mhz=1830))), FakeClock(1000.0)  # 92 %: within tolerance
    check = LoadClockCheck(nvml, clock)
    assert sample_for(check, clock, 12) == []
    nvml.gpus[3] = Gpu(sm_mhz=1200)
    assert sample_for(check, clock, 3) == []  # 3 of 15 samples below: not most of them
    nvml.gpus[3] = Gpu()
    assert sample_for(check, clock, 20) == []


def test_idle_or_lightly_loaded_gpus_give_no_verdict():
    gpus = [Gpu(busy=30, sm_mhz=345 if i == 2 else 1980) for i in range(8)]
    nvml, clock = LoadNvml(gpus), FakeClock(1000.0)
    assert sample_for(LoadClockCheck(nvml, clock), clock, 20) == []


def test_gpus_of_different_jobs_are_not_compared(tmp_path):
    gpus = [Gpu(pids=[100 + i], sm_mhz=1500 if i < 4 else 1980) for i in range(8)]
    proc = proc_with(tmp_path, {100 + i: POD_A if i < 4 else POD_B for i in range(8)})
    samples = sample_gpus(LoadNvml(gpus), proc)
    assert {s.job for s in samples} == {POD_A, POD_B}
    # Without the pods (no host PID namespace) they would be compared: 1500 vs 1980.
    nvml, clock = LoadNvml(gpus), FakeClock(1000.0)
    assert len(sample_for(LoadClockCheck(nvml, clock, tmp_path / "none"), clock, 10)) == 4
    nvml, clock = LoadNvml(gpus), FakeClock(1000.0)
    assert sample_for(LoadClockCheck(nvml, clock, proc), clock, 10) == []


def test_a_lost_gpu_is_left_to_the_nvml_check_and_the_others_still_judged():
    gpus = eight(g3=Gpu(sm_mhz=1400), g5=Gpu(lost=True))
    nvml, clock = LoadNvml(gpus), FakeClock(1000.0)
    (found,) = sample_for(LoadClockCheck(nvml, clock), clock, 10)
    assert found.component.id == "0000:1c:00.0" and "6 busy siblings" in found.message


def test_bundles_have_no_live_clocks(tmp_path):
    ctx = CheckContext(BundleSources(tmp_path), Config(), 5.0)
    assert run_check(LoadClockCheck(LoadNvml([])), ctx).outcome is Outcome.TOOL_MISSING


def test_nvml_failing_is_no_verdict_not_a_healthy_one():
    class Broken(LoadNvml):
        def nvmlInit(self) -> None:
            raise pynvml.NVMLError_Unknown()

    ctx = CheckContext(LiveSources(Config()), Config(), 5.0)
    result = run_check(LoadClockCheck(Broken([])), ctx)
    assert result.outcome is Outcome.FAILED and not result.answered


@pytest.mark.parametrize("share", [0.4, 1.5])
def test_a_share_that_is_no_majority_is_refused(share):
    with pytest.raises(ValueError, match=r"load_clocks\.share"):
        Config.model_validate({"load_clocks": {"share": share}})
