"""evaluate_gpus: one test per rule, on hand-built facts."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gpuguard.checks.gpu_facts import GpuFacts, NvLinkFacts, evaluate_gpus
from gpuguard.checks.load.figures import expected_figures
from gpuguard.checks.nvidia_smi.xml_format import parse_smi_xml
from gpuguard.config import DeepChecks, GpuFigures
from gpuguard.model import NODE, Action, Finding, Layer, Severity
from tests.conftest import read_data

XML_A10G = "nvidia-smi-q-x_a10g_515.105.01_v11.xml"
XML_T4 = "nvidia-smi-q-x_tesla-t4_515.105.01_v11.xml"

BUS_ID = "00000000:19:00.0"
UUID = "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa"


def healthy(**changes: object) -> GpuFacts:
    """A GPU with every fact measured and nothing wrong, with ``changes`` applied."""
    facts = GpuFacts(
        pci_bus_id=BUS_ID,
        uuid=UUID,
        name="NVIDIA H100 80GB HBM3",
        index=0,
        ecc_uncorrected_volatile=0,
        remap_pending=False,
        remap_failure=False,
        remap_uncorrectable=0,
        retired_pages_pending=False,
        temperature_c=40.0,
        slowdown_temp_c=87.0,
        shutdown_temp_c=92.0,
        tlimit_margin_c=45.0,
        slowdown_tlimit_c=-2.0,
        shutdown_tlimit_c=-8.0,
        clock_event_reasons=frozenset({"gpu_idle"}),
        pcie_gen_current=5,
        pcie_gen_max=5,
        pcie_width_current=16,
        pcie_width_max=16,
        nvlinks=[NvLinkFacts(link, True, {"replay": 0, "recovery": 0}) for link in range(18)],
        recovery_action="None",
        reset_required=False,
        drain_and_reset_recommended=False,
        mig_enabled=False,
    )
    return replace(facts, **changes)  # type: ignore[arg-type]


def judge(facts: GpuFacts, expected_gpus: int | None = None) -> list[Finding]:
    return evaluate_gpus([facts], expected_gpus, "test", expected_figures(DeepChecks()))


def only(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, [f.code for f in findings]
    return findings[0]


def verdict(finding: Finding) -> tuple[str, Severity, Action]:
    return finding.code, finding.severity, finding.action


def test_healthy_gpu_has_no_findings() -> None:
    assert judge(healthy()) == []


def test_unmeasured_facts_yield_no_findings() -> None:
    # Nothing measured: no claim either way (the caller decides what "no answer" means).
    assert evaluate_gpus([GpuFacts(pci_bus_id=BUS_ID)], None, "test") == []


def test_findings_name_the_gpu_layer_source_and_canonical_bus_id() -> None:
    finding = only(judge(healthy(remap_pending=True)))
    assert finding.layer is Layer.GPU
    assert finding.source == "test"
    assert finding.component.kind == "gpu"
    assert finding.component.id == "0000:19:00.0"
    assert finding.component.uuid == UUID


# GPU count


def test_fewer_gpus_than_expected_is_critical_reboot() -> None:
    finding = only(evaluate_gpus([healthy()], 8, "test"))
    assert verdict(finding) == ("GPU_COUNT_MISMATCH", Severity.CRITICAL, Action.REBOOT)
    assert finding.component == NODE
    assert finding.evidence == "gpus_found=1 gpus_expected=8"


def test_more_gpus_than_expected_is_a_warning() -> None:
    gpus = [healthy(), healthy(pci_bus_id="00000000:3b:00.0")]
    finding = only(evaluate_gpus(gpus, 1, "test"))
    assert verdict(finding) == ("GPU_COUNT_MISMATCH", Severity.WARNING, Action.NONE)


def test_expected_count_met_or_unset_gives_nothing() -> None:
    assert evaluate_gpus([healthy()], 1, "test") == []
    assert evaluate_gpus([healthy()], None, "test") == []


def test_no_gpus_at_all_against_an_expectation() -> None:
    finding = only(evaluate_gpus([], 4, "test"))
    assert verdict(finding) == ("GPU_COUNT_MISMATCH", Severity.CRITICAL, Action.REBOOT)


# Errors from the GPU itself


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        ("GPU_IS_LOST", ("GPU_LOST", Severity.CRITICAL, Action.REBOOT)),
        ("GPU is lost", ("GPU_LOST", Severity.CRITICAL, Action.REBOOT)),
        ("RESET_REQUIRED", ("GPU_RESET_REQUIRED", Severity.CRITICAL, Action.RESET_GPU)),
        ("GPU requires reset", ("GPU_RESET_REQUIRED", Severity.CRITICAL, Action.RESET_GPU)),
        ("Unknown Error", ("GPU_ERROR", Severity.CRITICAL, Action.RESET_GPU)),
        ("IRQ_ISSUE", ("GPU_ERROR", Severity.CRITICAL, Action.RESET_GPU)),
    ],
)
def test_gpu_error(error: str, expected: tuple[str, Severity, Action]) -> None:
    finding = only(judge(GpuFacts(pci_bus_id="0000:91:00.0", error=error)))
    assert verdict(finding) == expected
    assert finding.evidence == f"error={error}"


# Memory


def test_volatile_uncorrectable_ecc() -> None:
    finding = only(judge(healthy(ecc_uncorrected_volatile=2)))
    assert verdict(finding) == ("ECC_UNCORRECTABLE_VOLATILE", Severity.CRITICAL, Action.RESET_GPU)
    assert finding.evidence == "ecc_uncorrected_volatile=2"


def test_row_remap_failure_means_replace() -> None:
    finding = only(judge(healthy(remap_failure=True)))
    assert verdict(finding) == ("ROW_REMAP_FAILURE", Severity.CRITICAL, Action.REPLACE)


def test_row_remap_pending_needs_a_reset() -> None:
    finding = only(judge(healthy(remap_pending=True)))
    assert verdict(finding) == ("ROW_REMAP_PENDING", Severity.CRITICAL, Action.RESET_GPU)


def test_remap_status_unmeasured_under_mig_is_reported_as_info() -> None:
    facts = healthy(mig_enabled=True, remap_pending=None, remap_failure=None)
    finding = only(judge(facts))
    assert verdict(finding) == ("REMAP_STATUS_UNAVAILABLE", Severity.INFO, Action.NONE)


def test_remap_status_unmeasured_without_mig_gives_nothing() -> None:
    # Pre-Ampere GPUs have no row remapper; None must not become a finding or a pass.
    assert judge(healthy(remap_pending=None, remap_failure=None)) == []
    assert judge(healthy(mig_enabled=True)) == []  # measured under MIG: nothing to say


def test_many_uncorrectable_remaps_warn() -> None:
    finding = only(judge(healthy(remap_uncorrectable=512)))
    assert verdict(finding) == ("ROW_REMAP_UNCORRECTABLE_HIGH", Severity.WARNING, Action.NONE)
    assert judge(healthy(remap_uncorrectable=511)) == []


def test_retired_pages_pending() -> None:
    finding = only(judge(healthy(retired_pages_pending=True)))
    assert verdict(finding) == ("RETIRED_PAGES_PENDING", Severity.WARNING, Action.RESET_GPU)


def test_a_full_page_retirement_table_replaces_the_machine() -> None:
    finding = only(judge(healthy(retired_pages=63)))
    assert verdict(finding) == ("RETIRED_PAGES_LIMIT", Severity.CRITICAL, Action.REPLACE)
    assert judge(healthy(retired_pages=62)) == []


# Temperature


def test_temperature_at_slowdown_threshold_warns() -> None:
    finding = only(judge(healthy(temperature_c=87.0)))
    assert verdict(finding) == ("TEMPERATURE_ABOVE_SLOWDOWN", Severity.WARNING, Action.NONE)
    assert "temperature_c=87" in finding.evidence
    assert judge(healthy(temperature_c=86.0)) == []


def test_temperature_at_shutdown_is_critical_and_reported_once() -> None:
    finding = only(judge(healthy(temperature_c=92.0)))
    assert verdict(finding) == ("TEMPERATURE_AT_SHUTDOWN", Severity.CRITICAL, Action.NONE)


def test_tlimit_margin_at_slowdown_offset_warns() -> None:
    facts = healthy(temperature_c=None, tlimit_margin_c=-2.0)
    finding = only(judge(facts))
    assert verdict(finding) == ("TEMPERATURE_ABOVE_SLOWDOWN", Severity.WARNING, Action.NONE)
    assert "tlimit_margin_c=-2" in finding.evidence
    assert judge(healthy(tlimit_margin_c=-1.0)) == []


def test_tlimit_margin_at_shutdown_offset_is_critical() -> None:
    finding = only(judge(healthy(tlimit_margin_c=-8.0)))
    assert verdict(finding) == ("TEMPERATURE_AT_SHUTDOWN", Severity.CRITICAL, Action.NONE)


def test_temperature_without_thresholds_gives_nothing() -> None:
    facts = healthy(
        temperature_c=120.0,
        slowdown_temp_c=None,
        shutdown_temp_c=None,
        tlimit_margin_c=None,
    )
    assert judge(facts) == []


# Clocks


@pytest.mark.parametrize(
    ("reason", "code"),
    [
        ("hw_slowdown", "CLOCK_HW_SLOWDOWN"),
        ("hw_thermal_slowdown", "CLOCK_HW_THERMAL_SLOWDOWN"),
        ("hw_power_brake_slowdown", "CLOCK_HW_POWER_BRAKE"),
        ("sw_thermal_slowdown", "CLOCK_SW_THERMAL_SLOWDOWN"),
    ],
)
def test_protective_clock_slowdown_warns(reason: str, code: str) -> None:
    finding = only(judge(healthy(clock_event_reasons=frozenset({reason}))))
    assert verdict(finding) == (code, Severity.WARNING, Action.NONE)
    assert finding.evidence == f"clock_event_reasons={reason}"


def test_normal_clock_reasons_give_nothing() -> None:
    normal = frozenset(
        {"gpu_idle", "sw_power_cap", "sync_boost", "applications_clocks_setting"}
        | {"display_clock_setting"}
    )
    assert judge(healthy(clock_event_reasons=normal)) == []


# PCIe


def test_pcie_width_below_the_models_installed_width_warns() -> None:
    finding = only(judge(healthy(pcie_width_current=8)))
    assert verdict(finding) == ("PCIE_WIDTH_DEGRADED", Severity.WARNING, Action.NONE)
    assert finding.evidence == "pcie_width_current=8 pcie_width_max=16 pcie_width_expected=16"
    assert "x16 NVIDIA H100 80GB HBM3 is installed at" in finding.message


@pytest.mark.parametrize("capture", [XML_A10G, XML_T4])
def test_cards_wired_at_x8_by_design_are_healthy(capture) -> None:
    # EC2 G5 and G4dn wire these x16 cards at x8: the real captures say "16x" max, "8x" now.
    (facts,) = parse_smi_xml(read_data(capture))
    assert (facts.pcie_width_current, facts.pcie_width_max) == (8, 16)
    assert "PCIE_WIDTH_DEGRADED" not in {f.code for f in judge(facts, 1)}


def test_a_pool_override_of_the_installed_width_is_honoured() -> None:
    facts = healthy(name="NVIDIA A10G", pcie_width_current=8, pcie_width_max=16)
    wired_x16 = DeepChecks(expected={"NVIDIA A10G": GpuFigures(pcie_width=16)})
    assert judge(facts) == []
    (finding,) = evaluate_gpus([facts], None, "test", expected_figures(wired_x16))
    assert finding.code == "PCIE_WIDTH_DEGRADED"


def test_a_model_not_in_the_table_is_judged_against_the_cards_maximum() -> None:
    facts = healthy(name="NVIDIA Future GPU", pcie_width_current=8)
    (finding,) = judge(facts)
    assert finding.code == "PCIE_WIDTH_DEGRADED" and "the card's x16" in finding.message


def test_pcie_generation_below_max_is_only_info() -> None:
    finding = only(judge(healthy(pcie_gen_current=1)))
    assert verdict(finding) == ("PCIE_GEN_BELOW_MAX", Severity.INFO, Action.NONE)


def test_pcie_unmeasured_gives_nothing() -> None:
    assert judge(healthy(pcie_width_current=None, pcie_gen_max=None)) == []


# NVLink


def test_nvlink_down_is_critical() -> None:
    links = [NvLinkFacts(0, True), NvLinkFacts(1, False), NvLinkFacts(2, None)]
    finding = only(judge(healthy(nvlinks=links)))
    assert verdict(finding) == ("NVLINK_DOWN", Severity.CRITICAL, Action.RESET_GPU)
    assert finding.evidence == "link=1 active=False"


def test_nvlink_corrected_errors_are_info() -> None:
    links = [NvLinkFacts(3, True, {"replay": 7, "crc_flit": 2, "recovery": 0})]
    finding = only(judge(healthy(nvlinks=links)))
    assert verdict(finding) == ("NVLINK_ERRORS", Severity.INFO, Action.NONE)
    assert finding.evidence == "link=3 crc_flit=2 replay=7"


def test_nvlink_recovery_errors_warn() -> None:
    links = [NvLinkFacts(5, True, {"recovery": 1})]
    finding = only(judge(healthy(nvlinks=links)))
    assert verdict(finding) == ("NVLINK_ERRORS", Severity.WARNING, Action.NONE)


# Recovery action and reset status


@pytest.mark.parametrize(
    ("text", "severity", "action"),
    [
        ("GPU Reset Required", Severity.CRITICAL, Action.RESET_GPU),
        ("GPU Reset", Severity.CRITICAL, Action.RESET_GPU),  # nvidia-smi's spelling
        ("Node Reboot Required", Severity.CRITICAL, Action.REBOOT),
        ("Node Reboot", Severity.CRITICAL, Action.REBOOT),
        ("Drain P2P", Severity.CRITICAL, Action.RESET_GPU),
        ("Drain and Reset", Severity.CRITICAL, Action.RESET_GPU),
        ("DRAIN_AND_RESET", Severity.CRITICAL, Action.RESET_GPU),
        ("Unknown (9)", Severity.CRITICAL, Action.NONE),  # fail, but guess no repair
    ],
)
def test_recovery_action(text: str, severity: Severity, action: Action) -> None:
    finding = only(judge(healthy(recovery_action=text)))
    assert verdict(finding) == ("RECOVERY_ACTION_REQUIRED", severity, action)
    assert finding.evidence == f"recovery_action={text}"


def test_recovery_action_none_gives_nothing() -> None:
    assert judge(healthy(recovery_action="None")) == []
    assert judge(healthy(recovery_action=None)) == []


@pytest.mark.parametrize("flag", ["reset_required", "drain_and_reset_recommended"])
def test_reset_status_flags(flag: str) -> None:
    finding = only(judge(healthy(**{flag: True})))
    assert verdict(finding) == ("RECOVERY_ACTION_REQUIRED", Severity.CRITICAL, Action.RESET_GPU)
    assert finding.evidence == f"{flag}=True"


# Ordering


def test_order_is_deterministic_whatever_the_input_order() -> None:
    gpus = [
        healthy(pci_bus_id=f"00000000:{bus:02x}:00.0", remap_pending=True, pcie_gen_current=1)
        for bus in (0xDB, 0x19, 0x9B, 0x3B)
    ]
    expected = evaluate_gpus(gpus, 8, "test")
    shuffled = gpus[:]
    random.Random(7).shuffle(shuffled)
    assert evaluate_gpus(shuffled, 8, "test") == expected
    assert expected[0].code == "GPU_COUNT_MISMATCH"
    assert [f.component.id for f in expected[1::2]] == [
        "0000:19:00.0",
        "0000:3b:00.0",
        "0000:9b:00.0",
        "0000:db:00.0",
    ]
