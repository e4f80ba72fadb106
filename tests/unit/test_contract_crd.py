"""The chart's NodeRemediation CRD is the one generated from the wire model."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from gpuguard.contract import crd

CHART_CRD = Path(__file__).parents[2] / "deploy/helm/gpuguard/crds/noderemediations.yaml"


def test_the_charts_crd_is_the_generated_one():
    assert CHART_CRD.read_text() == crd.crd_yaml(), "the model changed: run `make crds`"


def test_the_schema_is_structural():
    schema = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    text = json.dumps(schema)
    for forbidden in ('"$ref"', '"anyOf"', '"null"', '"default"', '"title"'):
        assert forbidden not in text
    assert yaml.safe_load(crd.crd_yaml()) == crd.crd()
