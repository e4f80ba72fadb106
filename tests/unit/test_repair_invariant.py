"""A repair asked for is a repair done.

Over every finding code the checks can produce (driven through the real producers, from
their own rule tables, and from docs/checks.md's tables): a finding whose action is
``RESET_GPU`` or above is critical or deferred, its layer is Unhealthy, the condition the
agent publishes is ``False``, and the controller sees it as a fault to repair (deferred
exactly when the finding is). The docs' ``repair`` column says the same.
"""

from __future__ import annotations

import ast
import csv
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import pytest

from gpuguard.checks import gpu_rules, xid_catalog
from gpuguard.checks.dcgm import diag as dcgm_diag
from gpuguard.checks.dcgm import exporter as dcgm_exporter
from gpuguard.checks.dcgm import health as dcgm_health
from gpuguard.checks.gpu_facts import GpuFacts, NvLinkFacts, evaluate_gpus
from gpuguard.checks.load import judge
from gpuguard.checks.load.nic_loopback import judge_loopback
from gpuguard.checks.nvidia_smi import check as smi
from gpuguard.contract.conditions import PROFILES, desired_conditions
from gpuguard.contract.keys import REPORT_ANNOTATION
from gpuguard.contract.report import ReportDocument, encode_report, layer_entries
from gpuguard.controller.observe import project_node
from gpuguard.kernel_log.check import classify_log
from gpuguard.model import (
    NODE,
    Action,
    CheckResult,
    Finding,
    Layer,
    NodeReport,
    Outcome,
    Severity,
    Status,
    assess_layer,
)

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "checks.md"
CHECKS = ROOT / "src" / "gpuguard" / "checks"
KERNEL_LOG = ROOT / "src" / "gpuguard" / "kernel_log"
FIXTURES = [
    *sorted((ROOT.parent / "shared" / "fixtures").glob("dmesg_*.log")),
    *sorted((ROOT / "examples").glob("*/kmsg.log")),
    *sorted((ROOT / "examples").glob("*.log")),
]
BUS = "00000000:91:00.0"


# -- every finding the producers give -------------------------------------------------


def _gpu_facts() -> Iterator[Finding]:
    """Every rule of ``evaluate_gpus``, through GPUs that break each one."""
    broken = GpuFacts(
        pci_bus_id=BUS,
        ecc_uncorrected_volatile=2,
        remap_pending=True,
        remap_failure=True,
        remap_uncorrectable=600,
        retired_pages_pending=True,
        retired_pages=64,
        temperature_c=95,
        slowdown_temp_c=87,
        shutdown_temp_c=92,
        clock_event_reasons=frozenset(gpu_rules.SLOWDOWN_CODES),
        pcie_gen_current=3,
        pcie_gen_max=5,
        pcie_width_current=8,
        pcie_width_max=16,
        nvlinks=[NvLinkFacts(0, False, {"recovery": 1}), NvLinkFacts(1, True, {"replay": 3})],
        reset_required=True,
        drain_and_reset_recommended=True,
    )
    variants = [
        broken,
        GpuFacts("0000:92:00.0", temperature_c=89, slowdown_temp_c=87, shutdown_temp_c=92),
        GpuFacts("0000:93:00.0", mig_enabled=True),
        *(
            GpuFacts(f"0000:9{i}:00.0", error=e)
            for i, e in enumerate(["GPU_IS_LOST", "RESET_REQUIRED", "Unknown Error"], 4)
        ),
    ]
    texts = [*xid_catalog.RECOVERY_ACTIONS, "Drain and Reset", "Drain P2P", "GPU Reset", "Bogus"]
    variants += [GpuFacts("0000:a0:00.0", recovery_action=text) for text in texts]
    yield from evaluate_gpus(variants, 9, "nvml")
    yield from evaluate_gpus(variants[:1], 1, "nvml")  # more GPUs than expected
    yield from evaluate_gpus(variants[:1], 3, "nvml")
    yield smi._unlisted_gpus(smi.SmiReport(2, variants[:1]))


def _deep() -> Iterator[Finding]:
    for code in judge.RULES:
        yield judge.finding(code, NODE, "from the rule table")
    yield from judge_loopback({"mlx5_0/1": 100.0, "mlx5_1/1": 390.0, "mlx5_2/1": 395.0}, 400, 0.8)
    yield from judge_loopback({"mlx5_0/1": 100.0, "mlx5_1/1": 390.0}, None, 0.8)


def _dcgm_exporter() -> Iterator[Finding]:
    labels = f'gpu="0",UUID="GPU-0",pci_bus_id="{BUS}"'
    lines = [f"{rule.metric}{{{labels}}} {rule.at_least:g}" for rule in dcgm_exporter.COUNTER_RULES]
    lines.append(f"{dcgm_exporter.XID_METRIC}{{{labels}}} 79")
    sample = dcgm_exporter.parse_exporter_metrics("\n".join(lines) + "\n")
    for expected in (None, 0, 1, 4):
        yield from dcgm_exporter.evaluate_exporter(sample, expected)


def _dcgm_health() -> Iterator[Finding]:
    labels = ["PCIe system", "NVLINK system", "Memory system", "SM system", "NvSwitch Fatal",
              "InfoROM system", "Thermal system", "Power system", "Driver", "PMU system",
              "MCU system", "ConnectX system", "Something new"]  # fmt: skip
    # The watches DCGM files under no named system, or under "Driver", by their messages.
    messages = ["Detected XID 79 for GPU 0", "Detected fatal NvSwitch SXID 12028",
                "IMEX domain status is DEGRADED", "GPU 0: Fabric State is In Progress (2).",
                "A pending retired page has been detected in GPU 0.",
                *(f"Recovery action: 1 ({name})." for name in
                  ("GPU_RESET", "NODE_REBOOT", "DRAIN_P2P", "DRAIN_AND_RESET", "UNHEARD_OF"))]  # fmt: skip
    for word in ("Warning", "Failure", "Sideways"):
        errors = {label: {"value": word, "overflow": ["a message"]} for label in labels}
        errors |= {
            f"Internal error {i}": {"value": word, "overflow": [m]} for i, m in enumerate(messages)
        }
        entity = {"value": word, "children": {"Errors": {"children": errors}}}
        body = {"Overall Health": {"value": word}, "GPU": {"children": {"0": entity}}}
        yield from dcgm_health.parse_health(json.dumps({"body": body}))


def _dcgm_diag() -> Iterator[Finding]:
    """Every error id of DCGM's table, and each document severity, failed and warned."""
    ids = sorted({*dcgm_diag.error_codes(), *dcgm_diag.ERROR_OVERRIDES, 0})
    for status in ("Fail", "Warn", "Pass", "Mystery"):
        results = [
            {"entity_group": "GPU", "entity_id": 0, "status": status,
             "warnings": [{"error_id": i, "warning": "w"} for i in ids]
             + [{"error_id": 9999, "error_severity": s, "warning": "w"} for s in range(7)]},
            {"entity_group": "GPU", "entity_id": 1, "status": status},
        ]  # fmt: skip
        tests = [{"name": "memory", "results": results, "test_summary": {"status": status}}]
        document = {"DCGM Diagnostic": {"test_categories": [{"category": "x", "tests": tests}]}}
        yield from dcgm_diag.parse_diag(json.dumps(document), 226)


def _xids() -> Iterator[Finding]:
    component = NODE
    texts = [
        "",
        "Fatal error",
        "Nonfatal error",
        *(f"GPU recovery action changed from 0x0 (None) to 0x4 ({t})" for t in _recovery_texts()),
    ]
    for xid in sorted({*xid_catalog.catalog(), 154, 99999}):
        for text in texts:
            yield xid_catalog.xid_finding(xid, component, "kernel-log", text, text)


def _recovery_texts() -> list[str]:
    return ["None", "GPU Reset Required", "Node Reboot Required", "Drain P2P", "Drain and Reset"]


def _kernel_logs() -> Iterator[Finding]:
    for path in FIXTURES:
        yield from classify_log(path.read_text(errors="replace"))
    # Every driver and kernel message of the table, printed with placeholder values.
    table = resources.files("gpuguard").joinpath("data/kernel_messages.csv").read_text()
    for row in csv.DictReader(table.splitlines()):
        text = row["format"].replace("\\n", "\n")
        text = re.sub(r"%0?\d*(?:ll|l|L)?[duxX]", "1", text).replace("%s", "x")
        line = "NVRM: GPU 0000:3b:00.0: " + text if "NVRM" not in text else text
        yield from classify_log("[    1.000000] " + line)  # as dmesg prints a record


@cache
def produced() -> tuple[Finding, ...]:
    producers = (_gpu_facts, _deep, _dcgm_exporter, _dcgm_health, _dcgm_diag, _xids, _kernel_logs)
    return tuple(f for producer in producers for f in producer())


# -- the docs' tables ---------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    section: str
    codes: tuple[str, ...]
    cells: dict[str, str]

    def matches(self, code: str) -> bool:
        return any(re.fullmatch(_pattern(c), code) for c in self.codes)


def _pattern(code: str) -> str:
    return re.sub(r"<[^>]+>", "[A-Z0-9]+", re.escape(code).replace(r"\<", "<").replace(r"\>", ">"))


@cache
def doc_rows() -> tuple[Row, ...]:
    rows, section, header = [], "", [""]
    for line in DOCS.read_text().splitlines():
        if line.startswith("## "):
            section, header = line[3:], [""]
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0] == "code":
            header = cells
            continue
        first = re.sub(r"\(.*?\)", "", cells[0])  # codes, not the notes in parentheses
        codes = tuple(re.findall(r"`([A-Z][A-Z0-9_]*(?:<[a-zA-Z]+>)?)`", first))
        rows.append(Row(section, codes, dict(zip(header, cells, strict=False))))
    return tuple(rows)


def rows_for(code: str) -> list[Row]:
    return [row for row in doc_rows() if row.matches(code)]


def _code_literals() -> set[str]:
    """Every upper-case code-like string in the checks' and the kernel log's source (and the
    codes they share with the policy): what a check can name."""
    found: set[str] = set()
    sources = [*CHECKS.rglob("*.py"), *KERNEL_LOG.rglob("*.py")]
    shared = [ROOT / "src" / "gpuguard" / "model.py", ROOT / "src/gpuguard/contract/maintenance.py"]
    for path in [*sources, *shared]:
        for item in ast.walk(ast.parse(path.read_text())):
            text = item.value if isinstance(item, ast.Constant) else None
            if isinstance(text, str) and re.fullmatch(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)+_?", text):
                found.add(text)
    return found


# -- the invariant --------------------------------------------------------------------------


def published(finding: Finding) -> tuple[Status, str, str, bool]:
    """The layer's status, the condition the agent writes (gpuguard profile), and the
    status and deferral the controller reads back from the Node."""
    health = assess_layer(finding.layer, [finding], [finding.source], [])
    (condition,) = desired_conditions({finding.layer: health}, "gpuguard")
    report = NodeReport({finding.layer: health}, [])
    node = {
        "metadata": {
            "name": "n1",
            "annotations": {
                REPORT_ANNOTATION: encode_report(ReportDocument(layers=layer_entries(report)))
            },
        },
        "status": {"conditions": [{"type": condition.type, "status": condition.status}]},
    }
    layer = project_node(node, "pool").layers[str(finding.layer)]
    return health.status, condition.status, layer.status, layer.deferred


def repairing() -> list[Finding]:
    return [f for f in produced() if f.action >= Action.RESET_GPU]


def test_the_producers_cover_their_rule_tables():
    codes = {f.code for f in produced()}
    tables = {*gpu_rules.RULES, *judge.RULES, *(r.code for r in dcgm_exporter.COUNTER_RULES)}
    tables |= {r.code for r in dcgm_health.SYSTEM_RULES.values()}
    tables |= {v.code for v in [*dcgm_diag.VERDICTS.values(), *dcgm_diag.ERROR_OVERRIDES.values()]}
    assert tables - codes == set()
    assert {f.code for f in repairing() if f.deferred} >= {
        "ROW_REMAP_PENDING",
        "RETIRED_PAGES_PENDING",
        "RECOVERY_ACTION_REQUIRED",
        "DCGM_ROW_REMAP_PENDING",
        "DCGM_DIAG_HARDWARE",
        "DEEP_MATMUL_SLOW",
        "DEEP_MEMORY_BANDWIDTH_LOW",
        "DEEP_PEER_BANDWIDTH_LOW",
        "DEEP_NIC_LOOPBACK_SLOW",
    }


def _key(f: Finding) -> str:
    return f"{f.source}:{f.code}:{f.severity}:{f.action}:{'deferred' if f.deferred else 'now'}"


@pytest.mark.parametrize(
    "finding", sorted({_key(f): f for f in repairing()}.values(), key=_key), ids=_key
)
def test_a_repair_asked_for_is_a_repair_done(finding: Finding):
    assert finding.severity is Severity.CRITICAL or finding.deferred, (
        f"{finding.code} asks for {finding.action} as a mere {finding.severity}: "
        "make it critical (repair now) or deferred (drain and reset)"
    )
    status, condition, seen, deferred = published(finding)
    assert (status, condition, seen) == (Status.UNHEALTHY, "False", "False")
    assert deferred is finding.deferred


def test_a_deferred_repair_stays_true_only_under_the_eks_names():
    finding = next(f for f in produced() if f.code == "ROW_REMAP_PENDING")
    health = assess_layer(Layer.GPU, [finding], ["nvml"], [])
    assert health.deferred
    (ours,) = desired_conditions({Layer.GPU: health}, "gpuguard")
    (eks,) = desired_conditions({Layer.GPU: health}, "eks")
    assert (ours.status, ours.reason) == ("False", "RowRemapPending")
    assert "drain and reset" in ours.message and ours.message == eks.message
    assert (eks.type, eks.status) == (PROFILES["eks"][Layer.GPU], "True")
    report = NodeReport({Layer.GPU: health}, [])
    node = {
        "metadata": {
            "annotations": {
                REPORT_ANNOTATION: encode_report(ReportDocument(layers=layer_entries(report)))
            }
        },
        "status": {"conditions": [{"type": eks.type, "status": eks.status}]},
    }
    layer = project_node(node, "pool").layers["gpu"]
    assert (layer.status, layer.deferred, layer.action) == ("False", True, Action.RESET_GPU)


def test_a_critical_finding_beside_a_deferred_one_is_repaired_now():
    remap = next(f for f in produced() if f.code == "ROW_REMAP_PENDING")
    ecc = next(f for f in produced() if f.code == "ECC_UNCORRECTABLE_VOLATILE")
    assert not assess_layer(Layer.GPU, [remap, ecc], ["nvml"], []).deferred
    timed_out = CheckResult("nvml", Layer.GPU, Outcome.TIMED_OUT).layer  # a check without verdict
    assert timed_out is Layer.GPU
    inconclusive = Finding(
        Layer.GPU, "CHECK_TIMED_OUT", Severity.WARNING, Action.NONE, NODE, "x", ""
    )
    assert not assess_layer(Layer.GPU, [remap, inconclusive], ["nvml"], []).deferred


def test_every_documented_code_exists_and_every_produced_code_is_documented():
    known = _code_literals() | {f.code for f in produced()}
    for row in doc_rows():
        for code in row.codes:
            assert any(re.fullmatch(_pattern(code), k) for k in known), (
                f"docs/checks.md ({row.section}) lists {code}, which no check produces"
            )
    undocumented = sorted({f.code for f in produced() if not rows_for(f.code)})
    assert undocumented == []


def test_every_table_outside_the_network_section_says_when_it_repairs():
    for row in doc_rows():
        if row.section.startswith("Network") and "repair" not in row.cells:
            continue  # its owner adds the column
        repair = row.cells.get("repair", "")
        assert re.search(r"\b(now|deferred|none)\b|as the kernel log", repair), (row.section, row)
        actions = row.cells.get("action", "")
        if re.fullmatch(r"(RESET_GPU|REBOOT|REPLACE)( / (RESET_GPU|REBOOT|REPLACE))*", actions):
            assert re.search(r"\b(now|deferred)\b", repair), row


def test_the_docs_say_deferred_exactly_where_the_producers_defer():
    for finding in repairing():
        rows = rows_for(finding.code)
        word = "deferred" if finding.deferred else "now"
        assert any(
            word in row.cells.get("repair", "")
            or "as the kernel log" in row.cells.get("repair", "")
            for row in rows
        ), f"docs/checks.md does not say {finding.code} ({finding.source}) is repaired {word}"
