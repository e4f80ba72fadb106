"""What nvidia-smi's XML and text reports share: value spellings and the lost-GPU message.

nvidia-smi prints measured values with units ("27 C", "16x", "192 bank(s)") and spells
"not measured" many ways ("N/A", "[N/A]", "Not Supported", "Requested functionality has
been deprecated"). Every reader here returns ``None`` for those, never a default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuguard.checks.gpu_facts import GpuFacts

NOT_MEASURED = frozenset(
    {
        "",
        "n/a",
        "not supported",
        "not available",
        "unknown",
        "unknown error",
        "insufficient permissions",
        "requested functionality has been deprecated",
    }
)

# A number followed by nothing but a unit. The digit limit keeps int() away from Python's
# limit on huge decimal strings; no real value comes close.
_NUMBER = re.compile(r"([-+]?\d{1,18}(?:\.\d{1,18})?)\s*([A-Za-z%]+(?:\(s\))?)?")

_YES_NO = {"yes": True, "no": False}
_ACTIVE = {"active": True, "not active": False}
_ENABLED = {"enabled": True, "disabled": False}

# Printed instead of a GPU's report when the driver cannot open it, e.g.
# "Unable to determine the device handle for GPU0000:91:00.0: Unknown Error" or
# "Unable to determine the device handle for GPU1: 0000:34:00.0: Unknown Error".
_LOST_GPU = re.compile(r"Unable to determine the device handle for GPU(?P<rest>.*)")
_BUS_ID = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")
_INDEX = re.compile(r"\s*(\d{1,3})\s*:\s")

# Field values nvidia-smi prints for a GPU it reached but that is no longer usable.
_UNUSABLE_VALUES = {"gpu is lost": "GPU_IS_LOST", "gpu requires reset": "RESET_REQUIRED"}


@dataclass(frozen=True)
class SmiReport:
    """One nvidia-smi report: the GPU count it announces and the GPUs it describes."""

    attached_gpus: int
    gpus: list[GpuFacts]
    # The sections of a report filtered with ``nvidia-smi -q -d``; () for a whole report.
    only: tuple[str, ...] = ()


def measured(raw: str | None) -> str | None:
    """The value's text, or ``None`` when nvidia-smi says it was not measured."""
    if raw is None:
        return None
    text = raw.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1].strip()
    return None if text.casefold() in NOT_MEASURED else text


def number(raw: str | None) -> float | None:
    text = measured(raw)
    if text is None:
        return None
    match = _NUMBER.fullmatch(text)
    return float(match[1]) if match else None


def integer(raw: str | None) -> int | None:
    value = number(raw)
    return int(value) if value is not None and value.is_integer() else None


def yes_no(raw: str | None) -> bool | None:
    return _word(raw, _YES_NO)


def active(raw: str | None) -> bool | None:
    return _word(raw, _ACTIVE)


def enabled(raw: str | None) -> bool | None:
    return _word(raw, _ENABLED)


def _word(raw: str | None, words: dict[str, bool]) -> bool | None:
    text = measured(raw)
    return None if text is None else words.get(text.casefold())


def any_true(values: list[bool | None]) -> bool | None:
    """True if any is True, False if all were measured False, else ``None``."""
    if any(values):
        return True
    return False if values and all(v is False for v in values) else None


def total(values: list[int | None]) -> int | None:
    """The sum of the measured counts; ``None`` when none was measured."""
    counts = [v for v in values if v is not None]
    return sum(counts) if counts else None


def unusable_error(values: list[str]) -> str | None:
    """The error word when any field value says the GPU is lost or needs a reset."""
    for value in values:
        word = _UNUSABLE_VALUES.get(value.strip().casefold())
        if word:
            return word
    return None


def split_lost_gpus(text: str) -> tuple[list[str], list[GpuFacts]]:
    """The report's lines without lost-GPU messages, and a GpuFacts for each message."""
    kept: list[str] = []
    lost: list[GpuFacts] = []
    for line in text.splitlines():
        match = _LOST_GPU.search(line)
        if match:
            lost.append(_lost_gpu(match["rest"]))
        else:
            kept.append(line)
    return kept, lost


# nvidia-smi cannot open a GPU the driver has lost with NVML_ERROR_UNKNOWN ("Unknown
# Error", what it prints after the GPU fell off the bus, Xid 79) as with
# NVML_ERROR_GPU_IS_LOST: both read as lost (GPU_LOST, a reboot: a GPU reset needs a handle).
# Every other reason (a permission, say) keeps its own words.
_UNKNOWN_REASON = "unknown error"


def _lost_gpu(rest: str) -> GpuFacts:
    reason = rest.rsplit(": ", 1)[-1].strip() if ": " in rest else ""
    if not reason or reason.casefold() == _UNKNOWN_REASON:
        reason = "GPU is lost (no device handle: Unknown Error)"
    bus_id = _BUS_ID.search(rest)
    index_match = _INDEX.match(rest)
    index = int(index_match[1]) if index_match else None
    # Without a bus id, name it the way the NVML check names a GPU it cannot open.
    fallback_id = "unknown" if index is None else f"unknown-{index}"
    pci_bus_id = bus_id[0] if bus_id else fallback_id
    return GpuFacts(pci_bus_id=pci_bus_id, index=index, error=reason)
