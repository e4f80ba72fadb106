"""A person with the real kubectl beside gpuguard: what `kubectl get noderemediations`
shows, and what gpuguard does with a cordon, a drain or an uncordon it did not make."""

from __future__ import annotations

from collections.abc import Callable

from gpuguard.kube.remediations import save_episode
from gpuguard.kube.rest import KubeApi
from gpuguard.model import Action
from gpuguard.remediation.model import Episode, Phase, Step
from tests.support.cluster import make_node, make_pod, pod_held_by_a_budget, set_health, wait_for
from tests.support.controllers import POOL, node, node_name, remediations, status_of, tainted

Kubectl = Callable[..., str]


def unschedulable(api: KubeApi, name: str) -> bool:
    return bool(node(api, name)["spec"].get("unschedulable"))


def test_kubectl_get_shows_each_episode_by_node_phase_rung_and_resolution(api, kubectl):
    name = node_name()
    opened = 1_796_000_000.0
    episode = Episode(
        node=name,
        opened_at=opened,
        phase=Phase.ACTING,
        rung=Action.REBOOT,
        attempts={Action.REBOOT: 1},
        phase_since=opened,
        steps=[Step(opened, Phase.ACTING, "REBOOT attempt 1: rebooting")],
    )
    save_episode(api, episode, new=True)
    header, *lines = kubectl("get", "noderemediations", "-o", "wide").splitlines()
    names = header.split()
    assert names == ["NAME", "NODE", "PHASE", "RUNG", "ATTEMPT", "RESOLUTION", "AGE", "LAST"]
    starts = [header.index(column) for column in names]
    (line,) = [line for line in lines if f" {name} " in line]
    cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    row = dict(zip(names, cells, strict=True))
    assert (row["NODE"], row["PHASE"], row["RUNG"], row["ATTEMPT"]) == (
        name,
        "Acting",
        "REBOOT",
        "1",
    )
    assert row["RESOLUTION"] == "" and row["LAST"] == "REBOOT attempt 1: rebooting"


def test_a_cordon_by_a_person_outlives_gpuguards_episode(api, kubectl, start_controller):
    """gpuguard quarantines with its taint; a person cordons the node too; when the node
    recovers gpuguard lifts its taint and leaves the person's cordon alone."""
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    # A fault with the default tolerance (Xid 79 has none): quarantine, no rung yet.
    set_health(api, name, gpu="False", action="REBOOT", codes=("XID_48",))
    start_controller(tolerance_s=300)
    wait_for(lambda: tainted(api, name) and remediations(api, name), what="quarantined")
    kubectl("cordon", name)
    set_health(api, name)
    wait_for(lambda: status_of(api, name).get("phase") == "Closed", what="the episode closed")
    wait_for(lambda: not tainted(api, name), what="gpuguard's taint lifted")
    assert unschedulable(api, name)  # the person's cordon stays


def test_a_drain_by_a_person_during_quarantine_is_left_to_them(
    api, namespace, kubectl, start_controller
):
    """`kubectl drain` of a node gpuguard holds quarantined (its fault within tolerance):
    the person's cordon and evictions go through, gpuguard starts no rung of its own for
    it, and when the node recovers only gpuguard's taint comes off."""
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    make_pod(api, namespace, "training", name, labels={"app": "training"})
    set_health(api, name, gpu="False", action="REBOOT", codes=("XID_48",))
    start_controller(tolerance_s=300)
    wait_for(lambda: tainted(api, name) and remediations(api, name), what="quarantined")
    # A bare pod needs --force; grace 0 because no kubelet here would end it.
    kubectl("drain", name, "--force", "--grace-period=0", "--ignore-daemonsets", "--timeout=60s")
    assert unschedulable(api, name)
    assert not api.list(f"/api/v1/namespaces/{namespace}/pods").items  # evicted by them
    assert status_of(api, name).get("phase") == "Quarantined"
    assert status_of(api, name).get("rung") is None
    set_health(api, name)
    wait_for(lambda: status_of(api, name).get("phase") == "Closed", what="the episode closed")
    wait_for(lambda: not tainted(api, name), what="gpuguard's taint lifted")
    assert unschedulable(api, name)  # the person's drain keeps its cordon


def test_an_uncordon_by_a_person_during_a_reboot_drain_is_reasserted(
    api, namespace, kubectl, start_controller
):
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    pod_held_by_a_budget(api, namespace, name, "training")  # the drain waits
    set_health(api, name, gpu="False", action="REBOOT", codes=("XID_79",))
    start_controller(drain_timeout_s=600)
    wait_for(
        lambda: status_of(api, name).get("phase") == "Draining" and unschedulable(api, name),
        what="draining for a reboot, cordoned",
    )
    kubectl("uncordon", name)
    wait_for(lambda: unschedulable(api, name), what="the cordon re-asserted")
    assert status_of(api, name).get("phase") == "Draining"  # the budget still holds the pod
