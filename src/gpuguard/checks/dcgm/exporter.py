"""dcgm-exporter's Prometheus text: a strict parser and the rules that judge its values.

What the default counter sets leave out matters as much as what they carry: the GPU
Operator's set can lack ``DCGM_FI_DEV_XID_ERRORS`` entirely (the AWS L4 capture), and ECC
counters are commented out by default. An absent series is never read as zero: a missing
Xid series is a ``DCGM_XID_SERIES_ABSENT`` note, and a missing counter is simply not judged.
Values that are DCGM's "not measured" sentinels (near 2^63, 2^31 or 2^47) are skipped too.

=================================  ===============================  ========  =========
metric (per GPU)                   code                             severity  action
=================================  ===============================  ========  =========
DCGM_FI_DEV_XID_ERRORS != 0        XID_<n> (the Xid catalog rule)   catalog   catalog
DCGM_EXP_XID_ERRORS_COUNT > 0      XID_<n>                          catalog   catalog
DCGM_FI_DEV_ROW_REMAP_FAILURE > 0  DCGM_ROW_REMAP_FAILURE           critical  RESET_GPU
DCGM_FI_DEV_ROW_REMAP_PENDING > 0  DCGM_ROW_REMAP_PENDING           critical  RESET_GPU, deferred
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0  DCGM_ECC_DBE_VOLATILE            critical  RESET_GPU
UNCORRECTABLE_REMAPPED_ROWS >=512  DCGM_UNCORRECTABLE_REMAPPED_ROWS warning   NONE
UNCORRECTABLE_REMAPPED_ROWS > 0    DCGM_UNCORRECTABLE_REMAPPED_ROWS info      NONE
fewer GPUs than expected           DCGM_GPU_COUNT_MISMATCH          critical  REBOOT
more GPUs than expected            DCGM_GPU_COUNT_MISMATCH          warning   NONE
=================================  ===============================  ========  =========
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpuguard.checks.dcgm.common import dcgm_entity, int_text, is_blank, small_int
from gpuguard.checks.rules import Rule
from gpuguard.checks.xid_catalog import xid_finding
from gpuguard.errors import ParseError
from gpuguard.model import NODE, Action, Component, Finding, Layer, Severity, gpu

SOURCE = "dcgm-exporter"
XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
XID_COUNT_METRIC = "DCGM_EXP_XID_ERRORS_COUNT"
MAX_EVIDENCE = 500

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_VALUE = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|Inf|inf|NaN|nan)")
_TIMESTAMP = re.compile(r"-?\d{1,20}")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass(frozen=True)
class MetricSample:
    """One exposition line: ``name{labels} value``."""

    name: str
    labels: Mapping[str, str]
    value: float
    line: str

    @property
    def gpu(self) -> Component | None:
        """The GPU the line is about, from its pci_bus_id, UUID and gpu labels."""
        uuid = self.labels.get("UUID") or None
        bus_id = self.labels.get("pci_bus_id")
        if bus_id:
            return gpu(bus_id, uuid)
        index = self.labels.get("gpu")
        if index is not None:
            return Component("gpu", dcgm_entity("GPU", index).id, uuid)
        return Component("gpu", uuid.lower(), uuid) if uuid else None


@dataclass(frozen=True)
class ExporterSample:
    """Every sample of one scrape of dcgm-exporter."""

    samples: tuple[MetricSample, ...]

    def family(self, name: str) -> list[MetricSample]:
        return [s for s in self.samples if s.name == name]

    def gpus(self) -> dict[str, Component]:
        """The GPUs the scrape speaks of, by component id (MIG instances fold into their GPU)."""
        return {c.id: c for s in self.samples if (c := s.gpu) is not None}


@dataclass(frozen=True, kw_only=True)
class CounterRule(Rule):
    """A rule that applies when ``metric`` reaches ``at_least``."""

    metric: str
    at_least: float


# Per metric, the first rule whose floor the value reaches decides (highest floor first).
COUNTER_RULES = (
    CounterRule(
        "DCGM_ROW_REMAP_FAILURE",
        Severity.CRITICAL,
        Action.REPLACE,
        "row remapping failed: the GPU has no spare rows left to repair with",
        metric="DCGM_FI_DEV_ROW_REMAP_FAILURE",
        at_least=1,
    ),
    CounterRule(
        "DCGM_ROW_REMAP_PENDING",
        Severity.CRITICAL,
        Action.RESET_GPU,
        "a row remap waits for a GPU reset to take effect (drain and reset)",
        deferred=True,
        metric="DCGM_FI_DEV_ROW_REMAP_PENDING",
        at_least=1,
    ),
    CounterRule(
        "DCGM_ECC_DBE_VOLATILE",
        Severity.CRITICAL,
        Action.RESET_GPU,
        "uncorrectable ECC errors since the driver loaded",
        metric="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        at_least=1,
    ),
    CounterRule(
        "DCGM_UNCORRECTABLE_REMAPPED_ROWS",
        Severity.WARNING,
        Action.NONE,
        "DCGM's limit of 512 uncorrectable remaps: spare rows run out",
        metric="DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        at_least=512,
    ),
    CounterRule(
        "DCGM_UNCORRECTABLE_REMAPPED_ROWS",
        Severity.INFO,
        Action.NONE,
        "rows remapped after uncorrectable errors (repaired)",
        metric="DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        at_least=1,
    ),
)


def parse_exporter_metrics(text: str) -> ExporterSample:
    """Parse Prometheus text exposition; raises ParseError on any malformed line."""
    samples: list[MetricSample] = []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if line and not line.startswith("#"):
            samples.append(_parse_line(line, number))
    if not samples:
        raise ParseError(f"{SOURCE}: no metric samples in the scrape")
    return ExporterSample(tuple(samples))


def evaluate_exporter(sample: ExporterSample, expected_gpus: int | None) -> list[Finding]:
    """Findings from one scrape; ``expected_gpus`` None skips the GPU count check."""
    gpus = sample.gpus()
    found: dict[tuple[str, str], Finding] = {}
    for finding in [*_xid_findings(sample, gpus), *_counter_findings(sample)]:
        found.setdefault((finding.code, finding.component.id), finding)
    return [*found.values(), *_count_findings(gpus, expected_gpus)]


def last_xid(sample: MetricSample) -> int | None:
    """The Xid of an XID_ERRORS line: the err_code label (newer exporters), else the value."""
    code = int_text(sample.labels.get("err_code", ""))
    if code is not None:
        return code
    if is_blank(sample.value) or sample.value != int(sample.value):
        return None
    return small_int(int(sample.value))


def _xid_findings(sample: ExporterSample, gpus: dict[str, Component]) -> list[Finding]:
    findings: list[Finding] = []
    visible: set[str] = set()
    series = sample.family(XID_METRIC)
    for line in series:
        xid = last_xid(line)
        if xid is None:
            continue
        component = line.gpu or NODE
        visible.add(component.id)
        if xid != 0:
            text = line.labels.get("err_msg", "")
            findings.append(xid_finding(xid, component, SOURCE, line.line, text))
    for line in sample.family(XID_COUNT_METRIC):
        xid = int_text(line.labels.get("xid", ""))
        if xid and not is_blank(line.value) and line.value > 0:
            findings.append(xid_finding(xid, line.gpu or NODE, SOURCE, line.line))
    if not series:
        findings.append(_xids_invisible(NODE, f"no {XID_METRIC} series in the scrape"))
    else:
        for gpu_id in sorted(set(gpus) - visible):
            findings.append(_xids_invisible(gpus[gpu_id], f"no readable {XID_METRIC} value"))
    return findings


def _counter_findings(sample: ExporterSample) -> list[Finding]:
    findings: list[Finding] = []
    for line in sample.samples:
        if is_blank(line.value):
            continue
        rule = next(
            (r for r in COUNTER_RULES if r.metric == line.name and line.value >= r.at_least), None
        )
        if rule is None:
            continue
        component = line.gpu or NODE
        message = f"{line.name} is {line.value:g} on {component}: {rule.why}"
        findings.append(rule.finding(Layer.GPU, component, SOURCE, message, line.line))
    return findings


def _count_findings(gpus: dict[str, Component], expected: int | None) -> list[Finding]:
    seen = len(gpus)
    if expected is None:
        if seen:
            return []
        message = "the scrape names no GPU: it says nothing about this node's GPUs"
        return [_node_finding("DCGM_EXPORTER_NO_GPUS", Severity.WARNING, Action.NONE, message)]
    if seen == expected:
        return []
    if seen < expected:
        message = (
            f"dcgm-exporter sees {seen} of {expected} expected GPUs: a GPU that vanished has "
            "usually fallen off the bus (restart the node; replace it if it recurs)"
        )
        return [_node_finding("DCGM_GPU_COUNT_MISMATCH", Severity.CRITICAL, Action.REBOOT, message)]
    message = f"dcgm-exporter sees {seen} GPUs, more than the {expected} expected: check the config"
    return [_node_finding("DCGM_GPU_COUNT_MISMATCH", Severity.WARNING, Action.NONE, message)]


def _xids_invisible(component: Component, reason: str) -> Finding:
    message = (
        f"Xids are not visible from dcgm-exporter for {component}: {reason} "
        "(absence is not read as 'no Xid')"
    )
    return Finding(
        Layer.GPU, "DCGM_XID_SERIES_ABSENT", Severity.INFO, Action.NONE, component, SOURCE, message
    )


def _node_finding(code: str, severity: Severity, action: Action, message: str) -> Finding:
    return Finding(Layer.GPU, code, severity, action, NODE, SOURCE, message)


def _parse_line(line: str, number: int) -> MetricSample:
    name = _NAME.match(line)
    if name is None:
        raise ParseError(f"{SOURCE}: line {number}: no metric name: {line[:80]!r}")
    labels: dict[str, str] = {}
    pos = name.end()
    if line.startswith("{", pos):
        labels, pos = _parse_labels(line, pos + 1, number)
    rest = line[pos:]
    fields = rest.split()
    if not rest[:1].isspace() or len(fields) not in (1, 2):
        raise ParseError(f"{SOURCE}: line {number}: expected 'name{{labels}} value [timestamp]'")
    if not _VALUE.fullmatch(fields[0]) or (
        len(fields) == 2 and not _TIMESTAMP.fullmatch(fields[1])
    ):
        raise ParseError(f"{SOURCE}: line {number}: not a sample value: {fields[0][:40]!r}")
    return MetricSample(name.group(), labels, float(fields[0]), line[:MAX_EVIDENCE])


def _parse_labels(line: str, pos: int, number: int) -> tuple[dict[str, str], int]:
    labels: dict[str, str] = {}
    while True:
        pos = _skip_spaces(line, pos)
        if line.startswith("}", pos):
            return labels, pos + 1
        label = _LABEL_NAME.match(line, pos)
        if label is None:
            raise ParseError(f"{SOURCE}: line {number}: bad label at column {pos + 1}")
        pos = _skip_spaces(line, label.end())
        if not line.startswith("=", pos):
            raise ParseError(f"{SOURCE}: line {number}: '=' expected after {label.group()}")
        pos = _skip_spaces(line, pos + 1)
        if not line.startswith('"', pos):
            raise ParseError(f"{SOURCE}: line {number}: quoted value expected for {label.group()}")
        value, pos = _parse_quoted(line, pos + 1, number)
        if label.group() in labels:
            raise ParseError(f"{SOURCE}: line {number}: label {label.group()} given twice")
        labels[label.group()] = value
        pos = _skip_spaces(line, pos)
        if line.startswith(",", pos):
            pos += 1
        elif not line.startswith("}", pos):
            raise ParseError(f"{SOURCE}: line {number}: ',' or '}}' expected at column {pos + 1}")


def _parse_quoted(line: str, pos: int, number: int) -> tuple[str, int]:
    """A label value after its opening quote; ``\\\\``, ``\\"`` and ``\\n`` are unescaped."""
    out: list[str] = []
    while pos < len(line):
        char = line[pos]
        if char == '"':
            return "".join(out), pos + 1
        if char == "\\" and pos + 1 < len(line):
            escaped = line[pos + 1]
            out.append(_ESCAPES.get(escaped, "\\" + escaped))
            pos += 2
            continue
        out.append(char)
        pos += 1
    raise ParseError(f"{SOURCE}: line {number}: unterminated label value")


def _skip_spaces(line: str, pos: int) -> int:
    while pos < len(line) and line[pos] in " \t":
        pos += 1
    return pos
