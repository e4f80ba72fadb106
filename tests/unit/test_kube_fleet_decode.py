"""The controller's Node shape (kube/fleet.py): the list decoder and ``slim_node`` keep the
same fields, and of the conditions only those gpuguard reads."""

from __future__ import annotations

import json

from gpuguard.contract.conditions import POSITION_CONDITION
from gpuguard.kube.fleet import decode_node_page, slim_node


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
