"""From a raw Node object (JSON) to the small projection the policy decides on.

Pure: the controller lists Nodes as plain JSON and keeps only this projection, never the
object (a 5,000-node list with image lists is tens of megabytes). What the agent wrote is
read through ``contract``; how the policy reads a layer is ``remediation.health``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuguard.contract.conditions import FALSE, KARPENTER_REPAIRS
from gpuguard.contract.errors import ContractError
from gpuguard.contract.keys import (
    CORDONED_BY_US_ANNOTATION,
    DO_NOT_DISRUPT,
    EXCLUDE_LABEL,
    INSTANCE_TYPE_LABEL,
    NODEPOOL_LABEL,
    POSITION_FIXED_ANNOTATION,
    REPORT_ANNOTATION,
    TAINT_KEY,
    VERIFY_REQUEST_ANNOTATION,
)
from gpuguard.contract.remediation import MAX_POSITION
from gpuguard.contract.report import ReportDocument, decode_report, read_layers, reported_at
from gpuguard.contract.times import parse_time
from gpuguard.contract.verify import VerifyAnswer, read_request
from gpuguard.kube.rest import Json
from gpuguard.remediation.health import as_policy_reads
from gpuguard.remediation.model import NodeObservation

log = logging.getLogger("gpuguard.controller")
# Why a node's position is not known (the policy then uses its name).
UNLABELLED, INCOMPLETE, TOO_LONG = "unlabelled", "incomplete", "too_long"
MAX_MARK = 253  # a person's position-fixed mark is a ticket id, shown in steps and Events


@dataclass(frozen=True)
class PositionReading:
    """The node's position from its labels ("": unknown), or why it is unknown
    (``problem``) and the labels that would have named it (``missing``)."""

    position: str = ""
    problem: str = ""
    missing: tuple[str, ...] = ()

    def describe(self) -> str:
        what = {
            UNLABELLED: "carries none of the position label sets",
            INCOMPLETE: "carries a position label set only in part",
            TOO_LONG: f"has position labels longer than {MAX_POSITION} characters in all",
        }[self.problem]
        missing = f" (missing: {', '.join(self.missing)})" if self.missing else ""
        return f"{what}{missing}: its own name stands for its position"


def read_position(
    labels: Mapping[str, str], label_sets: Sequence[Sequence[str]]
) -> PositionReading:
    """The first label set whose labels are all present (an empty value is absent) names
    the position, as ``label=value`` pairs in the set's order. None complete: unknown, and
    a set present in part is a labelling mistake worth naming (a rack without its slot).
    No label sets configured: positions are not used, and nothing is missing."""
    partial: list[str] = []
    for names in label_sets:
        present = [name for name in names if labels.get(name)]
        if len(present) == len(names):
            position = ",".join(f"{name}={labels[name]}" for name in names)
            if len(position) > MAX_POSITION:
                return PositionReading(problem=TOO_LONG)
            return PositionReading(position)
        if present:
            partial += [name for name in names if name not in present]
    if partial:
        return PositionReading(problem=INCOMPLETE, missing=tuple(partial))
    if not label_sets:
        return PositionReading()
    wanted = tuple(" + ".join(names) for names in label_sets)
    return PositionReading(problem=UNLABELLED, missing=wanted)


def project_node(
    node: Json,
    pool_label: str,
    domain_label: str = "",
    position: str = "",
) -> NodeObservation:
    """``domain_label``: the label naming the node's topology domain (a rack, a leaf
    switch) for the policy's shared-cause rule; unset or absent: the node is in none.
    ``position``: the node's, as ``read_position`` read it from its labels (the caller
    keeps the reading: why a position is unknown is told, not projected)."""
    metadata = node.get("metadata", {})
    name = str(metadata.get("name", ""))
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    spec = node.get("spec", {})
    document, answer = _report(annotations.get(REPORT_ANNOTATION), name)
    layers = read_layers(node.get("status", {}).get("conditions") or [], document)
    return NodeObservation(
        name=name,
        pool=str(labels.get(pool_label, "")),
        layers={layer: as_policy_reads(report) for layer, report in layers.items()},
        reported_at=reported_at(document),
        excluded=labels.get(EXCLUDE_LABEL) == "true",
        do_not_disrupt=annotations.get(DO_NOT_DISRUPT) == "true",
        tainted=any(t.get("key") == TAINT_KEY for t in spec.get("taints") or []),
        unschedulable=bool(spec.get("unschedulable")),
        cordoned_by_us=CORDONED_BY_US_ANNOTATION in annotations,
        verify_request=read_request(annotations.get(VERIFY_REQUEST_ANNOTATION)),
        verify=answer,
        domain=str(labels.get(domain_label, "")) if domain_label else "",
        uid=str(metadata.get("uid", "")),
        machine=_machine(labels),
        registered_at=_time(metadata.get("creationTimestamp")),
        repair_conditions=tuple(
            sorted(
                str(c["type"])
                for c in node.get("status", {}).get("conditions") or []
                if c.get("type") in KARPENTER_REPAIRS and c.get("status") == FALSE
            )
        ),
        position=position,
        position_fixed=_mark(annotations.get(POSITION_FIXED_ANNOTATION)),
    )


def _mark(value: object) -> str:
    """A person's position-fixed mark; an empty value is a mark all the same."""
    if value is None:
        return ""
    return str(value).strip()[:MAX_MARK] or "(no ticket)"


def _machine(labels: Mapping[str, str]) -> str:
    pool, kind = labels.get(NODEPOOL_LABEL), labels.get(INSTANCE_TYPE_LABEL)
    return f"{pool}/{kind}" if pool and kind else ""


def _time(text: object) -> float | None:
    try:
        return parse_time(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _report(text: object, name: str) -> tuple[ReportDocument | None, VerifyAnswer | None]:
    """The agent's report; an unreadable one recommends nothing (not knowing never
    triggers a repair) and is no heartbeat."""
    if not isinstance(text, str):
        return None, None
    try:
        return decode_report(text, f"Node/{name}")
    except ContractError as exc:
        log.warning("ignoring a report: %s", exc)
        return None, None
