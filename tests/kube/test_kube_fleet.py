"""Taints and cordons on real Nodes: ours only, idempotent, safe against concurrent writers."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from gpuguard.contract.keys import CORDONED_BY_US_ANNOTATION, TAINT_KEY
from gpuguard.kube import fleet
from tests.support.controlplane import ControlPlane

FOREIGN = {"key": "example.com/maintenance", "value": "yes", "effect": "NoExecute"}
OUR_KEY_OTHER_EFFECT = {"key": TAINT_KEY, "effect": "PreferNoSchedule"}
OURS = {"key": TAINT_KEY, "effect": "NoSchedule"}


@pytest.fixture
def node(control_plane: ControlPlane) -> Iterator[str]:
    name = f"fleet-{uuid.uuid4().hex[:8]}"
    control_plane.request(
        "POST",
        "/api/v1/nodes",
        {
            "metadata": {"name": name, "labels": {"gpuguard.io/test": "fleet"}},
            "spec": {"taints": [FOREIGN, OUR_KEY_OTHER_EFFECT]},
        },
    )
    yield name
    control_plane.request("DELETE", f"/api/v1/nodes/{name}")


def read(plane: ControlPlane, name: str) -> dict:
    return plane.request("GET", f"/api/v1/nodes/{name}")


def taints(plane: ControlPlane, name: str) -> list[dict]:
    return [
        {k: v for k, v in t.items() if k != "timeAdded"}
        for t in read(plane, name)["spec"].get("taints", [])
    ]


def test_taint_and_untaint_touch_only_our_taint(api, control_plane, node):
    before = taints(control_plane, node)  # ours-to-be plus the API server's not-ready taint
    assert FOREIGN in before

    tainted = fleet.taint(api, fleet.get_node(api, node), value="gpu")
    assert fleet.is_tainted(tainted)
    assert taints(control_plane, node) == [*before, {**OURS, "value": "gpu"}]

    version = read(control_plane, node)["metadata"]["resourceVersion"]
    again = fleet.taint(api, tainted)
    assert read(control_plane, node)["metadata"]["resourceVersion"] == version  # no write
    assert again == tainted

    untainted = fleet.untaint(api, tainted)
    assert not fleet.is_tainted(untainted)
    assert taints(control_plane, node) == before  # foreign ones kept, in order
    fleet.untaint(api, untainted)
    assert taints(control_plane, node) == before


def test_a_stale_node_is_reread_so_a_concurrent_taint_survives(api, control_plane, node):
    stale = fleet.get_node(api, node)
    other = {"key": "other.example/drain", "effect": "NoSchedule"}
    current = read(control_plane, node)["spec"]["taints"]
    control_plane.request(
        "PATCH",
        f"/api/v1/nodes/{node}",
        {"spec": {"taints": [*current, other]}},
        "application/merge-patch+json",
    )

    fleet.taint(api, stale)  # computed from the stale list: 409, re-read, recomputed

    found = taints(control_plane, node)
    assert other in found
    assert OURS in found
    fleet.untaint(api, stale)  # stale again (it has no taint of ours): re-read, removed
    assert OURS not in taints(control_plane, node)
    assert other in taints(control_plane, node)


def test_a_bare_name_is_enough(api, control_plane, node):
    fleet.taint(api, {"metadata": {"name": node}})
    assert OURS in taints(control_plane, node)


def test_cordon_marks_it_ours_and_uncordon_undoes_both(api, control_plane, node):
    cordoned = fleet.cordon(api, fleet.get_node(api, node))
    assert fleet.is_unschedulable(cordoned)
    assert fleet.is_cordoned_by_us(cordoned)
    raw = read(control_plane, node)
    assert raw["spec"]["unschedulable"] is True
    assert raw["metadata"]["annotations"][CORDONED_BY_US_ANNOTATION] == "true"
    assert fleet.cordon(api, cordoned) == cordoned  # idempotent: nothing written

    uncordoned = fleet.uncordon(api, cordoned)
    raw = read(control_plane, node)
    assert not raw["spec"].get("unschedulable")
    assert CORDONED_BY_US_ANNOTATION not in raw["metadata"].get("annotations", {})
    assert fleet.uncordon(api, uncordoned) == uncordoned


def test_a_node_someone_else_cordoned_is_never_claimed_nor_uncordoned(api, control_plane, node):
    control_plane.request(
        "PATCH",
        f"/api/v1/nodes/{node}",
        {"spec": {"unschedulable": True}},
        "application/merge-patch+json",
    )

    after = fleet.cordon(api, fleet.get_node(api, node))
    assert fleet.is_unschedulable(after)
    assert not fleet.is_cordoned_by_us(after)

    fleet.uncordon(api, after)
    raw = read(control_plane, node)
    assert raw["spec"]["unschedulable"] is True
    assert CORDONED_BY_US_ANNOTATION not in raw["metadata"].get("annotations", {})


def test_list_nodes_keeps_only_what_the_controller_needs(api, control_plane, node):
    control_plane.request(
        "PATCH",
        f"/api/v1/nodes/{node}/status",
        {
            "status": {
                "conditions": [{"type": "GpuguardGPUHealthy", "status": "True"}],
                "images": [{"names": ["registry.example/cuda:12"], "sizeBytes": 10**9}],
                "nodeInfo": {"kernelVersion": "6.8"},
            }
        },
        "application/strategic-merge-patch+json",
    )

    listing = fleet.list_nodes(api, label_selector="gpuguard.io/test=fleet")

    found = next(n for n in listing.items if fleet.node_name(n) == node)
    assert found == fleet.slim_node(read(control_plane, node))  # typed decoding, same shape
    assert set(found) == {"metadata", "spec", "status"}
    assert set(found["status"]) == {"conditions"}
    assert found["status"]["conditions"][0]["type"] == "GpuguardGPUHealthy"
    assert "managedFields" not in found["metadata"]
    assert found["metadata"]["labels"] == {"gpuguard.io/test": "fleet"}
    assert FOREIGN in found["spec"]["taints"]
    assert listing.resource_version
