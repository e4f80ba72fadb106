"""The remediation controller end to end on the real API server.

Most tests write the agent's part directly (conditions and the report annotation, as the
agent does); the rung tests run the real agent on a bundle whose kernel log the test
appends to, with the bundle repair backend carrying out resets and reboots.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuguard.agent.daemon import Agent
from gpuguard.agent.maintenance_ack import with_maintenance_ack
from gpuguard.agent.repair import BundleRepair, RepairExecutor
from gpuguard.checks.registry import configured_checks
from gpuguard.config import Config
from gpuguard.controller.providers import NODECLAIMS
from gpuguard.kernel_log.followers import FileFollower
from gpuguard.kube.client import NodeApi
from gpuguard.kube.rest import KubeApi, load_api
from gpuguard.sources import BundleSources
from tests.support.cluster import (
    make_node,
    make_pod,
    pod_held_by_a_budget,
    set_health,
    wait_for,
)
from tests.support.controllers import (
    POOL,
    Running,
    append,
    node,
    node_name,
    only_rung,
    remediations,
    status_of,
    tainted,
)
from tests.support.controlplane import ControlPlane
from tests.support.metrics import sample

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def nodeclaim(api: KubeApi, node: str) -> str:
    name = f"claim-{node}"
    api.create(
        "/apis/karpenter.sh/v1/nodeclaims",
        {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": name}},
    )
    api.patch(f"/apis/karpenter.sh/v1/nodeclaims/{name}/status", {"status": {"nodeName": node}})
    return name


# --- the rungs, with the real agent ------------------------------------------------------
@pytest.fixture
def start_agent(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Callable[..., Path]]:
    running: list[Running] = []

    def start(name: str, **settings: Any) -> Path:
        bundle = tmp_path / name
        shutil.copytree(EXAMPLES / "healthy-h100", bundle)
        (bundle / "boot_id").write_text(f"boot-{uuid.uuid4()}\n")
        config = Config(
            **{
                "check_interval_s": 0.5,
                "heartbeat_interval_s": 2,
                "metrics_port": 0,
                "expected_gpus": 1,
                **settings,
            }
        )
        sources = BundleSources(bundle)
        agent = Agent(
            config,
            sources,
            configured_checks(config),
            FileFollower(bundle / "kmsg.log", 0.05),
            name,
            NodeApi(load_api(control_plane.admin_kubeconfig)),
        )
        rest = load_api(control_plane.admin_kubeconfig)
        backend = with_maintenance_ack(BundleRepair(bundle / "repairs.log"), config.maintenance)
        executor = RepairExecutor(rest, name, backend, agent.after_repair)
        running.append(Running(agent.run))
        running.append(Running(executor.run))
        return bundle

    yield start
    for item in running:
        item.halt()


def test_xid48_ends_with_a_gpu_reset_and_the_node_back_in_service(
    api, start_agent, start_controller
):
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    bundle = start_agent(name)
    start_controller()
    wait_for(lambda: node(api, name)["status"]["conditions"], what="the agent's first report")
    append(bundle, 48, "An uncorrectable double bit error (DBE) has been detected on GPU")
    wait_for(lambda: tainted(api, name), what="quarantine")
    closed = wait_for(lambda: status_of(api, name).get("resolution"), 40, "the episode closing")
    assert closed == "Repaired"
    status = status_of(api, name)
    assert status["rung"] == "RESET_GPU" and status["request"]["gpus"] == ["0000:91:00.0"]
    assert (bundle / "repairs.log").read_text() == "reset 0000:91:00.0\n"
    wait_for(lambda: not tainted(api, name), what="untaint")
    assert not node(api, name)["spec"].get("unschedulable")  # a reset never cordons


def test_xid79_ends_with_the_nodeclaim_deleted(api, start_agent, start_controller):
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    claim = nodeclaim(api, name)
    bundle = start_agent(name)
    start_controller()
    wait_for(lambda: node(api, name)["status"]["conditions"], what="the agent's first report")
    append(bundle, 79, "GPU has fallen off the bus.")
    wait_for(lambda: status_of(api, name).get("rung") == "REPLACE", 60, "escalation to REPLACE")
    assert (bundle / "repairs.log").read_text() == "reboot\n"  # the reboot did not help
    wait_for(
        lambda: (
            not any(
                c["metadata"]["name"] == claim
                for c in api.list("/apis/karpenter.sh/v1/nodeclaims").items
            )
        ),
        what="the NodeClaim deleted",
    )
    assert node(api, name)["spec"]["unschedulable"] is True
    api.delete(f"/api/v1/nodes/{name}")  # what Karpenter does once the claim is gone
    assert wait_for(lambda: status_of(api, name).get("resolution"), what="closed") == "Replaced"


def test_replace_deletes_the_nodeclaim_the_node_names_as_owner(api, start_controller):
    # As Karpenter registers a Node: an owner reference to its NodeClaim. The claim's
    # status names no node here, so only that reference can lead to it (no list needed).
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    claim = api.create(
        "/apis/karpenter.sh/v1/nodeclaims",
        {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": name}},
    )
    owner = {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": name}
    owner["uid"] = claim["metadata"]["uid"]
    api.patch(f"/api/v1/nodes/{name}", {"metadata": {"ownerReferences": [owner]}})
    set_health(api, name)
    start_controller(max_attempts=only_rung("REPLACE"))
    set_health(api, name, gpu="False", action="REBOOT", codes=("XID_79",))
    wait_for(
        lambda: name not in {c["metadata"]["name"] for c in api.list(NODECLAIMS.path()).items},
        30,
        "the owning NodeClaim deleted",
    )


def test_xid13_burst_kills_only_the_jobs_gpu_pods_and_drains_nothing(
    api, namespace, start_agent, start_controller
):
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    make_pod(api, namespace, "training", name, gpus=1)
    make_pod(api, namespace, "sidecar-cpu", name)
    bundle = start_agent(name, application_fault_ttl_s=8)
    start_controller(verify_timeout_s=20)
    wait_for(lambda: node(api, name)["status"]["conditions"], what="the agent's first report")
    for _ in range(20):
        append(bundle, 13, "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0)")
    wait_for(lambda: status_of(api, name).get("rung") == "KILL_JOB", what="KILL_JOB")

    def pods() -> set[str]:
        return {
            p["metadata"]["name"] for p in api.list(f"/api/v1/namespaces/{namespace}/pods").items
        }

    wait_for(lambda: pods() == {"sidecar-cpu"}, what="the GPU pod killed")
    assert wait_for(lambda: status_of(api, name).get("resolution"), 30, "closed") == "Repaired"
    assert not node(api, name)["spec"].get("unschedulable")
    assert pods() == {"sidecar-cpu"}


# --- policy behaviour, with conditions written by the test -------------------------------
def test_transient_problem_only_taints_and_untaints(api, start_controller):
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    set_health(api, name)
    start_controller(tolerance_s=30)
    set_health(api, name, gpu="False", action="RESET_GPU", codes=("NVLINK_DOWN",))
    wait_for(lambda: tainted(api, name), what="quarantine")
    set_health(api, name)
    wait_for(lambda: not tainted(api, name), what="untaint")
    status = status_of(api, name)
    assert status["resolution"] == "Transient" and not status.get("rung")
    assert not node(api, name)["spec"].get("unschedulable")


def test_pdb_that_allows_nothing_blocks_the_drain_and_nothing_is_force_deleted(
    api, namespace, start_controller
):
    # A budget is no evidence against the machine: past the drain timeout the episode holds
    # its rung (no REPLACE, nothing forced), cordoned and tainted, and says so once.
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    pod_held_by_a_budget(api, namespace, name, "guarded")
    set_health(api, name)
    controller = start_controller(drain_timeout_s=3)
    set_health(api, name, gpu="False", action="REBOOT", codes=("XID_79",))
    wait_for(lambda: status_of(api, name).get("phase") == "Draining", what="draining")
    wait_for(
        lambda: any(
            "PodDisruptionBudget" in s["message"] for s in status_of(api, name).get("steps", [])
        ),
        20,
        "the hold said",
    )
    status = status_of(api, name)
    assert (status["phase"], status["rung"]) == ("Draining", "REBOOT")
    assert api.get(f"/api/v1/namespaces/{namespace}/pods/guarded")["metadata"]["name"]
    assert (
        sample(
            controller.metrics.registry, "gpuguard_controller_evictions_total", outcome="blocked"
        )
        >= 1
    )
    assert node(api, name)["spec"].get("unschedulable") and tainted(api, name)
    said = [s for s in status["steps"] if "PodDisruptionBudget" in s["message"]]
    assert len(said) == 1 and "no escalation" in said[0]["message"]


def test_storm_taints_all_drains_within_budget_and_trips_the_breaker(api, start_controller):
    names = [f"storm-{uuid.uuid4().hex[:6]}-{i}" for i in range(50)]
    for name in names:
        make_node(api, name, labels={POOL: "storm"})
        set_health(api, name)
    controller = start_controller(
        budget={"max_unavailable": 2, "max_unavailable_percent": 10},
        breaker={"threshold_percent": 10, "window_s": 5, "close_percent": 5, "min_nodes": 3},
        verify_timeout_s=60,
        action_timeout_s=60,
    )
    bad = names[:20]
    for name in bad:
        set_health(api, name, gpu="False", action="REBOOT", codes=("XID_79",))
    wait_for(lambda: all(tainted(api, n) for n in bad), 30, "every bad node tainted")
    wait_for(
        lambda: sample(controller.metrics.registry, "gpuguard_controller_breaker_open") == 1,
        10,
        "breaker open",
    )
    cordoned = [n for n in names if node(api, n)["spec"].get("unschedulable")]
    assert len(cordoned) <= 2
    assert not any(tainted(api, n) for n in names[20:])
    for name in bad:
        set_health(api, name)
    wait_for(lambda: not any(tainted(api, n) for n in bad), 40, "every node untainted")
    wait_for(
        lambda: sample(controller.metrics.registry, "gpuguard_controller_breaker_open") == 0,
        20,
        "breaker closed",
    )
    for name in names:
        api.delete(f"/api/v1/nodes/{name}")


def test_excluded_do_not_disrupt_and_foreign_cordon_are_respected(api, start_controller):
    excluded, protected, cordoned = node_name(), node_name(), node_name()
    make_node(api, excluded, labels={POOL: "h100", "gpuguard.io/exclude": "true"})
    make_node(
        api, protected, labels={POOL: "h100"}, annotations={"karpenter.sh/do-not-disrupt": "true"}
    )
    make_node(api, cordoned, labels={POOL: "h100"}, unschedulable=True)
    start_controller(provider="delete-node")
    for name in (excluded, protected):
        set_health(api, name, gpu="False", action="REPLACE", codes=("ROW_REMAP_FAILURE",))
    set_health(api, cordoned, gpu="False", action="NONE", codes=("CHECK_TIMED_OUT",))
    wait_for(lambda: tainted(api, cordoned), what="the cordoned node quarantined")
    set_health(api, cordoned)
    wait_for(lambda: not tainted(api, cordoned), what="untaint")
    assert node(api, cordoned)["spec"]["unschedulable"] is True  # not our cordon to lift
    for name in (excluded, protected):
        assert not tainted(api, name)
        assert remediations(api, name) == [] or all(
            not r.get("status", {}).get("rung") for r in remediations(api, name)
        )
        assert node(api, name)  # never deleted


def test_dry_run_records_and_acts_on_nothing(api, start_controller):
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    set_health(api, name)
    start_controller(dry_run=True)
    set_health(api, name, gpu="False", action="REBOOT", codes=("XID_79",))
    wait_for(lambda: remediations(api, name), what="the episode recorded")
    wait_for(lambda: status_of(api, name).get("phase") in ("Draining", "Acting"), what="decided")
    assert not tainted(api, name) and not node(api, name)["spec"].get("unschedulable")


def test_operator_can_read_the_episode_history(api, start_controller):
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    set_health(api, name)
    start_controller(tolerance_s=30)
    set_health(api, name, gpu="False", action="REBOOT", codes=("XID_79",))
    steps = wait_for(lambda: status_of(api, name).get("steps"), what="steps")
    assert steps[0]["phase"] == "Quarantined" and steps[0]["at"]

    def events() -> list[dict[str, Any]]:  # written just after the step it tells of
        found = api.list("/apis/events.k8s.io/v1/namespaces/default/events").items
        return [
            e
            for e in found
            if e["regarding"]["name"] == name
            and e["reportingController"] == "gpuguard.io/controller"
            and e["reason"] != "PositionUnknown"  # about the node's labels, not the episode
        ]

    mine = wait_for(events, what="the episode's Event")
    assert mine[0]["related"]["kind"] == "NodeRemediation"
    assert json.loads(json.dumps(mine[0]))["type"] == "Warning"


def test_evictions_a_budget_refused_are_tried_again_soon_not_at_the_next_beat(
    api, namespace, start_controller
):
    """No watch tells the controller that a disruption budget lets a pod go again (its
    pods are elsewhere): a refused eviction is retried on a short deadline, as kubectl
    drain retries, not at the loop's 30 s liveness beat. Resync is 300 s here."""
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    for index in range(2):
        make_pod(api, namespace, f"held-{index}", name, labels={"app": "held"})
        api.patch(
            f"/api/v1/namespaces/{namespace}/pods/held-{index}/status",
            {"status": {"phase": "Running"}},
        )
    budgets = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
    api.create(
        budgets,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "held"},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "held"}}},
        },
    )  # no disruption controller here: with no status, every eviction is refused
    set_health(api, name, gpu="False", action="REBOOT", codes=("XID_79",))
    controller = start_controller(resync_s=300, drain_timeout_s=600)
    wait_for(
        lambda: sample(
            controller.metrics.registry, "gpuguard_controller_evictions_total", outcome="blocked"
        ),
        what="an eviction refused by the budget",
    )
    status = {
        "observedGeneration": 1,
        "disruptionsAllowed": 2,
        "currentHealthy": 2,
        "desiredHealthy": 0,
        "expectedPods": 2,
    }
    api.patch(f"{budgets}/held/status", {"status": status})  # the budget lets both go
    pods = f"/api/v1/namespaces/{namespace}/pods"
    wait_for(lambda: not api.list(pods).items, 15, "both pods evicted well before the 30 s beat")
