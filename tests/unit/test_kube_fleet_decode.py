"""The controller's Node shape (kube/fleet.py): the list decoder and ``slim_node`` keep the
same fields, and of the conditions only those gpuguard reads."""

from __future__ import annotations

import json

import pytest

from gpuguard.contract.conditions import POSITION_CONDITION
from gpuguard.kube.api_errors import KubeExpired
from gpuguard.kube.fleet import decode_node, decode_node_page, slim_node
from gpuguard.kube.rest import WatchEvent, watch_event


def condition(kind: str, status: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": status,
        "lastHeartbeatTime": "2026-12-04T10:00:00Z",
        "lastTransitionTime": "2026-12-04T09:00:00Z",
        "reason": "R",
        "message": "m",
    }


NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "gpu-1",
        "uid": "u-1",
        "resourceVersion": "7",
        "labels": {"karpenter.sh/nodepool": "h100"},
        "annotations": {"gpuguard.io/report": "{}"},
        "managedFields": [{"manager": "kubelet"}],
    },
    "spec": {
        "providerID": "aws:///us-west-2a/i-1",
        "taints": [{"key": "k", "effect": "NoSchedule"}],
    },
    "status": {
        "conditions": [
            condition("MemoryPressure", "False"),
            condition("DiskPressure", "False"),
            condition("PIDPressure", "False"),
            condition("Ready", "True"),
            condition("GpuguardGPUHealthy", "False"),
            condition("AcceleratedHardwareReady", "True"),
            condition(POSITION_CONDITION, "True"),
            condition("SomeoneElsesCondition", "True"),
        ],
        "images": [{"names": ["nvcr.io/nvidia/pytorch:24.05-py3"], "sizeBytes": 9871234567}],
    },
}


def test_the_decoder_and_slim_node_keep_the_same_node():
    page = json.dumps({"kind": "NodeList", "metadata": {"resourceVersion": "9"}, "items": [NODE]})
    (decoded,) = decode_node_page(page.encode())["items"]
    assert decoded == slim_node(NODE)
    assert "images" not in decoded["status"] and "managedFields" not in decoded["metadata"]


def test_only_the_conditions_gpuguard_reads_are_kept():
    kept = [c["type"] for c in slim_node(NODE)["status"]["conditions"]]
    assert kept == ["Ready", "GpuguardGPUHealthy", "AcceleratedHardwareReady", POSITION_CONDITION]


def test_nodes_share_their_repeated_words_however_they_were_read():
    """At 100,000 Nodes a copy of each label key and value per Node is a third of the
    cache: the list decoder and the watch's ``slim_node`` hand out one string object."""
    page = json.dumps({"kind": "NodeList", "metadata": {}, "items": [NODE]}).encode()
    (listed,) = decode_node_page(page)["items"]
    (again,) = decode_node_page(page)["items"]
    watched = slim_node(json.loads(json.dumps(NODE)))

    for other in (again, watched):
        ((key, value),) = listed["metadata"]["labels"].items()
        ((other_key, other_value),) = other["metadata"]["labels"].items()
        assert other_key is key and other_value is value
        (annotation,) = listed["metadata"]["annotations"]
        assert next(iter(other["metadata"]["annotations"])) is annotation
        for mine, theirs in zip(
            listed["status"]["conditions"], other["status"]["conditions"], strict=True
        ):
            assert all(theirs[word] is mine[word] for word in ("type", "status", "reason"))


def test_a_watched_node_is_decoded_as_slim_node_shrinks_it():
    line = json.dumps({"type": "MODIFIED", "object": NODE})
    event = watch_event(line, decode_node)
    assert event == WatchEvent("MODIFIED", slim_node(NODE))
    assert watch_event(line) == WatchEvent("MODIFIED", NODE)  # no decoder: the whole object


def test_a_watch_error_is_raised_as_its_status_whatever_decodes_objects():
    gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    line = json.dumps({"type": "ERROR", "object": gone})
    for decoder in (None, decode_node):
        with pytest.raises(KubeExpired, match="too old"):
            watch_event(line, decoder)


def test_a_watched_node_the_typed_reading_refuses_is_read_as_slim_node_reads_it():
    odd = {**NODE, "metadata": {**NODE["metadata"], "annotations": None}}
    assert decode_node(json.dumps(odd).encode()) == slim_node(odd)
