"""NVML reads against a fake pynvml that raises the real pynvml error classes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gpuguard.checks import nvml as nvml_check
from gpuguard.checks.base import CheckContext
from gpuguard.checks.nvml import NvmlCheck, read_gpu_facts, read_xid_events
from gpuguard.checks.xid_catalog import RECOVERY_ACTIONS
from gpuguard.config import Config
from gpuguard.errors import CheckFailed, ToolMissing
from gpuguard.sources import BundleSources, LiveSources

H100_LINKS = 18


@dataclass
class FakeGpu:
    """One GPU's state as NVML would report it; ``failures`` maps a call to its error."""

    bus_id: str
    uuid: str
    ecc_uncorrected: int = 0
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # corr, unc, pending, failure
    retired_pages_pending: int = 0
    retired_pages: tuple[int, int] = (0, 0)  # single-bit, double-bit
    mig_mode: tuple[int, int] = (0, 0)
    temperature: int = 34
    clock_reasons: int = 0x1  # idle
    pcie: tuple[int, int, int, int] = (5, 5, 16, 16)  # gen current/max, width current/max
    nvlinks: int = H100_LINKS
    nvlink_error: int = 0
    recovery_action: int = 0
    field_returns: dict[int, int] = field(default_factory=dict)  # field id -> nvmlReturn
    supported_events: int = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeClock
    failures: dict[str, type[pynvml.NVMLError]] = field(default_factory=dict)


def h100(index: int, **state: Any) -> FakeGpu:
    return FakeGpu(f"00000000:{0x19 + index:02X}:00.0", f"GPU-{index:08d}-fake", **state)


class FakeNvml:
    """The part of the pynvml surface gpuguard uses; handles are GPU indices."""

    NVMLError = pynvml.NVMLError

    def __init__(
        self,
        gpus: list[FakeGpu],
        init_error: type[pynvml.NVMLError] | None = None,
        events: list[tuple[int, int]] | None = None,
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.events = list(events or [])  # (handle, xid) in arrival order
        self.initialized = 0
        self.shutdowns = 0
        self.registered: list[int] = []
        self.freed = False

    def _gpu(self, call: str, handle: int) -> FakeGpu:
        gpu = self.gpus[handle]
        if call in gpu.failures:
            raise gpu.failures[call]()
        return gpu

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.init_error()
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._gpu("nvmlDeviceGetHandleByIndex", index)
        return index

    def nvmlDeviceGetPciInfo(self, handle: int) -> pynvml.nvmlPciInfo_t:
        info = pynvml.nvmlPciInfo_t()
        info.busId = self._gpu("nvmlDeviceGetPciInfo", handle).bus_id.encode()
        return info

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: int) -> str:
        self._gpu("nvmlDeviceGetName", handle)
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetTotalEccErrors(self, handle: int, error_type: int, counter: int) -> int:
        assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        assert counter == pynvml.NVML_VOLATILE_ECC
        return self._gpu("nvmlDeviceGetTotalEccErrors", handle).ecc_uncorrected

    def nvmlDeviceGetRemappedRows(self, handle: int) -> tuple[int, int, int, int]:
        return self._gpu("nvmlDeviceGetRemappedRows", handle).remapped_rows

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: int) -> int:
        return self._gpu("nvmlDeviceGetRetiredPagesPendingStatus", handle).retired_pages_pending

    def nvmlDeviceGetRetiredPages(self, handle: int, cause: int) -> list[int]:
        count = self._gpu("nvmlDeviceGetRetiredPages", handle).retired_pages[cause]
        return [0x1000 * page for page in range(count)]

    def nvmlDeviceGetMigMode(self, handle: int) -> tuple[int, int]:
        return self._gpu("nvmlDeviceGetMigMode", handle).mig_mode

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._gpu("nvmlDeviceGetTemperature", handle).temperature

    def nvmlDeviceGetTemperatureThreshold(self, handle: int, threshold: int) -> int:
        self._gpu("nvmlDeviceGetTemperatureThreshold", handle)
        return {
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89,
        }[threshold]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle).clock_reasons

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: int) -> int:
        return self._gpu("nvmlDeviceGetCurrPcieLinkGeneration", handle).pcie[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        return self._gpu("nvmlDeviceGetMaxPcieLinkGeneration", handle).pcie[1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: int) -> int:
        return self._gpu("nvmlDeviceGetCurrPcieLinkWidth", handle).pcie[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        return self._gpu("nvmlDeviceGetMaxPcieLinkWidth", handle).pcie[3]

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        gpu = self._gpu("nvmlDeviceGetNvLinkState", handle)
        if link >= gpu.nvlinks:
            raise pynvml.NVMLError_NotSupported()
        return 1

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: int, link: int, counter: int) -> int:
        assert 0 <= counter <= pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA
        return self._gpu("nvmlDeviceGetNvLinkErrorCounter", handle).nvlink_error

    def nvmlDeviceGetFieldValues(self, handle: int, field_ids: list[int]) -> Any:
        gpu = self._gpu("nvmlDeviceGetFieldValues", handle)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for value, field_id in zip(values, field_ids, strict=True):
            value.fieldId = field_id
            value.nvmlReturn = gpu.field_returns.get(field_id, pynvml.NVML_SUCCESS)
            value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            if field_id == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                value.value.uiVal = gpu.recovery_action
        return values

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceGetSupportedEventTypes(self, handle: int) -> int:
        return self._gpu("nvmlDeviceGetSupportedEventTypes", handle).supported_events

    def nvmlDeviceRegisterEvents(self, handle: int, event_types: int, event_set: str) -> None:
        assert event_types == pynvml.nvmlEventTypeXidCriticalError and event_set == "event-set"
        self.registered.append(handle)

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        assert timeout_ms > 0
        if not self.events:
            raise pynvml.NVMLError_Timeout()
        handle, xid = self.events.pop(0)
        return SimpleNamespace(
            device=handle, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid
        )

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.freed = True


def eight_gpus(**state_of: dict[str, Any]) -> list[FakeGpu]:
    """Eight healthy H100s; ``state_of`` overrides one GPU's state by its index ("g3")."""
    return [h100(i, **state_of.get(f"g{i}", {})) for i in range(8)]


def live_context(**config: Any) -> CheckContext:
    settings = Config(**config)
    return CheckContext(LiveSources(settings), settings, timeout_s=5.0)


def test_healthy_node_reads_every_fact() -> None:
    fake = FakeNvml(eight_gpus())
    facts = read_gpu_facts(fake)
    assert [f.pci_bus_id for f in facts] == [g.bus_id for g in fake.gpus]
    first = facts[0]
    assert first.error is None
    assert (first.uuid, first.name, first.index) == (
        "GPU-00000000-fake",
        "NVIDIA H100 80GB HBM3",
        0,
    )
    assert first.ecc_uncorrected_volatile == 0
    assert (first.remap_pending, first.remap_failure, first.remap_uncorrectable) == (
        False,
        False,
        0,
    )
    assert first.retired_pages_pending is False
    assert first.retired_pages == 0
    assert first.mig_enabled is False
    assert (first.temperature_c, first.slowdown_temp_c, first.shutdown_temp_c) == (34, 89, 92)
    assert first.clock_event_reasons == {"gpu_idle"}
    assert (first.pcie_gen_current, first.pcie_gen_max) == (5, 5)
    assert (first.pcie_width_current, first.pcie_width_max) == (16, 16)
    assert [link.link for link in first.nvlinks] == list(range(H100_LINKS))
    assert all(link.active for link in first.nvlinks)
    assert first.nvlinks[0].errors == dict.fromkeys(nvml_check.NVLINK_ERROR_COUNTERS, 0)
    assert first.recovery_action == "None"
    assert (first.reset_required, first.drain_and_reset_recommended) == (False, False)
    assert (fake.initialized, fake.shutdowns) == (1, 1)


def test_lost_gpu_keeps_what_was_read_and_others_are_read() -> None:
    lost = {"failures": {"nvmlDeviceGetRemappedRows": pynvml.NVMLError_GpuIsLost}}
    facts = read_gpu_facts(FakeNvml(eight_gpus(g3=lost)))
    assert facts[3].error == "GPU_IS_LOST"
    assert facts[3].pci_bus_id == "00000000:1C:00.0"  # read before the GPU was lost
    assert facts[3].ecc_uncorrected_volatile == 0
    assert facts[3].remap_pending is None and facts[3].temperature_c is None
    assert [f.error for i, f in enumerate(facts) if i != 3] == [None] * 7
    assert all(f.remap_pending is False for i, f in enumerate(facts) if i != 3)


def test_reset_required_is_recorded() -> None:
    state = {"failures": {"nvmlDeviceGetTemperature": pynvml.NVMLError_ResetRequired}}
    facts = read_gpu_facts(FakeNvml(eight_gpus(g0=state)))
    assert facts[0].error == "RESET_REQUIRED"


def test_unobtainable_handle_is_a_gpu_with_an_error() -> None:
    state = {"failures": {"nvmlDeviceGetHandleByIndex": pynvml.NVMLError_Unknown}}
    facts = read_gpu_facts(FakeNvml(eight_gpus(g5=state)))
    assert (facts[5].pci_bus_id, facts[5].index, facts[5].error) == (
        "unknown-5",
        5,
        "UNKNOWN_ERROR",
    )
    assert len(facts) == 8 and facts[6].error is None


def test_retired_pages_of_both_causes_are_counted() -> None:
    (facts,) = read_gpu_facts(FakeNvml([h100(0, retired_pages=(40, 24))]))
    assert facts.retired_pages == 64


def test_not_supported_leaves_facts_unmeasured() -> None:
    calls = [
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetMaxPcieLinkWidth",
    ]
    state = {"failures": dict.fromkeys(calls, pynvml.NVMLError_NotSupported)}
    facts = read_gpu_facts(FakeNvml([h100(0, **state)]))[0]
    assert facts.error is None
    assert facts.ecc_uncorrected_volatile is None
    assert facts.remap_pending is None and facts.remap_uncorrectable is None
    assert facts.retired_pages_pending is None and facts.retired_pages is None
    assert facts.temperature_c is None
    assert facts.pcie_width_max is None
    assert facts.slowdown_temp_c == 89  # the calls that worked still count


def test_pcie_card_without_nvlink_has_no_links() -> None:
    assert read_gpu_facts(FakeNvml([h100(0, nvlinks=0)]))[0].nvlinks == []


def test_remap_pending_is_read_through() -> None:
    facts = read_gpu_facts(FakeNvml([h100(0, remapped_rows=(2, 1, 1, 0))]))[0]
    assert (facts.remap_pending, facts.remap_uncorrectable, facts.remap_failure) == (
        True,
        1,
        False,
    )


def test_clock_event_reason_bits_become_names() -> None:
    reasons = (
        pynvml.nvmlClocksEventReasonHwSlowdown | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    )
    assert reasons == 0x8 | 0x80
    facts = read_gpu_facts(FakeNvml([h100(0, clock_reasons=reasons)]))[0]
    assert facts.clock_event_reasons == {"hw_slowdown", "hw_power_brake_slowdown"}


@pytest.mark.parametrize("code", range(8))
def test_recovery_action_uses_the_xid_catalog_words(code: int) -> None:
    facts = read_gpu_facts(FakeNvml([h100(0, recovery_action=code)]))[0]
    assert facts.recovery_action is not None
    assert facts.recovery_action.lower() in RECOVERY_ACTIONS


def test_drain_and_reset_recovery_action() -> None:
    facts = read_gpu_facts(FakeNvml([h100(0, recovery_action=4)]))[0]
    assert facts.recovery_action == "Drain and Reset"


def test_failed_field_leaves_recovery_action_unmeasured() -> None:
    failed = dict.fromkeys(
        [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, pynvml.NVML_FI_DEV_RESET_STATUS],
        pynvml.NVML_ERROR_NOT_SUPPORTED,
    )
    facts = read_gpu_facts(FakeNvml([h100(0, recovery_action=4, field_returns=failed)]))[0]
    assert facts.recovery_action is None and facts.reset_required is None
    assert facts.drain_and_reset_recommended is False  # its own field still answered


@pytest.mark.parametrize(
    ("init_error", "raised"),
    [
        (pynvml.NVMLError_LibraryNotFound, ToolMissing),
        (pynvml.NVMLError_DriverNotLoaded, ToolMissing),
        (pynvml.NVMLError_NoPermission, CheckFailed),
    ],
)
def test_init_failure_fails_the_check(
    init_error: type[pynvml.NVMLError], raised: type[Exception]
) -> None:
    fake = FakeNvml(eight_gpus(), init_error=init_error)
    with pytest.raises(raised):
        read_gpu_facts(fake)
    assert fake.shutdowns == 0  # nothing to shut down after a failed init


def test_shutdown_follows_a_failed_read() -> None:
    class CountFails(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise pynvml.NVMLError_Unknown()

    fake = CountFails(eight_gpus())
    with pytest.raises(CheckFailed):
        read_gpu_facts(fake)
    assert fake.shutdowns == 1


def test_constants_match_pynvml() -> None:
    for name in dir(nvml_check):
        if name.startswith("NVML_") and hasattr(pynvml, name):
            assert getattr(nvml_check, name) == getattr(pynvml, name), name
    assert pynvml.nvmlEventTypeXidCriticalError == nvml_check.NVML_EVENT_TYPE_XID_CRITICAL_ERROR


def test_real_pynvml_without_a_gpu_is_a_check_error_not_a_crash() -> None:
    with pytest.raises((ToolMissing, CheckFailed)):
        NvmlCheck().run(live_context())


def test_bundle_mode_has_no_nvml(tmp_path: Path) -> None:
    ctx = CheckContext(BundleSources(tmp_path), Config(), timeout_s=5.0)
    with pytest.raises(ToolMissing, match="live node only"):
        NvmlCheck(FakeNvml(eight_gpus())).run(ctx)


def test_xid_events_until_timeout() -> None:
    gpus = eight_gpus(g7={"supported_events": pynvml.nvmlEventTypeClock})
    fake = FakeNvml(gpus, events=[(2, 79), (5, 48)])
    assert read_xid_events(fake, wait_ms=200) == [
        ("00000000:1B:00.0", 79),
        ("00000000:1E:00.0", 48),
    ]
    assert fake.registered == list(range(7))  # GPU 7 cannot report Xid events
    assert fake.freed and fake.shutdowns == 1


def test_no_xid_events_is_an_empty_list() -> None:
    assert read_xid_events(FakeNvml(eight_gpus()), wait_ms=50) == []


def test_check_on_healthy_node_finds_nothing() -> None:
    fake = FakeNvml(eight_gpus())
    assert NvmlCheck(fake).run(live_context(expected_gpus=8)) == []
    assert fake.shutdowns == 2  # one session for the facts, one for the event window


def test_check_reports_remap_pending_lost_gpu_and_xid_events() -> None:
    gpus = eight_gpus(
        g1={"remapped_rows": (0, 1, 1, 0)},
        g4={"failures": {"nvmlDeviceGetTemperature": pynvml.NVMLError_GpuIsLost}},
    )
    findings = NvmlCheck(FakeNvml(gpus, events=[(6, 79)])).run(live_context(expected_gpus=8))
    by_code = {f.code: f for f in findings}
    assert by_code["ROW_REMAP_PENDING"].component.id == "0000:1a:00.0"
    assert by_code["ROW_REMAP_PENDING"].source == "nvml"
    assert by_code["GPU_LOST"].component.id == "0000:1d:00.0"
    assert by_code["XID_79"].component.id == "0000:1f:00.0"
    assert by_code["XID_79"].source == "nvml-events"


def test_check_keeps_gpu_findings_when_the_event_window_fails() -> None:
    class NoEvents(FakeNvml):
        def nvmlEventSetCreate(self) -> str:
            raise pynvml.NVMLError_NoPermission()

    gpus = eight_gpus(g2={"remapped_rows": (0, 1, 1, 0)})
    codes = [f.code for f in NvmlCheck(NoEvents(gpus)).run(live_context())]
    assert codes == ["ROW_REMAP_PENDING", "NVML_EVENTS_UNAVAILABLE"]
