"""Property tests: the DCGM parsers return or raise ParseError, and garbage is never a pass.

The inputs are arbitrary text, JSON built from the documents' own vocabulary (so the
parsers' deeper branches are reached), and the real captures truncated or mutated.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuguard.checks.dcgm.check import (
    evaluate_exporter,
    parse_diag,
    parse_exporter_metrics,
    parse_health,
)
from gpuguard.checks.dcgm.diag_document import DOCUMENT_KEYS, read_results
from gpuguard.errors import ParseError
from gpuguard.model import Finding

DATA = Path(__file__).resolve().parent.parent / "data"
GB10 = (DATA / "dcgmi_diag_r1_j_gb10_dcgm4.2.3_software_fail_exit226.json").read_text()
L4_SCRAPE = (DATA / "dcgm-exporter_metrics_l4_aws_580.105.08.prom").read_text()
RTX_SCRAPE = (
    DATA / "dcgm-exporter_metrics_rtx4000ada_580.95.05_k8s_pod_labels_xid_errmsg.prom"
).read_text()
# Built from research 2.2: there is no real `dcgmi health -c -j` capture.
HEALTH = json.dumps(
    {
        "header": ["Health Monitor Report"],
        "body": {
            "Overall Health": {"value": "Warning"},
            "GPU": {
                "children": {
                    "0": {
                        "value": "Warning",
                        "children": {
                            "Errors": {
                                "children": {
                                    "PCIe system": {
                                        "value": "Warning",
                                        "overflow": ["Detected more than 8 PCIe", "replays"],
                                    }
                                }
                            }
                        },
                    }
                }
            },
        },
    },
    indent=3,
)

FUZZ = settings(max_examples=200, deadline=None)

WORDS = [
    "Pass", "Fail", "Warn", "Skip", "pass", "Healthy", "Warning", "Failure", "Internal error",
    "GPU", "Switch", "0", "1,2", "", "DCGM_FR_OK", str(2**63 - 14),
]  # fmt: skip
KEYS = [
    "DCGM Diagnostic", "DCGM GPU Diagnostic", "test_categories", "tests", "name", "results",
    "status", "entity_group", "entity_id", "gpu_ids", "gpu_id", "warnings", "warning",
    "error_id", "error_severity", "test_summary", "runtime_error", "info", "body", "header",
    "Overall Health", "GPU", "children", "Errors", "value", "overflow", "PCIe system",
]  # fmt: skip

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(WORDS)
    | st.text(max_size=8)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), inner, max_size=5)
    ),
    max_leaves=40,
)


def truncations(text: str) -> st.SearchStrategy[str]:
    return st.integers(min_value=0, max_value=len(text)).map(lambda cut: text[:cut])


def mutations(text: str) -> st.SearchStrategy[str]:
    """The text with one span replaced by arbitrary characters."""
    return st.tuples(
        st.integers(min_value=0, max_value=len(text)),
        st.integers(min_value=0, max_value=40),
        st.text(max_size=10),
    ).map(lambda m: text[: m[0]] + m[2] + text[m[0] + m[1] :])


def diag_or_parse_error(text: str, exit_code: int) -> list[Finding] | None:
    """parse_diag's findings, or None when it refused the text with ParseError."""
    try:
        findings = parse_diag(text, exit_code)
    except ParseError:
        return None
    if not findings:
        assert_really_passed(text)
    return findings


def assert_really_passed(text: str) -> None:
    """An empty answer is a pass: only a document whose every result says Pass may give it."""
    document = json.loads(text[text.index("{") :])
    body = next(document[key] for key in DOCUMENT_KEYS if key in document)
    results = read_results(body)
    assert results
    assert all(r.status == "pass" for r in results)


@FUZZ
@given(st.text(), st.integers(min_value=0, max_value=255))
def test_diag_arbitrary_text(text: str, exit_code: int) -> None:
    diag_or_parse_error(text, exit_code)


@FUZZ
@given(json_values, st.sampled_from(DOCUMENT_KEYS), st.integers(min_value=0, max_value=255))
def test_diag_structured_json(body: Any, key: str, exit_code: int) -> None:
    diag_or_parse_error(json.dumps({key: body}), exit_code)


@FUZZ
@given(truncations(GB10), st.sampled_from([0, 226]))
def test_diag_truncated_real_document(text: str, exit_code: int) -> None:
    findings = diag_or_parse_error(text, exit_code)
    complete = len(text.rstrip()) == len(GB10.rstrip())
    assert (findings is not None) == complete
    if findings is not None:
        assert [f.code for f in findings] == ["DCGM_DIAG_CONFIG"]


@FUZZ
@given(mutations(GB10), st.sampled_from([0, 226]))
def test_diag_mutated_real_document(text: str, exit_code: int) -> None:
    diag_or_parse_error(text, exit_code)


def health_or_parse_error(text: str) -> None:
    with contextlib.suppress(ParseError):
        parse_health(text)


@FUZZ
@given(st.text())
def test_health_arbitrary_text(text: str) -> None:
    health_or_parse_error(text)


@FUZZ
@given(json_values)
def test_health_structured_json(body: Any) -> None:
    health_or_parse_error(json.dumps({"body": body}))


@FUZZ
@given(truncations(HEALTH) | mutations(HEALTH))
def test_health_truncated_or_mutated(text: str) -> None:
    health_or_parse_error(text)


def exporter_or_parse_error(text: str, expected: int | None) -> None:
    try:
        sample = parse_exporter_metrics(text)
    except ParseError:
        return
    # Judging a parsed scrape never fails, and a scrape never reads as healthy by omission.
    findings = evaluate_exporter(sample, expected)
    if not sample.family("DCGM_FI_DEV_XID_ERRORS"):
        assert "DCGM_XID_SERIES_ABSENT" in [f.code for f in findings]


@FUZZ
@given(st.text(), st.none() | st.integers(min_value=0, max_value=16))
def test_exporter_arbitrary_text(text: str, expected: int | None) -> None:
    exporter_or_parse_error(text, expected)


@FUZZ
@given(
    truncations(RTX_SCRAPE) | mutations(RTX_SCRAPE) | truncations(L4_SCRAPE) | mutations(L4_SCRAPE),
    st.none() | st.integers(min_value=0, max_value=8),
)
def test_exporter_truncated_or_mutated_real_scrapes(text: str, expected: int | None) -> None:
    exporter_or_parse_error(text, expected)
