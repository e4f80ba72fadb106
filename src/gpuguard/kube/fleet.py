"""Nodes as the controller holds them (small dicts) and the four writes it makes to them.

``taint``/``untaint`` add or remove only ``gpuguard.io/unhealthy:NoSchedule``;
``cordon``/``uncordon`` set ``spec.unschedulable`` together with our marker annotation, so
a node somebody else cordoned is never uncordoned by us. Each write is a read-modify-write
carrying the resourceVersion it was computed from: a concurrent change (the kubelet, an
operator, another controller's taint) makes it fail with 409 instead of being overwritten,
and it is recomputed on a fresh read. Every function is idempotent: asking for the state
the node is already in writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Mapping, Sequence

import msgspec

from gpuguard.contract.conditions import LAYER_OF_TYPE, POSITION_CONDITION
from gpuguard.contract.keys import CORDONED_BY_US_ANNOTATION, TAINT_EFFECT, TAINT_KEY
from gpuguard.kube.rest import NODES, Json, KubeApi, KubeConflict, KubeRefused, Listing
from gpuguard.retry import retry

CONFLICT_RETRIES = 5
_KEPT_METADATA = ("name", "uid", "resourceVersion", "labels", "annotations", "creationTimestamp")
_KEPT_CONDITIONS = frozenset({"Ready", POSITION_CONDITION, *LAYER_OF_TYPE})


def kept_conditions(conditions: list[Json]) -> list[Json]:
    """The conditions gpuguard reads (the kubelet's Ready, every profile's layer types,
    ours for a position), their words shared with every other Node's: the kubelet's
    pressure conditions and other components' are a third of a healthy Node's kept bytes
    at 100,000 Nodes, and nothing here reads them."""
    kept = [dict(c) for c in conditions if c.get("type") in _KEPT_CONDITIONS]
    for condition in kept:
        for word in _WORDS:
            text = condition.get(word)
            if isinstance(text, str):
                condition[word] = sys.intern(text)
    return kept


_WORDS = ("type", "status", "reason", "message")


# One string object for every Node that carries the same text. Nodes repeat their label
# keys and most values (zone, instance type, pool, the kubelet's version) and their
# conditions' words; a decoder makes a new string for each, a third of the cache at
# 100,000 Nodes. Interned strings are freed once no Node holds them.
def _shared_labels(labels: Mapping[str, str]) -> dict[str, str]:
    return dict(zip(map(sys.intern, labels), map(sys.intern, labels.values()), strict=True))


def _shared_keys(annotations: Mapping[str, str]) -> dict[str, str]:
    return dict(zip(map(sys.intern, annotations), annotations.values(), strict=True))


def slim_node(node: Json) -> Json:
    """The part of a Node the controller keeps: no images, addresses, capacity or
    managedFields (a 5,000-node fleet is ~70 MB of JSON, mostly image lists), only the
    conditions it reads."""
    metadata = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    slim_spec: Json = {}
    if spec.get("taints"):
        slim_spec["taints"] = spec["taints"]
    if spec.get("unschedulable"):
        slim_spec["unschedulable"] = True
    if spec.get("providerID"):
        slim_spec["providerID"] = spec["providerID"]
    kept = {key: metadata[key] for key in _KEPT_METADATA if key in metadata}
    if isinstance(kept.get("labels"), dict):
        kept["labels"] = _shared_labels(kept["labels"])
    if isinstance(kept.get("annotations"), dict):
        kept["annotations"] = _shared_keys(kept["annotations"])
    return {
        "metadata": kept,
        "spec": slim_spec,
        "status": {"conditions": kept_conditions(status.get("conditions") or [])},
    }


def list_nodes(api: KubeApi, *, label_selector: str = "") -> Listing:
    """Every Node as :func:`slim_node` would shrink it, decoded straight into that shape:
    the skipped fields (image lists, mostly) are never turned into Python objects, which
    makes a 5,000-node list about ten times cheaper to parse than ``json.loads``."""
    return api.list(NODES.path(), label_selector=label_selector, decode_page=decode_node_page)


class _Metadata(msgspec.Struct, omit_defaults=True):
    name: str = ""
    uid: str = ""
    resourceVersion: str = ""  # field names are the API's spelling
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    creationTimestamp: str | None = None


class _Spec(msgspec.Struct, omit_defaults=True):
    taints: list[Json] = []
    unschedulable: bool = False
    providerID: str = ""


class _Status(msgspec.Struct):
    conditions: list[Json] = []


class _SlimNode(msgspec.Struct):
    metadata: _Metadata = msgspec.field(default_factory=_Metadata)
    spec: _Spec = msgspec.field(default_factory=_Spec)
    status: _Status = msgspec.field(default_factory=_Status)


class _NodePage(msgspec.Struct):
    items: list[_SlimNode] = []
    metadata: Json = {}


_NODE_PAGE = msgspec.json.Decoder(_NodePage)
_NODE = msgspec.json.Decoder(_SlimNode)


def decode_node_page(content: bytes) -> Json:
    """A page of a Node list decoded straight into :func:`slim_node`'s shape."""
    page = _NODE_PAGE.decode(content)
    for node in page.items:
        _slimmed(node)
    return {"items": msgspec.to_builtins(page.items), "metadata": page.metadata}


def decode_node(content: bytes) -> Json:
    """One Node (a watch event's object) decoded straight into :func:`slim_node`'s shape;
    one the typed reading refuses (a null where a map goes) is read as ``slim_node`` reads
    it, and judged by the projection as before."""
    try:
        node: Json = msgspec.to_builtins(_slimmed(_NODE.decode(content)))
    except msgspec.ValidationError:
        return slim_node(json.loads(content))
    return node


def _slimmed(node: _SlimNode) -> _SlimNode:
    metadata = node.metadata
    metadata.labels = _shared_labels(metadata.labels)
    metadata.annotations = _shared_keys(metadata.annotations)
    node.status.conditions = kept_conditions(node.status.conditions)
    return node


def get_node(api: KubeApi, name: str) -> Json:
    return slim_node(api.get(NODES.path(name)))


def node_name(node: Json) -> str:
    return str(node["metadata"]["name"])


def taints_of(node: Json) -> list[Json]:
    return list((node.get("spec") or {}).get("taints") or [])


def is_tainted(node: Json) -> bool:
    """Carries our taint (whatever its value)."""
    return any(_is_ours(taint) for taint in taints_of(node))


def is_unschedulable(node: Json) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def is_cordoned_by_us(node: Json) -> bool:
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return CORDONED_BY_US_ANNOTATION in annotations


def taint(api: KubeApi, node: Json, *, value: str = "") -> Json:
    """Add ``gpuguard.io/unhealthy:NoSchedule``; other taints are kept as they are.

    Quarantine is the latency that matters, and the agent writes the same Node at the same
    moment (its report), so a write conditional on the resourceVersion would mostly fail
    once: first try a JSON patch that tests only the taints (and appends ours), and fall
    back to the conditional read-modify-write when the taints moved meanwhile."""
    ours: Json = {"key": TAINT_KEY, "effect": TAINT_EFFECT}
    if value:
        ours["value"] = value
    if not is_tainted(node) and (node.get("metadata") or {}).get("resourceVersion"):
        cached = taints_of(node)
        ops: list[Json] = (
            [
                {"op": "test", "path": "/spec/taints", "value": cached},
                {"op": "add", "path": "/spec/taints/-", "value": ours},
            ]
            if cached
            else [
                {"op": "test", "path": "/spec/taints", "value": None},
                {"op": "add", "path": "/spec/taints", "value": [ours]},
            ]
        )
        with contextlib.suppress(KubeRefused, KubeConflict):  # the taints moved: see below
            return slim_node(api.patch(NODES.path(node_name(node)), ops, "json"))

    def change(current: Json) -> Json | None:
        if is_tainted(current):
            return None
        return {"spec": {"taints": [*taints_of(current), ours]}}

    return _update(api, node, change)


def untaint(api: KubeApi, node: Json) -> Json:
    """Remove our taint only; foreign taints (and their order) stay."""

    def change(current: Json) -> Json | None:
        if not is_tainted(current):
            return None
        kept = [taint for taint in taints_of(current) if not _is_ours(taint)]
        return {"spec": {"taints": kept or None}}

    return _update(api, node, change)


def cordon(api: KubeApi, node: Json) -> Json:
    """Mark the node unschedulable and remember that we did. A node already cordoned by
    someone else is left alone (not claimed): check :func:`is_cordoned_by_us` on the
    answer to know whether closing the episode may uncordon it."""

    def change(current: Json) -> Json | None:
        if is_unschedulable(current):
            return None
        return {
            "metadata": {"annotations": {CORDONED_BY_US_ANNOTATION: "true"}},
            "spec": {"unschedulable": True},
        }

    return _update(api, node, change)


def uncordon(api: KubeApi, node: Json) -> Json:
    """Undo our cordon: only when our marker is there, and then remove both."""

    def change(current: Json) -> Json | None:
        if not is_cordoned_by_us(current):
            return None
        return {
            "metadata": {"annotations": {CORDONED_BY_US_ANNOTATION: None}},
            "spec": {"unschedulable": None},
        }

    return _update(api, node, change)


def patch_conditions(
    api: KubeApi, name: str, conditions: Sequence[Mapping[str, object]], remove: Sequence[str] = ()
) -> None:
    """Set ``conditions`` and delete the ``remove`` types on the Node, leaving all others
    alone: a strategic merge patch keyed by condition type, so the kubelet's own
    conditions (written concurrently) are never overwritten."""
    entries = [*conditions, *({"$patch": "delete", "type": kind} for kind in remove)]
    api.patch(NODES.path(name, sub="status"), {"status": {"conditions": entries}}, "strategic")


def _is_ours(taint: Json) -> bool:
    return taint.get("key") == TAINT_KEY and taint.get("effect") == TAINT_EFFECT


def _update(api: KubeApi, node: Json, change: Callable[[Json], Json | None]) -> Json:
    """Apply ``change`` as a merge patch conditional on the node's resourceVersion;
    on a conflict read the node again and recompute. Returns the node as it now is.

    "Nothing to do" is only trusted on a node just read: a cached node may be stale in
    exactly the way that hides the work (our taint added by a previous leader, say)."""
    current = node
    fresh = False
    if not (current.get("metadata") or {}).get("resourceVersion"):
        current, fresh = get_node(api, node_name(current)), True  # only a name was given

    def attempt() -> Json:
        nonlocal current, fresh
        patch = change(current)
        if patch is None and not fresh:
            current, fresh = get_node(api, node_name(current)), True
            patch = change(current)
        if patch is None:
            return current
        metadata: Json = patch.setdefault("metadata", {})
        metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        return slim_node(api.patch(NODES.path(node_name(current)), patch))

    def read_again(_: Exception) -> None:
        nonlocal current, fresh
        current, fresh = get_node(api, node_name(current)), True

    return retry(attempt, on=KubeConflict, attempts=CONFLICT_RETRIES + 1, before_retry=read_again)
