"""Reading a ``dcgmi diag -j`` document, DCGM 4 or DCGM 3, into one result per test and entity.

The shapes are described in :mod:`~gpuguard.checks.dcgm.diag`, which judges the results.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpuguard.checks.dcgm.common import (
    JsonObject,
    dcgm_entity,
    expect_list,
    expect_object,
    expect_str,
    int_text,
    small_int,
)
from gpuguard.errors import ParseError
from gpuguard.model import NODE, Component

SOURCE = "dcgmi diag"
DOCUMENT_KEYS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")  # DCGM 4, DCGM 3

# Status words, case-folded, to their canonical form.
_STATUSES = {
    "pass": "pass",
    "passed": "pass",
    "fail": "fail",
    "failed": "fail",
    "failure": "fail",
    "warn": "warn",
    "warning": "warn",
    "skip": "skip",
    "skipped": "skip",
    "not run": "skip",
}


@dataclass(frozen=True)
class DiagWarning:
    text: str
    error_id: int | None = None
    severity_value: int | None = None


@dataclass(frozen=True)
class EntityResult:
    """One test's verdict for one entity (``NODE`` when the document names none)."""

    test: str
    component: Component
    word: str
    warnings: tuple[DiagWarning, ...] = ()
    evidence: str = ""

    @property
    def status(self) -> str | None:
        """``pass``/``fail``/``warn``/``skip``, or ``None`` for a word we do not know."""
        return _STATUSES.get(self.word.strip().casefold())


def read_results(body: JsonObject) -> list[EntityResult]:
    """Every per-entity result, plus a node-level one where only a test summary speaks."""
    categories = body.get("test_categories")
    if categories is None:
        return []
    results: list[EntityResult] = []
    for index, category in enumerate(expect_list(categories, f"{SOURCE}: test_categories")):
        where = f"{SOURCE}: test_categories[{index}]"
        tests = expect_object(category, where).get("tests")
        for test in expect_list(tests, f"{where}.tests"):
            results += _test_results(expect_object(test, f"{where}.tests[]"))
    return results


def diagnostic_body(document: JsonObject) -> JsonObject:
    for key in DOCUMENT_KEYS:
        if key in document:
            return expect_object(document[key], f"{SOURCE}: {key}")
    raise ParseError(f"{SOURCE}: neither {' nor '.join(map(repr, DOCUMENT_KEYS))} in the document")


def runtime_error(body: JsonObject) -> str | None:
    """The reason the diagnostic stopped, if it says one (an empty string says nothing)."""
    value = body.get("runtime_error")
    if value is None:
        return None
    return expect_str(value, f"{SOURCE}: runtime_error").strip() or None


def _test_results(test: JsonObject) -> list[EntityResult]:
    name = expect_str(test.get("name"), f"{SOURCE}: test name")
    where = f"{SOURCE}: test {name!r}"
    raw_results = test.get("results")
    results: list[EntityResult] = []
    for raw in expect_list(raw_results, f"{where}.results") if raw_results is not None else []:
        results += _entity_results(name, expect_object(raw, f"{where}.results[]"))
    summary = test.get("test_summary")
    if summary is None:
        return results
    word = expect_str(expect_object(summary, f"{where}.test_summary").get("status"), where)
    status = _STATUSES.get(word.strip().casefold())
    # The summary speaks for the node when no entity result does, or when it says worse.
    failed = any(r.status == "fail" for r in results)
    if not results or status is None or (status == "fail" and not failed):
        results.append(EntityResult(name, NODE, word, evidence=compact(summary)))
    return results


def _entity_results(test: str, raw: JsonObject) -> list[EntityResult]:
    where = f"{SOURCE}: test {test!r} result"
    word = expect_str(raw.get("status"), f"{where}.status")
    warnings = _warnings(raw.get("warnings"), f"{where}.warnings")
    evidence = compact(raw)
    return [EntityResult(test, c, word, warnings, evidence) for c in _components(raw)]


def _components(raw: JsonObject) -> list[Component]:
    """DCGM 4 names one entity; DCGM 3 names GPUs in a string such as ``"0,1"``."""
    if "entity_id" in raw:
        group = raw.get("entity_group")
        group_name = group if isinstance(group, str) else "GPU"
        return [dcgm_entity(group_name, small_int(raw["entity_id"]))]
    ids = raw.get("gpu_ids", raw.get("gpu_id"))
    if isinstance(ids, int) and not isinstance(ids, bool):
        return [dcgm_entity("GPU", small_int(ids))]
    if isinstance(ids, str) and ids.strip():
        return [dcgm_entity("GPU", int_text(part)) for part in ids.split(",")]
    return [NODE]


def _warnings(value: object, where: str) -> tuple[DiagWarning, ...]:
    if value is None:
        return ()
    if isinstance(value, str):  # early DCGM 3 printed one message string
        return (DiagWarning(value),)
    warnings: list[DiagWarning] = []
    for item in expect_list(value, where):
        if isinstance(item, str):
            warnings.append(DiagWarning(item))
            continue
        entry = expect_object(item, where)
        text = entry.get("warning")
        warnings.append(
            DiagWarning(
                text if isinstance(text, str) else "",
                small_int(entry.get("error_id")),
                small_int(entry.get("error_severity")),
            )
        )
    return tuple(warnings)


def compact(value: object) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))[:600]
    except (ValueError, RecursionError):
        return ""
