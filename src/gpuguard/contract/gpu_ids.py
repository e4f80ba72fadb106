"""GPU identifiers as a pod's annotation and a finding name them: one GPU, two spellings."""

from __future__ import annotations

import re
from collections.abc import Collection

_PCI_BUS_ID = re.compile(r"^(?:([0-9a-f]{1,8}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")


def normal_gpu_id(gpu: str) -> str:
    """``00000000:91:00.0`` (nvidia-smi) and ``0000:91:00.0`` (sysfs) name one GPU."""
    text = gpu.strip().lower()
    match = _PCI_BUS_ID.match(text)
    if match is None:
        return text
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{bus}:{device}.{function}"


def _kind(gpu: str) -> str:
    return "pci" if _PCI_BUS_ID.match(gpu) else "uuid"


def gpus_in_common(held: Collection[str], named: Collection[str]) -> set[str] | None:
    """The GPUs of ``held`` that ``named`` names too, normalised; None when the two cannot
    be compared (nothing held is known, or only in another spelling: UUIDs against bus
    ids), so the caller cannot tell either way."""
    wanted = {normal_gpu_id(gpu) for gpu in named}
    kinds = {_kind(gpu) for gpu in wanted}
    comparable = {normal_gpu_id(gpu) for gpu in held if gpu.strip()}
    comparable = {gpu for gpu in comparable if _kind(gpu) in kinds}
    return comparable & wanted if comparable else None
