"""GPU health read straight from the driver through NVML (the ``pynvml`` bindings).

The readers take the ``pynvml`` module as a parameter, so tests hand them a fake with the
same function names and the real error classes. Every NVML call may fail on its own: a
"not supported" leaves its fact ``None`` (unmeasured, never healthy), while an error that
means the GPU is unusable (fallen off the bus, needs a reset) is recorded on the GPU and
ends the reads of that GPU only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import ClassVar, TypeVar

from gpuguard.checks.base import CheckContext
from gpuguard.checks.gpu_facts import CLOCK_EVENT_REASONS, GpuFacts, NvLinkFacts, evaluate_gpus
from gpuguard.checks.load.figures import expected_figures
from gpuguard.checks.nvidia_smi.common import total
from gpuguard.checks.nvml_binding import DeviceHandle, EventSet, FieldValue, Nvml, NvmlSession
from gpuguard.checks.xid_catalog import xid_finding
from gpuguard.clock import SYSTEM_CLOCK
from gpuguard.errors import CheckError, CheckFailed, ToolMissing
from gpuguard.model import NODE, Action, Finding, Layer, Severity, gpu

T = TypeVar("T")

# NVML's C enums; their values are part of the stable ABI, so they are spelled here rather
# than looked up, which keeps the surface a fake module must provide to functions and errors.
NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_UNKNOWN = 999
NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
# nvmlPageRetirementCause_t
NVML_PAGE_RETIREMENT_CAUSES = (0, 1)  # multiple single-bit ECC errors, a double-bit one
NVML_NVLINK_MAX_LINKS = 36
NVML_FI_DEV_RESET_STATUS = 226  # deprecated by 230, still the only signal on R55x drivers
NVML_FI_DEV_DRAIN_AND_RESET_STATUS = 227
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8

# Errors after which the GPU is unusable, by the words GpuFacts.error carries.
DEVICE_FATAL_ERRORS = {
    NVML_ERROR_GPU_IS_LOST: "GPU_IS_LOST",
    NVML_ERROR_RESET_REQUIRED: "RESET_REQUIRED",
    NVML_ERROR_UNKNOWN: "UNKNOWN_ERROR",
    NVML_ERROR_INSUFFICIENT_POWER: "INSUFFICIENT_POWER",
    NVML_ERROR_IRQ_ISSUE: "IRQ_ISSUE",
    NVML_ERROR_GPU_NOT_FOUND: "GPU_NOT_FOUND",
}

# Field 230's values, in the words of xid_catalog.RECOVERY_ACTIONS (title-cased).
RECOVERY_ACTION_NAMES = {
    0: "None",
    1: "GPU Reset Required",
    2: "Node Reboot Required",
    3: "Drain P2P",
    4: "Drain and Reset",
    5: "Recover IMEX Domain",
    6: "Bus Reset",
    7: "System Reboot",
}

NVLINK_ERROR_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")

# nvmlValueType_t -> the member of the c_nvmlValue_t union that holds the value.
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")

EVENT_WINDOW_MS = 200


class DeviceUnusable(Exception):
    """An NVML call said the GPU itself is gone or broken; the message names how."""


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _raise_if_fatal(exc: BaseException) -> None:
    word = DEVICE_FATAL_ERRORS.get(_code(exc) or 0)
    if word:
        raise DeviceUnusable(word) from exc


def _measure(nvml: Nvml, call: Callable[..., T], *args: object) -> T | None:
    """One NVML call: its value, ``None`` when unmeasurable, DeviceUnusable when fatal."""
    try:
        return call(*args)
    except nvml.NVMLError as exc:
        _raise_if_fatal(exc)
        # Not supported, no permission, a function an old driver lacks: unmeasured.
        return None


@contextlib.contextmanager
def nvml_session(nvml: NvmlSession) -> Iterator[None]:
    """nvmlInit … nvmlShutdown, with init failures mapped onto the check errors."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        if _code(exc) in (NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED):
            raise ToolMissing(f"NVML unavailable: {exc} (no NVIDIA driver loaded?)") from None
        raise CheckFailed(f"nvmlInit failed: {exc}") from None
    try:
        yield
    finally:
        # A failing shutdown must not hide the reads' result or their error.
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def read_gpu_facts(nvml: Nvml) -> list[GpuFacts]:
    """What NVML can read about every GPU it enumerates."""
    with nvml_session(nvml):
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            raise CheckFailed(f"nvmlDeviceGetCount failed: {exc}") from None
        return [_read_device(nvml, index) for index in range(count)]


def _read_device(nvml: Nvml, index: int) -> GpuFacts:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except nvml.NVMLError as exc:
        word = DEVICE_FATAL_ERRORS.get(_code(exc) or 0, f"NO_HANDLE: {exc}")
        return GpuFacts(pci_bus_id=f"unknown-{index}", index=index, error=word)
    facts = GpuFacts(pci_bus_id=f"unknown-{index}", index=index)
    try:
        _fill_facts(nvml, handle, facts)
    except DeviceUnusable as unusable:
        facts.error = str(unusable)
    return facts


def _fill_facts(nvml: Nvml, handle: DeviceHandle, facts: GpuFacts) -> None:
    """Read into ``facts`` in place, so a GPU lost midway keeps what was already read."""
    pci = _measure(nvml, nvml.nvmlDeviceGetPciInfo, handle)
    if pci is not None:
        facts.pci_bus_id = _text(pci.busId)
    uuid = _measure(nvml, nvml.nvmlDeviceGetUUID, handle)
    facts.uuid = None if uuid is None else _text(uuid)
    name = _measure(nvml, nvml.nvmlDeviceGetName, handle)
    facts.name = None if name is None else _text(name)
    facts.ecc_uncorrected_volatile = _measure(
        nvml,
        nvml.nvmlDeviceGetTotalEccErrors,
        handle,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        NVML_VOLATILE_ECC,
    )
    remap = _measure(nvml, nvml.nvmlDeviceGetRemappedRows, handle)
    if remap is not None:
        _correctable, uncorrectable, pending, failure = remap
        facts.remap_uncorrectable = uncorrectable
        facts.remap_pending = bool(pending)
        facts.remap_failure = bool(failure)
    retired_pending = _measure(nvml, nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    facts.retired_pages_pending = None if retired_pending is None else bool(retired_pending)
    retired = [
        _measure(nvml, nvml.nvmlDeviceGetRetiredPages, handle, cause)
        for cause in NVML_PAGE_RETIREMENT_CAUSES
    ]
    facts.retired_pages = total([len(pages) for pages in retired if pages is not None])
    mig = _measure(nvml, nvml.nvmlDeviceGetMigMode, handle)
    facts.mig_enabled = None if mig is None else bool(mig[0])
    _fill_thermal(nvml, handle, facts)
    reasons = _measure(nvml, nvml.nvmlDeviceGetCurrentClocksEventReasons, handle)
    facts.clock_event_reasons = clock_event_names(reasons or 0)
    facts.pcie_gen_current = _measure(nvml, nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle)
    facts.pcie_gen_max = _measure(nvml, nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle)
    facts.pcie_width_current = _measure(nvml, nvml.nvmlDeviceGetCurrPcieLinkWidth, handle)
    facts.pcie_width_max = _measure(nvml, nvml.nvmlDeviceGetMaxPcieLinkWidth, handle)
    facts.nvlinks = _read_nvlinks(nvml, handle)
    _fill_recovery(nvml, handle, facts)


def _fill_thermal(nvml: Nvml, handle: DeviceHandle, facts: GpuFacts) -> None:
    temperature = _measure(nvml, nvml.nvmlDeviceGetTemperature, handle, NVML_TEMPERATURE_GPU)
    slowdown = _measure(
        nvml, nvml.nvmlDeviceGetTemperatureThreshold, handle, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    )
    shutdown = _measure(
        nvml, nvml.nvmlDeviceGetTemperatureThreshold, handle, NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
    )
    facts.temperature_c = None if temperature is None else float(temperature)
    facts.slowdown_temp_c = None if slowdown is None else float(slowdown)
    facts.shutdown_temp_c = None if shutdown is None else float(shutdown)


def clock_event_names(bitmask: int) -> frozenset[str]:
    """Names of the set bits; CLOCK_EVENT_REASONS lists them from bit 0 (0x1) upwards."""
    return frozenset(name for bit, name in enumerate(CLOCK_EVENT_REASONS) if bitmask >> bit & 1)


def _read_nvlinks(nvml: Nvml, handle: DeviceHandle) -> list[NvLinkFacts]:
    links: list[NvLinkFacts] = []
    for link in range(NVML_NVLINK_MAX_LINKS):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError as exc:
            if _code(exc) in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT):
                break  # past the last link (or a PCIe card with none)
            _raise_if_fatal(exc)
            links.append(NvLinkFacts(link, None))
            continue
        errors: dict[str, int] = {}
        for counter, counter_name in enumerate(NVLINK_ERROR_COUNTERS):
            value = _measure(nvml, nvml.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter)
            if value is not None:  # an absent counter stays absent, not zero
                errors[counter_name] = value
        links.append(NvLinkFacts(link, bool(state), errors))
    return links


def _fill_recovery(nvml: Nvml, handle: DeviceHandle, facts: GpuFacts) -> None:
    fields = (
        NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
        NVML_FI_DEV_RESET_STATUS,
        NVML_FI_DEV_DRAIN_AND_RESET_STATUS,
    )
    values = _measure(nvml, nvml.nvmlDeviceGetFieldValues, handle, list(fields))
    if values is None:
        return
    # Each field carries its own return code; a driver that lacks a field fails only it.
    read: dict[int, int] = {}
    for value in values:
        number = _field_value(value)
        if value.nvmlReturn == NVML_SUCCESS and number is not None:
            read[value.fieldId] = number
    if (action := read.get(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)) is not None:
        facts.recovery_action = RECOVERY_ACTION_NAMES.get(action, f"Unknown ({action})")
    if (reset := read.get(NVML_FI_DEV_RESET_STATUS)) is not None:
        facts.reset_required = bool(reset)
    if (drain := read.get(NVML_FI_DEV_DRAIN_AND_RESET_STATUS)) is not None:
        facts.drain_and_reset_recommended = bool(drain)


def _field_value(value: FieldValue) -> int | None:
    """The integer in a c_nvmlFieldValue_t, from the union member its valueType names."""
    if not 0 <= value.valueType < len(_VALUE_MEMBERS):
        return None
    return int(getattr(value.value, _VALUE_MEMBERS[value.valueType]))


def read_xid_events(nvml: Nvml, wait_ms: int) -> list[tuple[str, int]]:
    """(PCI bus id, Xid) for each critical Xid event raised within ``wait_ms``."""
    with nvml_session(nvml):
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            raise CheckFailed(f"nvmlEventSetCreate failed: {exc}") from None
        try:
            if not _register_xid_events(nvml, event_set):
                return []
            return _wait_for_events(nvml, event_set, wait_ms)
        finally:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(event_set)


def _register_xid_events(nvml: Nvml, event_set: EventSet) -> int:
    """Registers every GPU that supports Xid events; returns how many did."""
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as exc:
        raise CheckFailed(f"nvmlDeviceGetCount failed: {exc}") from None
    registered = 0
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            if nvml.nvmlDeviceGetSupportedEventTypes(handle) & NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
                nvml.nvmlDeviceRegisterEvents(handle, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, event_set)
                registered += 1
        except nvml.NVMLError:
            continue  # a GPU that cannot be watched is reported by read_gpu_facts
    return registered


def _wait_for_events(nvml: Nvml, event_set: EventSet, wait_ms: int) -> list[tuple[str, int]]:
    events: list[tuple[str, int]] = []
    deadline = SYSTEM_CLOCK.monotonic() + wait_ms / 1000
    while (left_ms := int((deadline - SYSTEM_CLOCK.monotonic()) * 1000)) > 0:
        try:
            data = nvml.nvmlEventSetWait(event_set, left_ms)
        except nvml.NVMLError as exc:
            if _code(exc) == NVML_ERROR_TIMEOUT:
                break  # nothing more happened in the window
            raise CheckFailed(f"nvmlEventSetWait failed: {exc}") from None
        try:
            bus_id = _text(nvml.nvmlDeviceGetPciInfo(data.device).busId)
        except nvml.NVMLError:
            bus_id = "unknown"
        events.append((bus_id, int(data.eventData)))
    return events


class NvmlCheck:
    """GPU health from NVML on the live node, plus the Xids raised while it looked."""

    name: ClassVar[str] = "nvml"
    layer: ClassVar[Layer] = Layer.GPU

    def __init__(self, nvml: Nvml | None = None) -> None:
        self._nvml = nvml

    def run(self, ctx: CheckContext) -> list[Finding]:
        if not ctx.sources.live:
            raise ToolMissing(
                "NVML reads the live node only; bundles carry nvidia-smi output instead"
            )
        nvml = self._nvml if self._nvml is not None else import_pynvml()
        figures = expected_figures(ctx.config.deep)
        findings = evaluate_gpus(read_gpu_facts(nvml), ctx.expectations.gpus, "nvml", figures)
        # A short look: the kernel log check is the full Xid history; this catches new ones.
        window_ms = min(EVENT_WINDOW_MS, int(ctx.timeout_s * 1000 / 10))  # a tenth at most
        try:
            events = read_xid_events(nvml, window_ms)
        except CheckError as exc:
            # The GPU facts above still stand; say the window was missed without failing them.
            return [*findings, _events_unavailable(str(exc))]
        for bus_id, xid in events:
            evidence = f"NVML Xid event {xid} on {bus_id}"
            findings.append(xid_finding(xid, gpu(bus_id), "nvml-events", evidence))
        return findings


def _events_unavailable(reason: str) -> Finding:
    message = f"NVML Xid events not watched: {reason}"
    code = "NVML_EVENTS_UNAVAILABLE"
    return Finding(Layer.GPU, code, Severity.INFO, Action.NONE, NODE, "nvml-events", message)


def import_pynvml() -> Nvml:
    try:
        import pynvml
    except ImportError:
        raise ToolMissing("pynvml is not installed (pip install nvidia-ml-py)") from None
    binding: Nvml = pynvml
    return binding
