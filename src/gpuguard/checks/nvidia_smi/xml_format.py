"""``nvidia-smi -q -x`` (DTD nvsmi_device_v11, v12 and v13) into :class:`GpuFacts`.

Element names moved between versions: v12 renamed ``clocks_throttle_reasons`` to
``clocks_event_reasons``; v13 replaced the absolute temperature thresholds with
T.Limit-relative ones and added ``gpu_recovery_action``. ``remapped_rows`` may be the bare
text ``N/A`` (MIG enabled, or a pre-Ampere GPU).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from gpuguard.checks.gpu_facts import CLOCK_EVENT_REASONS, GpuFacts
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

ROOT_TAG = "nvidia_smi_log"

# nvidia-smi's own DOCTYPE names an external DTD and declares nothing; it is dropped. Every
# other DOCTYPE (an internal subset can declare entities) or ENTITY is refused, so that
# entity expansion cannot blow up memory.
_PLAIN_DOCTYPE = re.compile(r"<!DOCTYPE[^\[>]*>", re.IGNORECASE)
_DECLARATION = re.compile(r"<!(?:DOCTYPE|ENTITY)", re.IGNORECASE)

_REASON_PREFIXES = ("clocks_event_reason_", "clocks_throttle_reason_")
# The XML says "display_clocks_setting"; NVML and the text report say "display clock".
_REASON_ALIASES = {"display_clocks_setting": "display_clock_setting"}


def parse_smi_xml(text: str) -> list[GpuFacts]:
    """The GPUs an ``nvidia-smi -q -x`` report describes; ParseError if it is not one."""
    return read_smi_xml(text).gpus


def read_smi_xml(text: str) -> SmiReport:
    """The report's announced GPU count and its GPUs (lost ones included)."""
    lines, lost = split_lost_gpus(text)
    root = _parse_root("\n".join(lines))
    attached = integer(root.findtext("attached_gpus"))
    if attached is None:
        raise ParseError("nvidia-smi XML: no readable <attached_gpus>")
    gpus = [_gpu_facts(element) for element in root.findall("gpu")] + lost
    if not gpus:
        raise ParseError(f"nvidia-smi XML: describes no GPU (attached_gpus {attached})")
    if len(gpus) > attached:
        raise ParseError(f"nvidia-smi XML: {len(gpus)} GPUs but attached_gpus says {attached}")
    return SmiReport(attached, gpus)


def _parse_root(text: str) -> ET.Element:
    cleaned = _PLAIN_DOCTYPE.sub("", text, count=1)
    if _DECLARATION.search(cleaned):
        raise ParseError("nvidia-smi XML: refusing a DOCTYPE or ENTITY declaration")
    try:
        root = ET.fromstring(cleaned)
    except (ET.ParseError, ValueError, LookupError) as exc:
        raise ParseError(f"nvidia-smi XML: not well-formed: {exc}") from None
    if root.tag != ROOT_TAG:
        raise ParseError(f"nvidia-smi XML: root is <{root.tag[:40]}>, not <{ROOT_TAG}>")
    return root


def _gpu_facts(element: ET.Element) -> GpuFacts:
    bus_id = element.get("id") or element.findtext("pci/pci_bus_id")
    if not bus_id or not bus_id.strip():
        raise ParseError("nvidia-smi XML: a <gpu> without a PCI bus id")
    link = element.find("pci/pci_gpu_link_info")
    facts = GpuFacts(
        pci_bus_id=bus_id.strip(),
        uuid=_text(element, "uuid"),
        name=_text(element, "product_name"),
        error=unusable_error([e.text for e in element.iter() if e.text]),
        ecc_uncorrected_volatile=_volatile_uncorrectable(element.find("ecc_errors/volatile")),
        retired_pages_pending=any_true(
            [
                yes_no(element.findtext("retired_pages/pending_blacklist")),
                yes_no(element.findtext("retired_pages/pending_retirement")),
            ]
        ),
        retired_pages=total(
            [
                integer(element.findtext(f"retired_pages/{cause}/retired_count"))
                for cause in ("multiple_single_bit_retirement", "double_bit_retirement")
            ]
        ),
        temperature_c=number(element.findtext("temperature/gpu_temp")),
        slowdown_temp_c=number(element.findtext("temperature/gpu_temp_slow_threshold")),
        shutdown_temp_c=number(element.findtext("temperature/gpu_temp_max_threshold")),
        tlimit_margin_c=number(element.findtext("temperature/gpu_temp_tlimit")),
        slowdown_tlimit_c=number(element.findtext("temperature/gpu_temp_slow_tlimit_threshold")),
        shutdown_tlimit_c=number(element.findtext("temperature/gpu_temp_max_tlimit_threshold")),
        clock_event_reasons=_clock_event_reasons(element),
        recovery_action=_text(element, "gpu_recovery_action"),
        reset_required=yes_no(element.findtext("gpu_reset_status/reset_required")),
        drain_and_reset_recommended=yes_no(
            element.findtext("gpu_reset_status/drain_and_reset_recommended")
        ),
        mig_enabled=enabled(element.findtext("mig_mode/current_mig")),
    )
    if link is not None:
        facts.pcie_gen_current = integer(link.findtext("pcie_gen/current_link_gen"))
        facts.pcie_gen_max = integer(link.findtext("pcie_gen/max_link_gen"))
        facts.pcie_width_current = integer(link.findtext("link_widths/current_link_width"))
        facts.pcie_width_max = integer(link.findtext("link_widths/max_link_width"))
    remapped = element.find("remapped_rows")
    if remapped is not None and len(remapped):  # the bare text "N/A" has no children
        facts.remap_pending = yes_no(remapped.findtext("remapped_row_pending"))
        facts.remap_failure = yes_no(remapped.findtext("remapped_row_failure"))
        facts.remap_uncorrectable = integer(remapped.findtext("remapped_row_unc"))
    return facts


def _text(element: ET.Element, path: str) -> str | None:
    return measured(element.findtext(path))


def _volatile_uncorrectable(volatile: ET.Element | None) -> int | None:
    if volatile is None:
        return None
    # Pre-Ampere reports: single_bit / double_bit with a total each.
    double_bit = volatile.findtext("double_bit/total")
    if double_bit is not None:
        return integer(double_bit)
    # Ampere and later: sram_uncorrectable (Hopper: _parity and _secded), dram_uncorrectable.
    return total([integer(c.text) for c in volatile if "uncorrectable" in c.tag])


def _clock_event_reasons(element: ET.Element) -> frozenset[str]:
    reasons = element.find("clocks_event_reasons")
    if reasons is None:
        reasons = element.find("clocks_throttle_reasons")
    if reasons is None:
        return frozenset()
    names: set[str] = set()
    for child in reasons:
        name = child.tag
        for prefix in _REASON_PREFIXES:
            name = name.removeprefix(prefix)
        name = _REASON_ALIASES.get(name, name)
        if name in CLOCK_EVENT_REASONS and active(child.text):
            names.add(name)
    return frozenset(names)
