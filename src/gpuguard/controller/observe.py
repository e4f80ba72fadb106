"""From a raw Node object (JSON) to the small projection the policy decides on.

Pure: the controller lists Nodes as plain JSON and keeps only this projection, never the
object (a 5,000-node list with image lists is tens of megabytes).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any

from gpuguard.agent.conditions import PROFILES
from gpuguard.contract import times
from gpuguard.contract.keys import (
    CORDONED_BY_US_ANNOTATION,
    DO_NOT_DISRUPT,
    EXCLUDE_LABEL,
    REPORT_ANNOTATION,
    TAINT_KEY,
    VERIFY_REQUEST_ANNOTATION,
)
from gpuguard.model import Action
from gpuguard.remediation.model import LayerReport, NodeObservation, VerifyAnswer

# Condition type -> layer name, for every profile the agent may be running with.
LAYER_OF_TYPE = {kind: str(layer) for names in PROFILES.values() for layer, kind in names.items()}


def project_node(
    node: Mapping[str, Any], pool_label: str, domain_label: str = ""
) -> NodeObservation:
    """``domain_label``: the label naming the node's topology domain (a rack, a leaf
    switch) for the policy's shared-cause rule; unset or absent: the node is in none."""
    metadata = node.get("metadata", {})
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    spec = node.get("spec", {})
    report = _report(annotations.get(REPORT_ANNOTATION))
    layers: dict[str, LayerReport] = {}
    for condition in node.get("status", {}).get("conditions") or []:
        layer = LAYER_OF_TYPE.get(condition.get("type", ""))
        if layer is None:
            continue
        reported = report.get("layers", {}).get(layer, {})
        action = _action(reported.get("action"))
        status = str(condition.get("status", "Unknown"))
        deferred = reported.get("deferred") is True and action > Action.NONE
        if (
            status == "True"
            and action > Action.NONE
            and (reported.get("status") == "Degraded" or deferred)
        ):
            # Degraded but asking for a repair (a job's fault: kill it), or a deferred
            # repair under a profile that keeps it True (eks). The condition stays True so
            # Karpenter never replaces a node for a job's bug or for a drain and reset;
            # to the policy it is a problem to work on.
            status = "False"
        layers[layer] = LayerReport(
            status=status,
            reason=str(condition.get("reason", "")),
            since=parse_time(condition.get("lastTransitionTime")) or 0.0,
            action=action,
            codes=tuple(reported.get("codes") or ()),
            gpus=tuple(reported.get("gpus") or ()),
            deferred=deferred and status == "False",
        )
    return NodeObservation(
        name=str(metadata.get("name", "")),
        pool=str(labels.get(pool_label, "")),
        layers=layers,
        reported_at=parse_time(report.get("reportedAt")),
        excluded=labels.get(EXCLUDE_LABEL) == "true",
        do_not_disrupt=annotations.get(DO_NOT_DISRUPT) == "true",
        tainted=any(t.get("key") == TAINT_KEY for t in spec.get("taints") or []),
        unschedulable=bool(spec.get("unschedulable")),
        cordoned_by_us=CORDONED_BY_US_ANNOTATION in annotations,
        verify_requested_at=_exact_time(annotations.get(VERIFY_REQUEST_ANNOTATION)),
        verify=_verify_answer(report.get("verify")),
        domain=str(labels.get(domain_label, "")) if domain_label else "",
    )


def _verify_answer(entry: object) -> VerifyAnswer | None:
    """The report's answer to a verify request; anything garbled is no answer (which
    times out as a failure, never passes)."""
    if not isinstance(entry, dict):
        return None
    requested_at = _exact_time(entry.get("requestedAt"))
    codes = entry.get("codes")
    if requested_at is None or not isinstance(codes, list):
        return None
    return VerifyAnswer(requested_at, entry.get("passed") is True, tuple(map(str, codes)))


def _exact_time(value: object) -> float | None:
    """A verify stamp, back to exactly the float the policy wrote (it matches on it)."""
    if not isinstance(value, str):
        return None
    try:
        return times.parse_time(value)
    except ValueError:
        return None


def parse_time(value: object) -> float | None:
    """RFC 3339 (as Kubernetes writes it) to epoch seconds; None when absent or garbled."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def format_time(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _report(text: object) -> dict[str, Any]:
    if not isinstance(text, str):
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _action(name: object) -> Action:
    # An unreadable report recommends nothing: not knowing never triggers a repair.
    return Action[name] if isinstance(name, str) and name in Action.__members__ else Action.NONE
