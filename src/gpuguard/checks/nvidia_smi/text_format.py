"""``nvidia-smi -q`` (the text report) into :class:`GpuFacts`.

The report is an indented outline of "Label : value" entries and value-less section
headers. It announces "Attached GPUs : N" and then gives one section per GPU, headed
"GPU 00000000:07:00.0" at column 0. nvidia-smi can be killed mid-report, so a report
counts as complete only when it describes all N GPUs (a GPU it could not open counts,
see :func:`split_lost_gpus`) and every section reaches its "Processes" entry, which
nvidia-smi prints at the end of each GPU's report.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpuguard.checks.gpu_facts import GpuFacts
from gpuguard.checks.nvidia_smi.common import (
    SmiReport,
    active,
    any_true,
    enabled,
    integer,
    measured,
    number,
    split_lost_gpus,
    total,
    unusable_error,
    yes_no,
)
from gpuguard.errors import ParseError

LabelPath = tuple[str, ...]

_GPU_HEADER = re.compile(r"GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])")
# The label ends at the first " :" followed by a space or the end of the line; bus ids and
# times in values have no space before their colons.
_SEPARATOR = re.compile(r"\s:(?:\s|$)")
_LAST_ENTRY = ("Processes",)
_FIRST_ENTRY = ("Product Name",)  # absent from a report filtered with -d
# nvidia-smi nests five levels at most; a deeper outline is not its report (and would make
# every entry's label path long).
_MAX_DEPTH = 12

_CLOCK_REASON_SECTIONS = ("Clocks Event Reasons", "Clocks Throttle Reasons")
_CLOCK_REASONS = {
    "Idle": "gpu_idle",
    "Applications Clocks Setting": "applications_clocks_setting",
    "SW Power Cap": "sw_power_cap",
    "HW Slowdown": "hw_slowdown",
    "HW Thermal Slowdown": "hw_thermal_slowdown",
    "HW Power Brake Slowdown": "hw_power_brake_slowdown",
    "Sync Boost": "sync_boost",
    "SW Thermal Slowdown": "sw_thermal_slowdown",
    "Display Clock Setting": "display_clock_setting",
}


class _GpuSection:
    """One GPU's entries, by label path such as ("Remapped Rows", "Pending")."""

    def __init__(self, pci_bus_id: str) -> None:
        self.pci_bus_id = pci_bus_id
        self.values: dict[LabelPath, str | None] = {}
        self._open: list[tuple[int, str]] = []  # (indent, label) of the enclosing headers

    def add(self, indent: int, label: str, value: str | None) -> None:
        while self._open and self._open[-1][0] >= indent:
            self._open.pop()
        if len(self._open) >= _MAX_DEPTH:
            raise ParseError(f"nvidia-smi -q: outline nested deeper than {_MAX_DEPTH} levels")
        path = (*(name for _, name in self._open), label)
        self._open.append((indent, label))
        self.values.setdefault(path, value)  # a repeated label (a process list) keeps the first

    def get(self, *path: str) -> str | None:
        return self.values.get(path)

    def children(self, *parent: str) -> Iterator[tuple[str, str | None]]:
        """(label, value) of the entries directly under ``parent``."""
        for path, value in self.values.items():
            if len(path) == len(parent) + 1 and path[:-1] == parent:
                yield path[-1], value

    def descendants(self, top: str) -> Iterator[tuple[str, str | None]]:
        for path, value in self.values.items():
            if len(path) > 1 and path[0] == top:
                yield path[-1], value


def parse_smi_text(text: str) -> list[GpuFacts]:
    """The GPUs an ``nvidia-smi -q`` report describes; ParseError if incomplete or garbled."""
    return read_smi_text(text).gpus


def read_smi_text(text: str) -> SmiReport:
    """An ``nvidia-smi -q`` report, or a ``-q -d SECTION`` one (``SmiReport.only``)."""
    lines, lost = split_lost_gpus(text)
    attached: int | None = None
    announced = 0
    sections: list[_GpuSection] = []
    for raw in lines:
        line = raw.expandtabs(4).rstrip()
        content = line.lstrip()
        if not content:
            continue
        indent = len(line) - len(content)
        header = _GPU_HEADER.fullmatch(content)
        if indent == 0 and header:
            sections.append(_GpuSection(header[1]))
            continue
        label, value = _entry(content)
        if indent == 0 and label == "Attached GPUs":
            announced += 1
            attached = integer(value)
        elif indent > 0 and sections:
            sections[-1].add(indent, label, value)
    only = _check_complete(announced, attached, sections, len(lost))
    gpus = [_gpu_facts(section) for section in sections] + lost
    return SmiReport(len(gpus), gpus, only)


def _entry(content: str) -> tuple[str, str | None]:
    separator = _SEPARATOR.search(content)
    if separator is None:
        return content, None
    return content[: separator.start()].rstrip(), content[separator.end() :].strip()


def _check_complete(
    announced: int, attached: int | None, sections: list[_GpuSection], lost: int
) -> tuple[str, ...]:
    """Raise ParseError unless the report is whole; the sections of a ``-d`` report."""
    if announced != 1 or attached is None:
        raise ParseError(
            "nvidia-smi -q: expected one readable 'Attached GPUs' line, "
            f"found {announced} (not an nvidia-smi -q report?)"
        )
    described = len(sections) + lost
    if described == 0:
        raise ParseError(f"nvidia-smi -q: describes no GPU (Attached GPUs: {attached})")
    if described != attached:
        raise ParseError(
            f"nvidia-smi -q: announces {attached} GPUs but describes {described} (truncated?)"
        )
    if sections and all(_FIRST_ENTRY not in section.values for section in sections):
        return _check_filtered(sections)
    for section in sections:
        if _LAST_ENTRY not in section.values:
            raise ParseError(
                f"nvidia-smi -q: the report on GPU {section.pci_bus_id} ends early (truncated?)"
            )
    return ()


def _check_filtered(sections: list[_GpuSection]) -> tuple[str, ...]:
    """A ``-q -d`` report prints the same sections for every GPU, and no Product Name; each
    of its entries is a section with entries under it or a label with a value. Anything
    else (a GPU with fewer entries than the first, a label cut short) is a cut report."""
    shape = set(sections[0].values)
    for section in sections:
        parents = {path[:-1] for path in section.values}
        cut = [p for p, v in section.values.items() if v is None and p not in parents]
        if not section.values or cut or set(section.values) != shape:
            raise ParseError(
                f"nvidia-smi -q: the report on GPU {section.pci_bus_id} ends early or differs"
                " from the first GPU's (truncated?)"
            )
    return tuple(dict.fromkeys(path[0] for path in sections[0].values))


def _gpu_facts(section: _GpuSection) -> GpuFacts:
    get = section.get
    link = ("PCI", "GPU Link Info")
    return GpuFacts(
        pci_bus_id=section.pci_bus_id,
        uuid=measured(get("GPU UUID")),
        name=measured(get("Product Name")),
        error=unusable_error([value for value in section.values.values() if value]),
        ecc_uncorrected_volatile=_volatile_uncorrectable(section),
        remap_pending=yes_no(get("Remapped Rows", "Pending")),
        remap_failure=yes_no(get("Remapped Rows", "Remapping Failure Occurred")),
        remap_uncorrectable=integer(get("Remapped Rows", "Uncorrectable Error")),
        # "Pending Page Blacklist" (older drivers: "Pending Page Retirement", "Pending").
        retired_pages_pending=any_true(
            [
                yes_no(value)
                for label, value in section.children("Retired Pages")
                if label.startswith("Pending")
            ]
        ),
        retired_pages=total(
            [integer(get("Retired Pages", cause)) for cause in ("Single Bit ECC", "Double Bit ECC")]
        ),
        temperature_c=number(get("Temperature", "GPU Current Temp")),
        slowdown_temp_c=number(get("Temperature", "GPU Slowdown Temp")),
        shutdown_temp_c=number(get("Temperature", "GPU Shutdown Temp")),
        tlimit_margin_c=number(get("Temperature", "GPU T.Limit Temp")),
        slowdown_tlimit_c=number(get("Temperature", "GPU Slowdown T.Limit Temp")),
        shutdown_tlimit_c=number(get("Temperature", "GPU Shutdown T.Limit Temp")),
        clock_event_reasons=_clock_event_reasons(section),
        pcie_gen_current=integer(get(*link, "PCIe Generation", "Current")),
        pcie_gen_max=integer(get(*link, "PCIe Generation", "Max")),
        pcie_width_current=integer(get(*link, "Link Width", "Current")),
        pcie_width_max=integer(get(*link, "Link Width", "Max")),
        recovery_action=measured(get("GPU Recovery Action")),
        reset_required=yes_no(get("GPU Reset Status", "Reset Required")),
        drain_and_reset_recommended=yes_no(get("GPU Reset Status", "Drain and Reset Recommended")),
        mig_enabled=enabled(get("MIG Mode", "Current")),
    )


def _volatile_uncorrectable(section: _GpuSection) -> int | None:
    # Pre-Ampere reports: "Single Bit" / "Double Bit" groups with a "Total" each.
    double_bit = section.get("ECC Errors", "Volatile", "Double Bit", "Total")
    if double_bit is not None:
        return integer(double_bit)
    # Ampere and later: "SRAM Uncorrectable" (Hopper: "… Parity", "… SEC-DED"), "DRAM …".
    return total(
        [
            integer(value)
            for label, value in section.children("ECC Errors", "Volatile")
            if "uncorrectable" in label.lower()
        ]
    )


def _clock_event_reasons(section: _GpuSection) -> frozenset[str]:
    names: set[str] = set()
    for top in _CLOCK_REASON_SECTIONS:
        for label, value in section.descendants(top):
            name = _CLOCK_REASONS.get(label)
            if name and active(value):
                names.add(name)
    return frozenset(names)
