"""nvidia-smi parsers and SmiCheck, on real captured reports (tests/data/SOURCES.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuguard.checks.base import CheckContext
from gpuguard.checks.gpu_facts import evaluate_gpus
from gpuguard.checks.load.figures import expected_figures
from gpuguard.checks.nvidia_smi.check import SmiCheck, parse_smi_text, parse_smi_xml
from gpuguard.checks.nvidia_smi.common import measured, number
from gpuguard.checks.nvidia_smi.text_format import read_smi_text
from gpuguard.checks.nvidia_smi.xml_format import read_smi_xml
from gpuguard.config import Config, DeepChecks
from gpuguard.errors import CheckFailed, ParseError, ToolMissing
from gpuguard.model import NODE, Action, Finding, Severity
from gpuguard.sources import Artifact, BundleSources, ToolOutput

DATA = Path(__file__).parent.parent / "data"

A100_MIG_V12 = "nvidia-smi-q-x_a100-sxm4-80gb_mig_535.54.03_v12.xml"
A10G_V11 = "nvidia-smi-q-x_a10g_515.105.01_v11.xml"
RTX_PRO_V13 = "nvidia-smi-q-x_rtx-pro-6000-blackwell_590.44.01_v13.xml"
RTX4000_V13 = "nvidia-smi-q-x_rtx4000-sff-ada_595.84_v13.xml"
T4_V11 = "nvidia-smi-q-x_tesla-t4_515.105.01_v11.xml"
A10_REMAP_PENDING = "nvidia-smi-q_a10_535.129.03_row_remap_pending.txt"
H100_TRUNCATED = "nvidia-smi-q_h100_535.183.01_truncated_invalid.txt"
H100X8_SLOWDOWN = "nvidia-smi-q_h100x8_535.161.08_hw_slowdown_active.txt"
H100_CAPTURE = "nvidia-smi_capture_h100-80gb-hbm3_590.48.01_full.txt"

H100X8_BUS_IDS = [f"0000:{bus}:00.0" for bus in ("19", "3b", "4c", "5d", "9b", "bb", "cb", "db")]


def read(name: str) -> str:
    return (DATA / name).read_text()


def serious(findings: list[Finding]) -> list[tuple[str, str]]:
    """(code, component id) of every WARNING or CRITICAL finding."""
    return [(f.code, f.component.id) for f in findings if f.severity >= Severity.WARNING]


def capture_query_sections() -> list[str]:
    """The two ``nvidia-smi -q`` reports (idle, load) inside the H100 590 capture."""
    lines = read(H100_CAPTURE).splitlines()
    reports = []
    for start, line in enumerate(lines):
        if line.rstrip() == "# $ nvidia-smi -q":
            body = start + 2  # skip the closing '####' rule of the section header
            end = next(i for i in range(body, len(lines)) if lines[i].startswith("#####"))
            reports.append("\n".join(lines[body:end]))
    assert len(reports) == 2
    return reports


class FakeSources:
    """Sources that hand out fixed tool outputs; absent artifacts are ToolMissing."""

    live = True

    def __init__(self, outputs: dict[Artifact, ToolOutput]) -> None:
        self.outputs = outputs

    def read(self, artifact: Artifact, timeout_s: float) -> ToolOutput:
        if artifact not in self.outputs:
            raise ToolMissing(f"{artifact.value}: not here")
        return self.outputs[artifact]

    def infiniband_root(self) -> Path:
        return Path("/nonexistent")

    def infiniband_root_later(self) -> Path | None:
        return None


def run_check(sources: object, expected_gpus: int | None = None) -> list[Finding]:
    ctx = CheckContext(sources, Config(expected_gpus=expected_gpus), timeout_s=5)  # type: ignore[arg-type]
    return SmiCheck().run(ctx)


def bundle(tmp_path: Path, **files: str) -> BundleSources:
    for artifact_name, name in files.items():
        (tmp_path / Artifact[artifact_name].value).write_text(read(name))
    return BundleSources(tmp_path)


# nvidia-smi -q text fixtures


def test_a10_row_remap_pending_is_found_on_its_gpu() -> None:
    gpus = parse_smi_text(read(A10_REMAP_PENDING))
    assert [g.pci_bus_id for g in gpus] == ["00000000:07:00.0"]
    assert gpus[0].remap_pending is True
    assert gpus[0].remap_uncorrectable == 4
    findings = evaluate_gpus(gpus, None, "nvidia-smi")
    assert serious(findings) == [("ROW_REMAP_PENDING", "0000:07:00.0")]
    assert findings[0].action is Action.RESET_GPU
    assert findings[0].component.uuid == "GPU-73d12ef7-f589-f867-4259-c7090ab44736"


def test_truncated_h100_report_is_refused() -> None:
    with pytest.raises(ParseError, match="announces 8 GPUs but describes 1"):
        parse_smi_text(read(H100_TRUNCATED))


def test_truncated_h100_report_fails_the_check(tmp_path: Path) -> None:
    with pytest.raises(ParseError):
        run_check(bundle(tmp_path, NVIDIA_SMI_TEXT=H100_TRUNCATED))


def test_h100x8_hw_slowdown_and_power_brake_on_every_gpu() -> None:
    gpus = parse_smi_text(read(H100X8_SLOWDOWN))
    assert len(gpus) == 8
    for facts in gpus:
        assert facts.clock_event_reasons == {"hw_slowdown", "hw_power_brake_slowdown"}
    findings = evaluate_gpus(gpus, 8, "nvidia-smi")
    expected = [
        (code, bus_id)
        for bus_id in H100X8_BUS_IDS
        for code in ("CLOCK_HW_SLOWDOWN", "CLOCK_HW_POWER_BRAKE")
    ]
    assert serious(findings) == expected
    assert all(f.action is Action.NONE for f in findings)


def test_h100x8_reads_the_other_facts() -> None:
    first = parse_smi_text(read(H100X8_SLOWDOWN))[0]
    assert first.uuid == "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa"
    assert first.name == "NVIDIA H100 80GB HBM3"
    assert first.ecc_uncorrected_volatile == 0  # SRAM Parity + SRAM SEC-DED + DRAM
    assert (first.remap_pending, first.remap_failure) == (False, False)
    assert first.retired_pages_pending is None  # "Pending Page Blacklist : N/A"
    assert first.temperature_c == 29
    assert (first.tlimit_margin_c, first.slowdown_tlimit_c, first.shutdown_tlimit_c) == (
        56,
        -2,
        -8,
    )
    assert (first.slowdown_temp_c, first.shutdown_temp_c) == (None, None)
    assert (first.pcie_gen_current, first.pcie_gen_max) == (5, 5)
    assert (first.pcie_width_current, first.pcie_width_max) == (16, 16)
    assert (first.reset_required, first.drain_and_reset_recommended) == (False, False)
    assert first.mig_enabled is False


@pytest.mark.parametrize("report", capture_query_sections(), ids=["idle", "load"])
def test_h100_590_capture_is_healthy(report: str) -> None:
    gpus = parse_smi_text(report)
    assert [g.pci_bus_id for g in gpus] == ["00000000:00:09.0"]
    assert gpus[0].recovery_action == "None"
    assert gpus[0].tlimit_margin_c is not None
    assert evaluate_gpus(gpus, 1, "nvidia-smi") == []


def test_whole_capture_file_is_not_one_report() -> None:
    # Several reports concatenated (two "Attached GPUs" lines) must not be merged.
    with pytest.raises(ParseError):
        parse_smi_text(read(H100_CAPTURE))


# nvidia-smi -q -x fixtures


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (A100_MIG_V12, []),
        (RTX_PRO_V13, []),
        (RTX4000_V13, []),
        # Both cloud GPUs report a x8 link on a x16-capable card: the width EC2 G5 and G4dn
        # install them at (gpu_expected.yaml), so healthy.
        (A10G_V11, []),
        (T4_V11, []),
    ],
)
def test_xml_fixture_verdicts(name: str, expected: list[tuple[str, str]]) -> None:
    gpus = parse_smi_xml(read(name))
    assert len(gpus) == 1
    figures = expected_figures(DeepChecks())
    assert serious(evaluate_gpus(gpus, None, "nvidia-smi", figures)) == expected


def test_v11_throttle_reasons_and_remapped_rows() -> None:
    facts = parse_smi_xml(read(A10G_V11))[0]
    assert facts.clock_event_reasons == {"gpu_idle"}
    assert (facts.remap_pending, facts.remap_failure, facts.remap_uncorrectable) == (
        False,
        False,
        0,
    )
    assert (facts.temperature_c, facts.slowdown_temp_c, facts.shutdown_temp_c) == (17, 95, 98)
    assert (facts.pcie_gen_current, facts.pcie_gen_max) == (1, 4)


def test_a_full_retirement_table_in_either_format_fails_the_gpu() -> None:
    full = (
        read(T4_V11)
        .replace(
            "<multiple_single_bit_retirement>\n                <retired_count>0",
            "<multiple_single_bit_retirement>\n                <retired_count>50",
        )
        .replace(
            "<double_bit_retirement>\n                <retired_count>0",
            "<double_bit_retirement>\n                <retired_count>14",
        )
    )
    (facts,) = parse_smi_xml(full)
    assert facts.retired_pages == 64
    assert "RETIRED_PAGES_LIMIT" in {f.code for f in evaluate_gpus([facts], None, "t")}
    text = (
        read(A10_REMAP_PENDING)
        .replace(
            "Single Bit ECC                    : N/A", "Single Bit ECC                    : 60"
        )
        .replace("Double Bit ECC                    : N/A", "Double Bit ECC                    : 3")
    )
    (facts,) = parse_smi_text(text)
    assert facts.retired_pages == 63
    assert read(A10_REMAP_PENDING) != text


def test_t4_page_retirement_measured_and_remap_not_applicable() -> None:
    facts = parse_smi_xml(read(T4_V11))[0]
    assert facts.retired_pages_pending is False
    assert facts.retired_pages == 0
    assert (facts.remap_pending, facts.remap_failure) == (None, None)
    assert facts.mig_enabled is None


def test_v13_reports_tlimit_thresholds_and_recovery_action() -> None:
    facts = parse_smi_xml(read(RTX4000_V13))[0]
    assert (facts.tlimit_margin_c, facts.slowdown_tlimit_c, facts.shutdown_tlimit_c) == (
        49,
        -2,
        -7,
    )
    assert (facts.slowdown_temp_c, facts.shutdown_temp_c) == (None, None)
    assert facts.recovery_action == "None"
    assert facts.ecc_uncorrected_volatile is None  # every ECC counter is N/A
    assert facts.remap_pending is False


def test_a100_mig_remap_status_is_reported_unmeasured() -> None:
    facts = parse_smi_xml(read(A100_MIG_V12))[0]
    assert facts.mig_enabled is True
    assert (facts.remap_pending, facts.remap_failure) == (None, None)
    assert (facts.reset_required, facts.drain_and_reset_recommended) == (False, False)
    findings = evaluate_gpus([facts], None, "nvidia-smi")
    assert [(f.code, f.severity) for f in findings] == [("REMAP_STATUS_UNAVAILABLE", Severity.INFO)]


def test_a100_mig_report_lists_fewer_gpus_than_attached() -> None:
    # Telegraf's copy keeps one <gpu> of the four it announces: the check must say so.
    report = read_smi_xml(read(A100_MIG_V12))
    assert (report.attached_gpus, len(report.gpus)) == (4, 1)


def test_a100_mig_check_flags_the_unreported_gpus(tmp_path: Path) -> None:
    findings = run_check(bundle(tmp_path, NVIDIA_SMI_XML=A100_MIG_V12))
    assert findings[0].code == "GPU_NOT_REPORTED"
    assert (findings[0].severity, findings[0].action) == (Severity.CRITICAL, Action.REBOOT)
    assert findings[0].component == NODE
    assert [f.code for f in findings[1:]] == ["REMAP_STATUS_UNAVAILABLE"]


# SmiCheck


def test_check_prefers_xml(tmp_path: Path) -> None:
    sources = bundle(tmp_path, NVIDIA_SMI_XML=RTX4000_V13, NVIDIA_SMI_TEXT=A10_REMAP_PENDING)
    findings = run_check(sources)
    assert [f.code for f in findings] == ["PCIE_GEN_BELOW_MAX"]
    assert findings[0].source == "nvidia-smi"


def test_check_falls_back_to_text(tmp_path: Path) -> None:
    findings = run_check(bundle(tmp_path, NVIDIA_SMI_TEXT=A10_REMAP_PENDING))
    assert [f.code for f in findings] == ["ROW_REMAP_PENDING"]


def test_check_without_either_report_is_tool_missing(tmp_path: Path) -> None:
    with pytest.raises(ToolMissing):
        run_check(BundleSources(tmp_path))


def test_check_compares_with_expected_gpu_count(tmp_path: Path) -> None:
    sources = bundle(tmp_path, NVIDIA_SMI_TEXT=H100X8_SLOWDOWN)
    assert "GPU_COUNT_MISMATCH" not in [f.code for f in run_check(sources, expected_gpus=8)]
    mismatch = run_check(sources, expected_gpus=9)[0]
    assert mismatch.code == "GPU_COUNT_MISMATCH"
    assert (mismatch.severity, mismatch.action) == (Severity.CRITICAL, Action.REBOOT)
    assert run_check(sources, expected_gpus=4)[0].severity is Severity.WARNING


def test_check_evaluates_a_report_despite_a_failed_exit() -> None:
    output = ToolOutput(read(A10_REMAP_PENDING), 15, "nvidia-smi -q")
    findings = run_check(FakeSources({Artifact.NVIDIA_SMI_TEXT: output}))
    assert [f.code for f in findings] == ["ROW_REMAP_PENDING"]


def test_check_failed_exit_without_a_report_names_command_and_code() -> None:
    output = ToolOutput("No devices were found\n", 6, "/usr/bin/nvidia-smi -q -x")
    with pytest.raises(CheckFailed, match=r"/usr/bin/nvidia-smi -q -x exited 6"):
        run_check(FakeSources({Artifact.NVIDIA_SMI_XML: output}))


def test_check_garbage_with_success_exit_is_a_parse_error() -> None:
    output = ToolOutput("No devices were found\n", 0, "nvidia-smi -q -x")
    with pytest.raises(ParseError):
        run_check(FakeSources({Artifact.NVIDIA_SMI_XML: output}))


# A GPU nvidia-smi cannot open

LOST_LINE = "Unable to determine the device handle for GPU0000:91:00.0: Unknown Error"


def with_lost_gpu(text: str, line: str = LOST_LINE) -> str:
    text = re.sub(r"(Attached GPUs\s+:) 1", r"\1 2", text, count=1)
    return text.replace("GPU 00000000:07:00.0", f"{line}\nGPU 00000000:07:00.0", 1)


def test_text_lost_gpu_message_becomes_a_failed_gpu() -> None:
    gpus = parse_smi_text(with_lost_gpu(read(A10_REMAP_PENDING)))
    assert [(g.pci_bus_id, g.error) for g in gpus] == [
        ("00000000:07:00.0", None),
        ("0000:91:00.0", "GPU is lost (no device handle: Unknown Error)"),
    ]
    findings = evaluate_gpus(gpus, 2, "nvidia-smi")
    assert serious(findings) == [
        ("ROW_REMAP_PENDING", "0000:07:00.0"),
        ("GPU_LOST", "0000:91:00.0"),
    ]
    # No handle, no reset: the GPU the driver lost needs the node rebooted.
    lost = findings[1]
    assert (lost.severity, lost.action) == (Severity.CRITICAL, Action.REBOOT)


@pytest.mark.parametrize(
    ("line", "bus_id", "index", "error"),
    [
        (
            "Unable to determine the device handle for GPU1: 0000:34:00.0: GPU is lost",
            "0000:34:00.0",
            1,
            "GPU is lost",
        ),
        ("Unable to determine the device handle for GPU 3: Unknown Error", "unknown-3", 3, None),
    ],
)
def test_lost_gpu_message_spellings(line: str, bus_id: str, index: int, error: str | None) -> None:
    lost = parse_smi_text(with_lost_gpu(read(A10_REMAP_PENDING), line))[1]
    assert (lost.pci_bus_id, lost.index) == (bus_id, index)
    assert lost.error == (error or "GPU is lost (no device handle: Unknown Error)")


def test_xml_lost_gpu_message_before_the_document() -> None:
    text = read(RTX4000_V13).replace("<attached_gpus>1<", "<attached_gpus>2<")
    gpus = parse_smi_xml(f"{LOST_LINE}\n{text}")
    assert [g.error for g in gpus] == [None, "GPU is lost (no device handle: Unknown Error)"]


def test_lost_gpu_without_its_message_is_a_truncated_text_report() -> None:
    text = re.sub(r"(Attached GPUs\s+:) 1", r"\1 2", read(A10_REMAP_PENDING), count=1)
    with pytest.raises(ParseError, match="announces 2 GPUs but describes 1"):
        parse_smi_text(text)


def test_field_value_gpu_is_lost_marks_the_gpu() -> None:
    text = read(A10_REMAP_PENDING).replace(": 33 C", ": GPU is lost")
    assert parse_smi_text(text)[0].error == "GPU_IS_LOST"


# Bad input raises ParseError and nothing else

XML_HEAD = '<?xml version="1.0" ?>\n'


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \n\n",
        "No devices were found",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
        "<nvidia_smi_log><attached_gpus>1</attached_gpus><gpu id='0:1:0.0'>",
        "<html><body>502 Bad Gateway</body></html>",
        XML_HEAD + "<nvidia_smi_log><attached_gpus>0</attached_gpus></nvidia_smi_log>",
        XML_HEAD + "<nvidia_smi_log><attached_gpus>1</attached_gpus></nvidia_smi_log>",
        XML_HEAD + "<nvidia_smi_log><gpu id='00000000:01:00.0'/></nvidia_smi_log>",
        XML_HEAD + "<nvidia_smi_log><attached_gpus>1</attached_gpus><gpu/></nvidia_smi_log>",
        XML_HEAD
        + "<nvidia_smi_log><attached_gpus>1</attached_gpus>"
        + "<gpu id='00000000:01:00.0'/><gpu id='00000000:02:00.0'/></nvidia_smi_log>",
        '<?xml version="1.0" encoding="UTF-16"?><nvidia_smi_log/>',
        '<?xml version="1.0" encoding="no-such-codec"?><nvidia_smi_log/>',
        "<nvidia_smi_log>&undefined;</nvidia_smi_log>",
    ],
)
def test_xml_bad_input_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse_smi_xml(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "No devices were found",
        "==============NVSMI LOG==============\n\nAttached GPUs : 0\n",
        "Attached GPUs : many\nGPU 00000000:07:00.0\n    Processes : None\n",
        "GPU 00000000:07:00.0\n    Product Name : NVIDIA A10\n    Processes : None\n",
        "Attached GPUs : 1\n",
        "Attached GPUs : 1\nGPU 00000000:07:00.0\n    Product Name : NVIDIA A10\n",
        "Attached GPUs : 1\nGPU 00000000:07:00.0\n    Processes : None\n"
        "GPU 00000000:08:00.0\n    Processes : None\n",
        read(A10_REMAP_PENDING).split("    Processes")[0],
    ],
)
def test_text_bad_input_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse_smi_text(text)


def test_xml_doctype_without_internal_subset_is_accepted() -> None:
    text = read(A100_MIG_V12)
    assert '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">' in text
    assert parse_smi_xml(text)


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [
  <!ENTITY lol "lol">
  <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
  <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
]>
<nvidia_smi_log><attached_gpus>1</attached_gpus>
<gpu id="00000000:01:00.0"><product_name>&lol3;</product_name></gpu></nvidia_smi_log>
"""


@pytest.mark.parametrize(
    "text",
    [
        BILLION_LAUGHS,
        BILLION_LAUGHS.replace("<!DOCTYPE", '<!DOCTYPE x SYSTEM "a.dtd">\n<!DOCTYPE', 1),
        '<!ENTITY x "y">\n' + read(RTX4000_V13),
        read(RTX4000_V13).replace("<gpu id=", "<!doctype x [ ]><gpu id=", 1),
    ],
)
def test_xml_entity_declarations_are_refused(text: str) -> None:
    with pytest.raises(ParseError, match="DOCTYPE or ENTITY"):
        parse_smi_xml(text)


# Value spellings


@pytest.mark.parametrize(
    "raw",
    [
        "N/A",
        "[N/A]",
        "Not Supported",
        "[Not Supported]",
        "Requested functionality has been deprecated",
        "[Requested functionality has been deprecated]",
        "",
        "  ",
    ],
)
def test_not_measured_spellings(raw: str) -> None:
    assert measured(raw) is None
    assert number(raw) is None


@pytest.mark.parametrize(
    ("raw", "value"),
    [("27 C", 27), ("-7 C", -7), ("16x", 16), ("192 bank(s)", 192), ("67.03 W", 67.03)],
)
def test_numbers_with_units(raw: str, value: float) -> None:
    assert number(raw) == value


@pytest.mark.parametrize("raw", ["0x07", "Active", "12 34", "9" * 5000])
def test_non_numbers(raw: str) -> None:
    assert number(raw) is None


def test_a_report_filtered_with_d_is_read_and_says_so() -> None:
    report = read_smi_text(read("nvidia-smi-q-d-page-retirement_v100x8_535.86.10_healthy.txt"))
    assert (report.attached_gpus, report.only) == (8, ("Retired Pages",))
    assert all(g.retired_pages == 0 and g.retired_pages_pending is False for g in report.gpus)
    assert [f for f in evaluate_gpus(report.gpus, 8, "t") if f.severity > Severity.INFO] == []


def test_a_full_retirement_table_in_a_filtered_report() -> None:
    report = read_smi_text(read("nvidia-smi-q-d-page-retirement_v100x8_535.86.10_table_full.txt"))
    findings = evaluate_gpus(report.gpus, 8, "t")
    full = {f.component.id for f in findings if f.code == "RETIRED_PAGES_LIMIT"}
    assert full == {"0001:00:00.0", "0002:00:00.0", "0006:00:00.0", "0008:00:00.0"}
    assert all(f.action is Action.REPLACE for f in findings if f.code == "RETIRED_PAGES_LIMIT")


def test_a_filtered_report_cut_short_is_refused() -> None:
    text = read("nvidia-smi-q-d-page-retirement_v100x8_535.86.10_healthy.txt")
    cut = text[: text.rindex("Double Bit ECC")]
    with pytest.raises(ParseError, match="differs from the first"):
        read_smi_text(cut)


def test_a_report_cut_before_its_first_entry_is_refused() -> None:
    text = read(A10_REMAP_PENDING)
    cut = text[: text.index("Product Name")]
    with pytest.raises(ParseError, match="ends early"):
        read_smi_text(cut)
