"""A rack-wide link loss on the real API server: the controller holds the rack's nodes.

Three nodes of one rack (the policy's domain label) lose their network layer together,
as a dead leaf switch would do. The real controller taints them and records why it holds
them, and does not cordon, drain, reboot or replace them; when the rack's network comes
back their episodes close and the taints come off.
"""

from __future__ import annotations

import time

from tests.support.cluster import make_node, make_pod, set_health, wait_for
from tests.support.controllers import POOL, node, node_name, reconciled, status_of, tainted

RACK_LABEL = "gpuguard.io/rack"
EVENTS = "/apis/events.k8s.io/v1/namespaces/default/events"


def held(api, name) -> bool:
    steps = status_of(api, name).get("steps", [])
    return any("held until the domain recovers" in step["message"] for step in steps)


def test_a_rack_that_loses_its_network_stays_tainted_and_is_not_drained(
    api, namespace, start_controller
):
    rack = [node_name() for _ in range(3)]
    for name in rack:
        make_node(api, name, labels={POOL: "rack-test", RACK_LABEL: "r1"})
        make_pod(api, namespace, f"job-{name}", name)
        set_health(api, name)
    controller = start_controller(
        tolerance_s=3,  # the three reports land within it: one incident from the start
        correlation={"domain_label": RACK_LABEL, "min_nodes": 3, "layers": ["network"]},
    )
    for name in rack:
        set_health(api, name, network="False", action="REBOOT", network_codes=("IB_LINK_DOWN",))
    reported = time.time()
    for name in rack:
        wait_for(lambda name=name: tainted(api, name), what=f"taint on {name}")
        wait_for(lambda name=name: held(api, name), what=f"held step on {name}")
    # Reconciles after the tolerance ran out, when a lone fault would be acted on: still
    # nothing disruptive.
    reconciled(controller, after=reported + 3)

    for name in rack:
        status = status_of(api, name)
        assert status["phase"] == "Quarantined" and not status.get("rung"), status
        assert "network fault shared by 3 nodes of gpuguard.io/rack=r1" in status["lastMessage"]
        assert tainted(api, name)
        assert not node(api, name)["spec"].get("unschedulable")  # never cordoned
        pod = api.get(f"/api/v1/namespaces/{namespace}/pods/job-{name}")
        assert not pod["metadata"].get("deletionTimestamp")  # never evicted
        notes = [
            e.get("note", "")
            for e in api.list(EVENTS).items
            if e.get("regarding", {}).get("name") == name
        ]
        assert any("held until the domain recovers" in note for note in notes), notes

    for name in rack:
        set_health(api, name)  # the switch is back
    for name in rack:
        wait_for(lambda name=name: not tainted(api, name), what=f"untaint of {name}")
        assert status_of(api, name)["resolution"] == "Transient"
