"""The chart's NodeRemediation CRD, generated from the wire model (``make crds``).

``python -m gpuguard.contract.crd PATH`` writes it; tests/unit/test_contract_crd.py fails
when the chart's copy differs. pydantic's JSON schema becomes a structural schema the API
server accepts: every ``$ref`` inlined, an optional field is one that is not required
(never ``anyOf`` with null), and no defaults (the API server would write them into every
object) or titles. Descriptions come from the fields' ``description``; a model's
docstring describes it to code and stays out, except the top level's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from pydantic import JsonValue

from gpuguard.contract.keys import GROUP
from gpuguard.contract.remediation import KIND, PLURAL, VERSION, NodeRemediation

HEADER = """\
# One NodeRemediation per episode: a node's trip from detection back to service (see
# docs/remediation.md). Written by `gpuguard controller`; the node's agent reads `request`
# and answers in `result`. Helm installs crds/ before the templates and never upgrades or
# deletes it; apply a changed version with `kubectl apply -f` (Helm's documented rule).
# The agent asks for its own node's episodes: `fieldSelector=spec.nodeName=<node>`
# (selectableFields).
# Generated from src/gpuguard/contract/remediation.py by `make crds`: edit the model.
"""

_DROPPED = ("title", "default")
_ORDER = (
    "type",
    "format",
    "pattern",
    "minimum",
    "maxLength",
    "maxItems",
    "description",
    "enum",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "x-kubernetes-validations",
)


Schema = dict[str, JsonValue]  # a JSON object: a (sub)schema, or the whole CRD


def column(name: str, kind: str, path: str, **extra: JsonValue) -> Schema:
    return {"name": name, "type": kind, **extra, "jsonPath": path}


def crd() -> Schema:
    """The CustomResourceDefinition, as the API server takes it."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["nrem"],
                "categories": ["gpuguard"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    # The agent lists its own node's episodes (kube.remediations).
                    "selectableFields": [{"jsonPath": ".spec.nodeName"}],
                    "additionalPrinterColumns": [
                        column("Node", "string", ".spec.nodeName"),
                        column("Phase", "string", ".status.phase"),
                        column("Rung", "string", ".status.rung"),
                        column("Attempt", "integer", ".status.attempt"),
                        column("Resolution", "string", ".status.resolution"),
                        column("Age", "date", ".metadata.creationTimestamp"),
                        column("Last", "string", ".status.lastMessage", priority=1),
                    ],
                    "schema": {"openAPIV3Schema": structural(NodeRemediation)},
                }
            ],
        },
    }


def structural(model: type[NodeRemediation]) -> Schema:
    """The model's JSON schema as a Kubernetes structural schema."""
    schema = model.model_json_schema(by_alias=True)
    definitions = _object(schema.pop("$defs", {}))
    return _rewrite(schema, definitions)


def _rewrite(node: Schema, definitions: Schema) -> Schema:
    node = dict(node)
    if "$ref" in node:  # a model or enum: its schema, the field's own keys on top
        target = definitions[str(node.pop("$ref")).rpartition("/")[2]]
        node = {**_without(_object(target), "description"), **node}
    if "anyOf" in node:  # ``X | None``: the null only says "may be absent"
        choices = [choice for choice in _array(node.pop("anyOf")) if choice != {"type": "null"}]
        if len(choices) != 1:
            raise ValueError(f"no structural schema for a union of {choices}")
        node = {**_object(choices[0]), **node}
        return _rewrite(node, definitions)
    node = _without(node, *_DROPPED)
    if "properties" in node:
        node["properties"] = {
            name: _rewrite(_object(field), definitions)
            for name, field in _object(node["properties"]).items()
        }
    if "x-kubernetes-validations" in node:  # pydantic sorts their keys: the rule first
        rules = [_object(rule) for rule in _array(node["x-kubernetes-validations"])]
        node["x-kubernetes-validations"] = [{"rule": rule["rule"], **rule} for rule in rules]
    for key in ("items", "additionalProperties"):
        value = node.get(key)
        if isinstance(value, dict):
            node[key] = _rewrite(value, definitions)
    return _ordered(node)


def _object(value: JsonValue) -> Schema:
    if not isinstance(value, dict):
        raise ValueError(f"a JSON object expected in the schema, not {value!r}")
    return value


def _array(value: JsonValue) -> list[JsonValue]:
    if not isinstance(value, list):
        raise ValueError(f"a JSON array expected in the schema, not {value!r}")
    return value


def _without(node: Schema, *keys: str) -> Schema:
    return {key: value for key, value in node.items() if key not in keys}


def _ordered(node: Schema) -> Schema:
    # A fixed key order keeps the generated file's diffs readable.
    unknown = set(node) - set(_ORDER)
    if unknown:
        raise ValueError(f"schema keys with no place in a CRD: {sorted(unknown)}")
    return {key: node[key] for key in _ORDER if key in node}


class _Dumper(yaml.SafeDumper):
    """Block mappings, indented lists, and a list of plain values on one line (``[spec]``),
    as a person writes a CRD."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _list(dumper: yaml.SafeDumper, items: list[object]) -> yaml.Node:
    plain = all(not isinstance(item, dict | list) for item in items)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", items, flow_style=plain)


def _mapping(dumper: yaml.SafeDumper, mapping: dict[str, object]) -> yaml.Node:
    return dumper.represent_mapping("tag:yaml.org,2002:map", mapping, flow_style=False)


_Dumper.add_representer(list, _list)
_Dumper.add_representer(dict, _mapping)


def crd_yaml() -> str:
    """The chart's ``crds/noderemediations.yaml``, byte for byte."""
    body = yaml.dump(crd(), Dumper=_Dumper, sort_keys=False, width=1000)
    return HEADER + body


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m gpuguard.contract.crd PATH", file=sys.stderr)
        return 2
    Path(argv[0]).write_text(crd_yaml())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
