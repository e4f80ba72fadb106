"""The chart's NodeRemediation CRD is the one generated from the wire model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gpuguard.contract import crd
from gpuguard.contract.times import TIME_PATTERN

CHART_CRD = Path(__file__).parents[2] / "deploy/helm/gpuguard/crds/noderemediations.yaml"


def test_the_charts_crd_is_the_generated_one():
    assert CHART_CRD.read_text() == crd.crd_yaml(), "the model changed: run `make crds`"


def test_the_schema_is_structural():
    schema = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    text = json.dumps(schema)
    for forbidden in ('"$ref"', '"anyOf"', '"null"', '"default"', '"title"'):
        assert forbidden not in text
    assert yaml.safe_load(crd.crd_yaml()) == crd.crd()


def schemas(node: dict[str, Any], at: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema in the CRD's, with its path."""
    yield at, node
    for name, field in (node.get("properties") or {}).items():
        yield from schemas(field, f"{at}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from schemas(node[key], f"{at}[]")


def status_schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_every_time_has_the_parsers_pattern():
    # tests/kube/test_contract_times.py checks that pattern + date-time = parse_time.
    times = [(at, s) for at, s in schemas(status_schema()) if s.get("format") == "date-time"]
    assert len(times) == 9, [at for at, _ in times]
    for at, schema in times:
        assert schema["pattern"] == TIME_PATTERN, at


def test_what_gpuguard_copies_is_bounded():
    # chaos_findings F11: a 1 MB answer copied three times made its episode unwritable.
    fields = dict(schemas(status_schema()))
    for at in (".status.result.message", ".status.lastMessage", ".status.steps[].message"):
        assert fields[at]["maxLength"] == 1024, at
    assert fields[".status.steps"]["maxItems"] == 200
    free = {
        at
        for at, s in fields.items()
        if at.startswith((".spec", ".status")) and s.get("type") == "string"
        if "enum" not in s and "format" not in s and "maxLength" not in s
    }
    assert free <= {".status.steps[].phase"}  # read as a Phase, never copied as text
    unbounded = [at for at, s in fields.items() if s.get("type") == "array" and "maxItems" not in s]
    assert unbounded == []
