"""DCGM parsers and checks, judged against the real captures in tests/data.

Real captures: the GB10 ``dcgmi diag -r 1 -j`` document (exit 226), the 8-GPU ``diagnostic``
test fragment quoted in NVIDIA/DCGM#215, NVIDIA's DCGM 4 diag JSON schema, the DCGM_FR error
table, and two dcgm-exporter scrapes (AWS L4, LKE RTX 4000 Ada). There is no public capture of
``dcgmi health -c -j`` nor of a DCGM 3 diag document: those test documents are built from the
shapes in shared/research/gpu_diagnostics.md (2.2, 2.3), which were derived from DCGM's source
(``dcgmi/Health.cpp``, ``DcgmiOutput.cpp``) and NVIDIA/DCGM#139.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuguard.checks.base import Check, CheckContext
from gpuguard.checks.dcgm.check import (
    DcgmCheck,
    DcgmExporterCheck,
    evaluate_exporter,
    parse_diag,
    parse_exporter_metrics,
    parse_health,
)
from gpuguard.checks.dcgm.common import is_blank
from gpuguard.config import Config
from gpuguard.errors import CheckFailed, ParseError, ToolMissing
from gpuguard.model import CHECK_FAILED, NODE, Action, Component, Finding, Layer, Severity
from gpuguard.sources import BundleSources

DATA = Path(__file__).resolve().parent.parent / "data"
PACKAGE_DATA = Path(__file__).resolve().parents[2] / "src" / "gpuguard" / "data"
GB10 = DATA / "dcgmi_diag_r1_j_gb10_dcgm4.2.3_software_fail_exit226.json"
FRAGMENT = DATA / "dcgmi_diag_r3_j_dcgm4_diagnostic_test_fragment_8gpu.json.txt"
SCHEMA = DATA / "dcgm_diag_schema_dcgm4.json"
ERROR_TABLE = DATA / "dcgm_fr_error_codes_severity_category_dcgm4.6.csv"
L4_SCRAPE = DATA / "dcgm-exporter_metrics_l4_aws_580.105.08.prom"
RTX_SCRAPE = DATA / "dcgm-exporter_metrics_rtx4000ada_580.95.05_k8s_pod_labels_xid_errmsg.prom"
SENTINEL = 9223372036854775794  # DCGM's NOT_SUPPORTED int64, as in the GB10 capture


def codes(findings: list[Finding]) -> list[str]:
    return [f.code for f in findings]


def gpu_n(n: int) -> Component:
    return Component("gpu", f"dcgm-gpu-{n}")


# --- dcgmi diag: the real GB10 document ------------------------------------------------


def test_gb10_exit_226_is_a_config_finding_not_broken_hardware() -> None:
    findings = parse_diag(GB10.read_text(), 226)
    assert len(findings) == 1
    (finding,) = findings
    assert finding.code == "DCGM_DIAG_CONFIG"
    assert finding.severity is Severity.WARNING
    assert finding.action is Action.NONE
    assert finding.component == gpu_n(0)
    assert finding.layer is Layer.GPU
    assert "DCGM_FR_PERSISTENCE_MODE" in finding.message
    assert "not a broken part" in finding.message
    assert not finding.inconclusive


def test_gb10_sentinel_in_info_is_not_read_as_a_number() -> None:
    findings = parse_diag(GB10.read_text(), 226)
    assert all(str(SENTINEL) not in f.message for f in findings)
    assert is_blank(float(SENTINEL))


def test_gb10_with_leading_success_line_and_exit_zero_gives_the_same_verdict() -> None:
    text = "Successfully ran diagnostic for group.\n" + GB10.read_text()
    assert codes(parse_diag(text, 0)) == ["DCGM_DIAG_CONFIG"]


@pytest.mark.parametrize("cut", [0.1, 0.5, 0.9, 0.99])
def test_truncated_diag_document_raises_parse_error(cut: float) -> None:
    text = GB10.read_text()
    with pytest.raises(ParseError):
        parse_diag(text[: int(len(text) * cut)], 226)


# --- dcgmi diag: the DCGM#215 fragment ---------------------------------------------------


def wrap_fragment() -> str:
    """The quoted test entry placed in a full DCGM 4 document (the quote ends with '},')."""
    entry = FRAGMENT.read_text().rstrip().removesuffix(",")
    return (
        '{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": ['
        + entry
        + "]}]}}"
    )


def test_fragment_alone_is_not_a_document() -> None:
    with pytest.raises(ParseError):
        parse_diag(FRAGMENT.read_text(), 0)


def test_fragment_in_a_document_passes_on_all_8_gpus_without_info() -> None:
    text = wrap_fragment()
    assert parse_diag(text, 0) == []
    entities = {r["entity_id"] for r in json.loads(FRAGMENT.read_text().rstrip()[:-1])["results"]}
    assert entities == set(range(8))


def test_all_pass_document_with_nonzero_exit_is_inconclusive() -> None:
    findings = parse_diag(wrap_fragment(), 226)
    assert codes(findings) == [CHECK_FAILED]
    assert findings[0].inconclusive
    assert "DCGM_ST_NVVS_ERROR" in findings[0].message


# --- dcgmi diag: NVIDIA's schema, built documents ----------------------------------------


def minimal_from_schema(schema: dict[str, Any], name: str = "") -> Any:
    """A document with every property the schema names; strings are placeholders."""
    kind = schema.get("type")
    if kind == "object":
        return {k: minimal_from_schema(v, k) for k, v in schema.get("properties", {}).items()}
    if kind == "array":
        return [minimal_from_schema(schema["items"], name)]
    if kind == "integer":
        return 0
    return {"status": "Fail", "entity_group": "GPU"}.get(name, "placeholder")


def test_document_shaped_by_nvidia_schema_parses_and_fails_closed() -> None:
    document = minimal_from_schema(json.loads(SCHEMA.read_text()))
    findings = parse_diag(json.dumps(document), 0)
    # A Fail with error id 0 (DCGM_FR_OK, severity UNKNOWN) is unclassified: drained for a
    # human; the placeholder runtime_error makes the run inconclusive.
    assert sorted(codes(findings)) == sorted([CHECK_FAILED, "DCGM_DIAG_FAIL"])
    assert max(f.severity for f in findings) is Severity.CRITICAL


def dcgm4(*results: dict[str, Any], test: str = "memory", **body: Any) -> str:
    tests = [{"name": test, "results": list(results), "test_summary": {"status": "Pass"}}]
    document = {"DCGM Diagnostic": {"test_categories": [{"category": "x", "tests": tests}], **body}}
    return json.dumps(document)


def result(entity: int, status: str, *warnings: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "entity_group": "GPU",
        "entity_group_id": 1,
        "entity_id": entity,
        "status": status,
    }
    if warnings:
        entry["warnings"] = list(warnings)
    return entry


def warning(error_id: int, severity: int | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"error_id": error_id, "error_category": 10, "warning": "w"}
    if severity is not None:
        entry["error_severity"] = severity
    return entry


@pytest.mark.parametrize(
    ("error_id", "code", "severity", "action"),
    [
        (29, "DCGM_DIAG_CONFIG", Severity.WARNING, Action.NONE),  # PERSISTENCE_MODE, CONFIG
        (85, "DCGM_DIAG_HARDWARE", Severity.CRITICAL, Action.RESET_GPU),  # PENDING_ROW_REMAP
        (52, "DCGM_DIAG_HARDWARE", Severity.CRITICAL, Action.RESET_GPU),  # FAULTY_MEMORY
        (14, "DCGM_DIAG_TRIAGE", Severity.WARNING, Action.NONE),  # NVLINK_DOWN, TRIAGE
        # CLOCKS_EVENT_THERMAL is MONITOR, but the test failed: flagged, not repaired.
        (10, "DCGM_DIAG_MONITOR", Severity.WARNING, Action.NONE),
        (120, "DCGM_DIAG_HARDWARE", Severity.CRITICAL, Action.REBOOT),  # FALLEN_OFF_BUS
        (126, "DCGM_DIAG_HARDWARE", Severity.CRITICAL, Action.REBOOT),  # RECOVERY_REBOOT
        (122, "DCGM_DIAG_TRIAGE", Severity.WARNING, Action.NONE),  # IMEX_UNHEALTHY
        (999, "DCGM_DIAG_FAIL", Severity.CRITICAL, Action.NONE),  # not in DCGM's table
        (SENTINEL, "DCGM_DIAG_FAIL", Severity.CRITICAL, Action.NONE),
    ],
)
def test_failed_warning_maps_by_dcgm_severity(
    error_id: int, code: str, severity: Severity, action: Action
) -> None:
    (finding,) = parse_diag(dcgm4(result(3, "Fail", warning(error_id))), 226)
    assert (finding.code, finding.severity, finding.action) == (code, severity, action)
    assert finding.component == gpu_n(3)


def test_document_severity_wins_over_the_table() -> None:
    # error 52 is ISOLATE in DCGM's table; this document calls it CONFIG (5).
    (finding,) = parse_diag(dcgm4(result(0, "Fail", warning(52, severity=5))), 226)
    assert finding.code == "DCGM_DIAG_CONFIG"


def test_warn_status_caps_severity_and_pass_makes_warnings_info() -> None:
    warned = parse_diag(dcgm4(result(0, "Warn", warning(52))), 0)
    assert [(f.code, f.severity) for f in warned] == [("DCGM_DIAG_HARDWARE", Severity.WARNING)]
    passed = parse_diag(dcgm4(result(0, "Pass", warning(56))), 0)
    assert [(f.code, f.severity) for f in passed] == [
        ("DCGM_DIAG_PASSED_WITH_WARNING", Severity.INFO)
    ]


def test_fail_without_warnings_is_critical_and_unknown_status_is_not_a_pass() -> None:
    assert codes(parse_diag(dcgm4(result(0, "Fail")), 226)) == ["DCGM_DIAG_FAIL"]
    (unknown,) = parse_diag(dcgm4(result(0, "Inconclusive")), 0)
    assert unknown.code == "DCGM_DIAG_UNKNOWN_STATUS"
    assert unknown.severity is Severity.WARNING


def test_runtime_error_is_an_inconclusive_finding() -> None:
    text = json.dumps({"DCGM Diagnostic": {"runtime_error": "Unable to start NVVS"}})
    (finding,) = parse_diag(text, 226)
    assert finding.code == CHECK_FAILED
    assert finding.inconclusive
    assert "Unable to start NVVS" in finding.message


@pytest.mark.parametrize(
    "text",
    [
        '{"DCGM Diagnostic": {"test_categories": []}}',
        '{"DCGM Diagnostic": {"test_categories": [{"category": "x", "tests": []}]}}',
        '{"DCGM Diagnostic": {}}',
        '{"something else": {}}',
        "[]",
        "",
        "Error: unable to connect to the host engine",
        '{"DCGM Diagnostic": {"test_categories": 3}}',
    ],
)
def test_documents_without_results_are_not_a_pass(text: str) -> None:
    with pytest.raises(ParseError):
        parse_diag(text, 0)


def test_summary_only_failure_is_critical_at_node_level() -> None:
    tests = [{"name": "pcie", "results": [], "test_summary": {"status": "Fail"}}]
    text = json.dumps({"DCGM Diagnostic": {"test_categories": [{"tests": tests}]}})
    (finding,) = parse_diag(text, 226)
    assert (finding.code, finding.component) == ("DCGM_DIAG_FAIL", NODE)


# --- dcgmi diag: DCGM 3 documents built from the research notes --------------------------


def dcgm3(tests: list[dict[str, Any]]) -> str:
    return json.dumps(
        {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": tests}]}}
    )


def test_dcgm3_document_with_gpu_id_strings_and_human_test_names() -> None:
    text = dcgm3(
        [
            {"name": "Denylist", "results": [{"gpu_ids": "0,1", "status": "Pass"}]},
            {
                "name": "GPU Memory",
                "results": [
                    {"gpu_id": "0", "status": "Pass"},
                    {
                        "gpu_id": "1",
                        "status": "Fail",
                        "warnings": [{"warning": "Memory error detected", "error_id": 52}],
                    },
                ],
            },
            {"name": "PCIe", "results": [{"gpu_id": "0", "status": "Skip"}]},
        ]
    )
    findings = {f.code: f for f in parse_diag(text, 226)}
    assert set(findings) == {"DCGM_DIAG_HARDWARE", "DCGM_DIAG_SKIPPED"}
    hardware = findings["DCGM_DIAG_HARDWARE"]
    assert (hardware.component, hardware.severity, hardware.action) == (
        gpu_n(1),
        Severity.CRITICAL,
        Action.RESET_GPU,
    )
    assert "DCGM_FR_FAULTY_MEMORY" in hardware.message
    assert findings["DCGM_DIAG_SKIPPED"].severity is Severity.INFO


def test_dcgm3_bare_string_warning_on_fail_is_unclassified_critical() -> None:
    text = dcgm3(
        [
            {
                "name": "Diagnostic",
                "results": [{"gpu_ids": "2", "status": "Fail", "warnings": "GPU 2 failed"}],
            }
        ]
    )
    (finding,) = parse_diag(text, 226)
    assert (finding.code, finding.component) == ("DCGM_DIAG_FAIL", gpu_n(2))
    assert "GPU 2 failed" in finding.message


def test_dcgm3_everything_skipped_is_not_a_pass() -> None:
    # The T400 run of NVIDIA/DCGM#139: every test "Skip".
    names = ["PCIe", "GPU Memory", "Diagnostic", "Targeted Stress"]
    text = dcgm3([{"name": n, "results": [{"gpu_id": "0", "status": "Skip"}]} for n in names])
    findings = parse_diag(text, 0)
    assert codes(findings).count("DCGM_DIAG_SKIPPED") == 4
    assert "DCGM_DIAG_NOTHING_TESTED" in codes(findings)
    assert max(f.severity for f in findings) is Severity.WARNING


def test_packaged_error_table_is_the_tested_copy() -> None:
    assert (PACKAGE_DATA / "dcgm_error_codes.csv").read_bytes() == ERROR_TABLE.read_bytes()
    assert "dcgm_error_codes.csv" in (PACKAGE_DATA / "SOURCES.md").read_text()


# --- dcgmi health: documents built from the shape in research 2.2 (no real capture) -------


def health(overall: str, **groups: dict[str, Any]) -> str:
    body: dict[str, Any] = {"Overall Health": {"value": overall}}
    body.update({name: {"children": entities} for name, entities in groups.items()})
    return json.dumps({"header": ["Health Monitor Report"], "body": body}, indent=3)


def entity(word: str, **systems: tuple[str, list[str]]) -> dict[str, Any]:
    errors = {label: {"value": v, "overflow": chunks} for label, (v, chunks) in systems.items()}
    return {"value": word, "children": {"Errors": {"children": errors}}}


def pcie_warning() -> dict[str, Any]:
    chunks = ["Detected more than 8 PCIe replays per minute for", "GPU 0 : 12"]
    return entity("Warning", **{"PCIe system": ("Warning", chunks)})


def test_health_all_healthy_is_an_empty_answer() -> None:
    assert parse_health(health("Healthy")) == []


def test_health_pcie_warning_rejoins_overflow_and_repairs_nothing() -> None:
    (finding,) = parse_health(health("Warning", GPU={"0": pcie_warning()}))
    assert (finding.code, finding.severity, finding.action) == (
        "DCGM_HEALTH_PCIE",
        Severity.WARNING,
        Action.NONE,
    )
    assert finding.component == gpu_n(0)
    assert "Detected more than 8 PCIe replays per minute for GPU 0 : 12" in finding.message


@pytest.mark.parametrize(
    ("label", "code", "action"),
    [
        ("Memory system", "DCGM_HEALTH_MEMORY", Action.RESET_GPU),
        ("NVLINK system", "DCGM_HEALTH_NVLINK", Action.RESET_GPU),
        ("PCIe system", "DCGM_HEALTH_PCIE", Action.REBOOT),
        ("Thermal system", "DCGM_HEALTH_THERMAL", Action.NONE),
        ("Power system", "DCGM_HEALTH_POWER", Action.NONE),
        ("InfoROM system", "DCGM_HEALTH_INFOROM", Action.NONE),
        ("Quantum system", "DCGM_HEALTH_OTHER", Action.NONE),
    ],
)
def test_health_failure_is_critical_with_the_system_action(
    label: str, code: str, action: Action
) -> None:
    gpu1 = entity("Failure", **{label: ("Failure", ["something broke"])})
    (finding,) = parse_health(health("Failure", GPU={"1": gpu1}))
    assert (finding.code, finding.severity, finding.action) == (code, Severity.CRITICAL, action)
    assert finding.component == gpu_n(1)


def test_health_internal_error_is_never_healthy() -> None:
    gpu0 = entity("Internal error", **{"Memory system": ("Internal error", ["?"])})
    (finding,) = parse_health(health("Internal error", GPU={"0": gpu0}))
    assert finding.code == "DCGM_HEALTH_UNKNOWN_STATE"
    assert finding.severity is Severity.WARNING
    (overall,) = parse_health(health("Internal error"))
    assert (overall.code, overall.component) == ("DCGM_HEALTH_UNKNOWN_STATE", NODE)


def test_health_overall_failure_without_entities_is_still_critical() -> None:
    (finding,) = parse_health(health("Failure"))
    assert (finding.code, finding.severity, finding.component) == (
        "DCGM_HEALTH_OTHER",
        Severity.CRITICAL,
        NODE,
    )


def test_health_switch_entities_are_nvswitch_components() -> None:
    switch = entity("Warning", **{"NvSwitch NF": ("Warning", ["non-fatal error"])})
    (finding,) = parse_health(health("Warning", Switch={"3": switch}))
    assert finding.component == Component("nvswitch", "dcgm-switch-3")
    assert finding.code == "DCGM_HEALTH_NVSWITCH"


C, W = Severity.CRITICAL, Severity.WARNING

# dcgmi health -c names no system for the Xid and NVSwitch watches ("Internal error", from
# Health.cpp's HelperSystemToString) and files recovery actions under "Driver"; the message
# (DCGM_FR_XID_ERROR_MSG "Detected XID %u for GPU %u", DCGM_FR_SXID_ERROR_MSG) says which.


@pytest.mark.parametrize(
    ("message", "code", "severity", "action"),
    [
        ("GPU 3 has fallen off the bus (triggered by XID 79)", "XID_79", C, Action.REBOOT),
        ("Detected XID 48 for GPU 3", "XID_48", C, Action.RESET_GPU),
        ("Detected XID 119 for GPU 3", "XID_119", C, Action.RESET_GPU),
        ("Detected XID 94 for GPU 3", "XID_94", W, Action.KILL_JOB),
    ],
)
def test_health_xid_incidents_follow_the_xid_catalog(message, code, severity, action) -> None:
    gpu3 = entity("Failure", **{"Internal error": ("Failure", [message])})
    (finding,) = parse_health(health("Failure", GPU={"3": gpu3}))
    assert (finding.code, finding.severity, finding.action) == (code, severity, action)
    assert finding.component == Component("gpu", "dcgm-gpu-3")


def test_health_fatal_nvswitch_error_reboots() -> None:
    switch = entity(
        "Failure", **{"Internal error": ("Failure", ["Detected fatal NvSwitch SXID 12028"])}
    )
    (finding,) = parse_health(health("Failure", Switch={"0": switch}))
    assert (finding.code, finding.action) == ("DCGM_HEALTH_NVSWITCH", Action.REBOOT)


@pytest.mark.parametrize(
    ("name", "word", "action", "deferred"),
    [
        ("NODE_REBOOT", "Failure", Action.REBOOT, False),
        ("GPU_RESET", "Failure", Action.RESET_GPU, False),
        ("DRAIN_AND_RESET", "Failure", Action.RESET_GPU, True),
        ("DRAIN_P2P", "Warning", Action.RESET_GPU, False),  # NVIDIA: end the P2P processes
    ],
)
def test_health_recovery_actions_are_the_drivers_verdict(name, word, action, deferred) -> None:
    message = f"GPU 0 needs attention. Recovery action: 2 ({name})."
    gpu0 = entity(word, Driver=(word, [message]))
    (finding,) = parse_health(health(word, GPU={"0": gpu0}))
    assert (finding.code, finding.severity) == ("DCGM_HEALTH_RECOVERY_ACTION", C)
    assert (finding.action, finding.deferred) == (action, deferred)


@pytest.mark.parametrize(
    "message", ["A pending retired page has been detected in GPU 0.", "Row remapping is pending"]
)
def test_health_pending_retirement_is_a_deferred_reset(message) -> None:
    gpu0 = entity("Warning", **{"Memory system": ("Warning", [message])})
    (finding,) = parse_health(health("Warning", GPU={"0": gpu0}))
    assert (finding.code, finding.action, finding.deferred) == (
        "DCGM_HEALTH_MEMORY_PENDING",
        Action.RESET_GPU,
        True,
    )


def test_health_imex_trouble_is_not_a_gpu_repair() -> None:
    none0 = entity("Failure", **{"NVLINK system": ("Failure", ["IMEX domain status is DEGRADED"])})
    (finding,) = parse_health(health("Failure", **{"None": {"0": none0}}))
    assert (finding.code, finding.severity, finding.action) == ("DCGM_HEALTH_IMEX", W, Action.NONE)


@pytest.mark.parametrize(
    "message",
    [
        "GPU 0: Fabric State is In Progress (2).",
        "Detected 16 Fabric Health: Incorrect Configuration for GPU 0 Incorrect Configuration",
    ],
)
def test_health_fabric_state_is_fabric_managers_not_a_gpu_reset(message) -> None:
    gpu0 = entity("Failure", **{"NVLINK system": ("Failure", [message])})
    (finding,) = parse_health(health("Failure", GPU={"0": gpu0}))
    assert (finding.code, finding.action) == ("DCGM_HEALTH_FABRIC", Action.NONE)
    down = entity("Failure", **{"NVLINK system": ("Failure", ["GPU 0's NvLink link 3 is down"])})
    (finding,) = parse_health(health("Failure", GPU={"0": down}))
    assert (finding.code, finding.action) == ("DCGM_HEALTH_NVLINK", Action.RESET_GPU)


@pytest.mark.parametrize(
    "text",
    [
        "Error: Health watches not enabled. Please enable watches. \n",
        '{"header": ["Health Monitor Report"]}',
        '{"body": {"GPU": {"children": {}}}}',
        '{"body": {"Overall Health": "Healthy"}}',
        '{"body": {"Overall Health": {"value": "Healthy"}, "GPU": {"children": []}}}',
        health("Healthy")[:-5],
    ],
)
def test_health_malformed_output_raises_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse_health(text)


# --- dcgm-exporter ------------------------------------------------------------------------


def test_l4_scrape_without_xid_series_says_xids_are_invisible() -> None:
    sample = parse_exporter_metrics(L4_SCRAPE.read_text())
    findings = evaluate_exporter(sample, expected_gpus=1)
    assert codes(findings) == ["DCGM_XID_SERIES_ABSENT"]
    assert findings[0].severity is Severity.INFO
    assert all(f.severity < Severity.CRITICAL for f in findings)
    assert "not read as 'no Xid'" in findings[0].message
    assert list(sample.gpus()) == ["0000:31:00.0"]


def test_rtx_scrape_reads_xid_labels_and_pod_attribution() -> None:
    sample = parse_exporter_metrics(RTX_SCRAPE.read_text())
    (xid,) = sample.family("DCGM_FI_DEV_XID_ERRORS")
    assert xid.labels["err_code"] == "0"
    assert xid.labels["err_msg"] == "No Error"
    assert xid.value == 0
    assert (xid.labels["namespace"], xid.labels["pod"]) == ("default", "cuda-75454ffb9f-8ljq7")
    assert xid.labels["pod_uid"] == ""
    assert xid.gpu == Component("gpu", "0000:00:02.0", "GPU-a8394b51-c086-568a-9f1a-c1e1c934c44c")
    # Xid 0 means "no error", and the series is present: a healthy answer.
    assert evaluate_exporter(sample, expected_gpus=1) == []


def test_rtx_scrape_with_a_real_xid_gives_the_catalog_verdict() -> None:
    text = RTX_SCRAPE.read_text().replace(
        'err_code="0",err_msg="No Error"', 'err_code="79",err_msg="GPU has fallen off the bus"'
    )
    findings = evaluate_exporter(parse_exporter_metrics(text), expected_gpus=1)
    (xid,) = findings
    assert (xid.code, xid.severity, xid.action) == ("XID_79", Severity.CRITICAL, Action.REBOOT)
    assert xid.source == "dcgm-exporter"
    assert xid.component.id == "0000:00:02.0"


def scrape(*lines: str) -> str:
    head = 'gpu="0",UUID="GPU-1",pci_bus_id="00000000:19:00.0"'
    body = [line.replace("{}", "{" + head + "}") for line in lines]
    return "\n".join(["# HELP x y", *body, "DCGM_FI_DEV_XID_ERRORS{" + head + ',err_code="0"} 0'])


@pytest.mark.parametrize(
    ("line", "code", "severity", "action"),
    [
        (
            "DCGM_FI_DEV_ROW_REMAP_FAILURE{} 1",
            "DCGM_ROW_REMAP_FAILURE",
            Severity.CRITICAL,
            Action.REPLACE,
        ),
        (
            "DCGM_FI_DEV_ROW_REMAP_PENDING{} 1",
            "DCGM_ROW_REMAP_PENDING",
            Severity.CRITICAL,
            Action.RESET_GPU,
        ),
        (
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{} 2",
            "DCGM_ECC_DBE_VOLATILE",
            Severity.CRITICAL,
            Action.RESET_GPU,
        ),
        (
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{} 3",
            "DCGM_UNCORRECTABLE_REMAPPED_ROWS",
            Severity.INFO,
            Action.NONE,
        ),
        (
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{} 600",
            "DCGM_UNCORRECTABLE_REMAPPED_ROWS",
            Severity.WARNING,
            Action.NONE,
        ),
    ],
)
def test_exporter_counters(line: str, code: str, severity: Severity, action: Action) -> None:
    (finding,) = evaluate_exporter(parse_exporter_metrics(scrape(line)), expected_gpus=1)
    assert (finding.code, finding.severity, finding.action) == (code, severity, action)
    assert finding.component == Component("gpu", "0000:19:00.0", "GPU-1")


def test_exporter_sentinels_and_zero_counters_are_not_findings() -> None:
    text = scrape(
        f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{}} {SENTINEL}",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{} 0",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{} 2147483632",
    )
    assert evaluate_exporter(parse_exporter_metrics(text), expected_gpus=1) == []


def test_exporter_blank_xid_value_hides_xids_for_that_gpu() -> None:
    text = f'DCGM_FI_DEV_XID_ERRORS{{gpu="0",pci_bus_id="0000:19:00.0"}} {SENTINEL}'
    (finding,) = evaluate_exporter(parse_exporter_metrics(text), expected_gpus=None)
    assert finding.code == "DCGM_XID_SERIES_ABSENT"
    assert finding.component.id == "0000:19:00.0"


def test_exporter_gpu_count_against_expectation() -> None:
    sample = parse_exporter_metrics(scrape())
    (missing,) = evaluate_exporter(sample, expected_gpus=2)
    assert (missing.code, missing.severity, missing.action) == (
        "DCGM_GPU_COUNT_MISMATCH",
        Severity.CRITICAL,
        Action.REBOOT,
    )
    (extra,) = evaluate_exporter(sample, expected_gpus=0)
    assert (extra.code, extra.severity) == ("DCGM_GPU_COUNT_MISMATCH", Severity.WARNING)


def test_exporter_labels_with_escapes_and_timestamps() -> None:
    text = 'm{a="x\\"y\\\\z\\nw", b = "}",} 1.5e3 1700000000000\nn -Inf\n'
    first, second = parse_exporter_metrics(text).samples
    assert first.labels == {"a": 'x"y\\z\nw', "b": "}"}
    assert first.value == 1500.0
    assert (second.name, second.value) == ("n", float("-inf"))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "# HELP only comments\n# TYPE x gauge\n",
        "metric{",
        'metric{a="b"',
        'metric{a="b} 1',
        "metric{a=b} 1",
        'metric{a="1",a="2"} 1',
        "metric 1 2 3",
        "metric one",
        "metric 1_000",
        '{a="b"} 1',
        "metric{}1",
    ],
)
def test_exporter_malformed_text_raises_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse_exporter_metrics(text)


# --- the Check classes, end to end on a bundle directory ----------------------------------


def context(bundle: Path, **config: Any) -> CheckContext:
    return CheckContext(sources=BundleSources(bundle), config=Config(**config), timeout_s=5)


def test_checks_implement_the_protocol() -> None:
    checks: list[Check] = [DcgmCheck(), DcgmExporterCheck()]
    assert [(c.name, c.layer) for c in checks] == [
        ("dcgm", Layer.GPU),
        ("dcgm-exporter", Layer.GPU),
    ]


def test_dcgm_check_reads_the_gb10_bundle_with_its_recorded_exit_code(tmp_path: Path) -> None:
    (tmp_path / "dcgmi-diag.json").write_text(GB10.read_text())
    (tmp_path / "dcgmi-diag.exitcode").write_text("226\n")
    findings = DcgmCheck().run(context(tmp_path))
    assert codes(findings) == ["DCGM_DIAG_CONFIG"]


def test_dcgm_check_without_either_output_is_tool_missing(tmp_path: Path) -> None:
    with pytest.raises(ToolMissing):
        DcgmCheck().run(context(tmp_path))


def test_dcgm_check_garbage_after_nonzero_exit_is_check_failed(tmp_path: Path) -> None:
    (tmp_path / "dcgmi-diag.json").write_text("Error: unable to establish a connection\n")
    (tmp_path / "dcgmi-diag.exitcode").write_text("226")
    with pytest.raises(CheckFailed, match=r"dcgmi diag.*226"):
        DcgmCheck().run(context(tmp_path))


def test_dcgm_check_truncated_document_with_exit_zero_is_parse_error(tmp_path: Path) -> None:
    (tmp_path / "dcgmi-diag.json").write_text(GB10.read_text()[:400])
    with pytest.raises(ParseError):
        DcgmCheck().run(context(tmp_path))


def test_dcgm_check_keeps_health_verdict_when_diag_fails(tmp_path: Path) -> None:
    gpu2 = entity("Failure", **{"Memory system": ("Failure", ["DBE detected"])})
    (tmp_path / "dcgmi-health.json").write_text(health("Failure", GPU={"2": gpu2}))
    (tmp_path / "dcgmi-diag.json").write_text("")
    (tmp_path / "dcgmi-diag.exitcode").write_text("226")
    findings = DcgmCheck().run(context(tmp_path))
    assert codes(findings) == ["DCGM_HEALTH_MEMORY", CHECK_FAILED]
    assert findings[0].action is Action.RESET_GPU
    assert findings[1].inconclusive


def test_dcgm_check_health_only_is_enough(tmp_path: Path) -> None:
    (tmp_path / "dcgmi-health.json").write_text(health("Healthy"))
    assert DcgmCheck().run(context(tmp_path)) == []


def test_exporter_check_on_bundles(tmp_path: Path) -> None:
    with pytest.raises(ToolMissing):
        DcgmExporterCheck().run(context(tmp_path))
    (tmp_path / "dcgm-metrics.prom").write_text(L4_SCRAPE.read_text())
    findings = DcgmExporterCheck().run(context(tmp_path, expected_gpus=1))
    assert codes(findings) == ["DCGM_XID_SERIES_ABSENT"]
    findings = DcgmExporterCheck().run(context(tmp_path, expected_gpus=8))
    assert "DCGM_GPU_COUNT_MISMATCH" in codes(findings)


def test_empty_runtime_error_says_nothing() -> None:
    assert parse_diag(dcgm4(result(0, "Pass"), runtime_error=""), 0) == []
