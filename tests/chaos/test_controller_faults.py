"""Controller faults (chaos_findings.md §2.1 and §2.7): real ``gpuguard controller``
processes, frozen, killed and stopped, and every write counted from the audit log.

The stand-in agent is the test: it writes the conditions and report (``set_health``), and
the project's RepairExecutor with BundleRepair answers the repair requests. The Lease
lasts 15 s with a 10 s renew deadline (the controller's defaults), so each takeover after
a freeze or a SIGKILL takes 15-19 s: one controller pair per test, and one takeover at most.
"""

from __future__ import annotations

import collections
import signal
from datetime import datetime
from typing import Any

from gpuguard.kube.remediations import NODE_REMEDIATIONS
from gpuguard.kube.rest import KubeApi
from tests.chaos.conftest import (
    Controllers,
    Replica,
    cordoned,
    phase,
    quiet_for,
    released,
    running_pods,
    status,
)
from tests.support.audit import (
    AuditLog,
    Write,
    cordons,
    episodes_created,
    evictions,
    repair_requests,
)
from tests.support.cluster import make_node, pod_budget, set_health, wait_for
from tests.support.controllers import (
    POOL,
    PROCESS_POLICY,
    node,
    node_name,
    remediations,
    tainted,
)

LEASE_S = 15.0
TAKEOVER_S = 60  # a frozen or killed leader's Lease runs out first (15-19 s)
THAWED_WINDOW_S = 3.0  # how long a thawed replica is watched for a stale write
STEPS_DOWN = "no longer leads"


# --- the cluster's side ----------------------------------------------------------------
def new_node(api: KubeApi) -> str:
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    set_health(api, name)
    return name


def needs_reboot(api: KubeApi, name: str) -> None:
    set_health(api, name, gpu="False", action="REBOOT", codes=("NVLINK_DOWN",))


def pair(controllers: Controllers, policy: dict[str, Any]) -> tuple[Replica, Replica]:
    """A leader (it leads before the standby starts) and a standby."""
    leader = controllers.start("leader", policy)
    controllers.wait_leading(leader)
    return leader, controllers.start("standby", policy)


def takeover(audit: AuditLog, new: Replica) -> Write:
    """The new leader's first write (taking the Lease): from then on the old one is stale."""
    first = audit.first(user=new.name)
    assert first is not None, f"{new.name} never wrote"
    return first


def stale_writes(audit: AuditLog, old: Replica, since: Write) -> list[Write]:
    """Thaw ``old``; what it writes from the moment it steps down and for a few seconds
    after. Everything it writes after ``since`` is stale: it no longer holds the Lease.

    One kind is let through: an Event about a step taken before ``since``. The fence is
    checked just before each request, so a request the freeze caught between the check
    and the socket goes out on thaw; writes of state carry a resourceVersion and are
    refused, but an Event, a report of what was done while leading, can arrive late."""
    old.thaw()
    wait_for(lambda: old.has_logged(STEPS_DOWN), 30, f"{old.name} to step down")
    late = quiet_for(THAWED_WINDOW_S, lambda: audit.writes(user=old.name, after=since.received))
    return [w for w in late if not reports_earlier_step(w, since)]


def reports_earlier_step(write: Write, since: Write) -> bool:
    if write.resource != "events" or not isinstance(write.body, dict):
        return False
    told = datetime.fromisoformat(str(write.body.get("eventTime"))).timestamp()
    return told < since.received


def described(writes: list[Write]) -> list[str]:
    return [
        f"{w.verb} {w.resource}/{w.subresource} {w.name} {w.code}: {w.body!s:.200}" for w in writes
    ]


# --- F1: split brain (rows 9, 10) --------------------------------------------------------
# Row 9 (F1)
def test_a_leader_frozen_while_acting_writes_nothing_after_it_thaws(
    audited_api, controllers, agents, audit
):
    api = audited_api
    name = new_node(api)
    old, new = pair(controllers, PROCESS_POLICY)
    needs_reboot(api, name)
    wait_for(lambda: status(api, name).get("request"), 60, "the REBOOT request")
    old.freeze()  # it wrote the request; the answer comes only now
    agent = agents(name)
    wait_for(lambda: phase(api, name) == "Verifying", TAKEOVER_S, "the new leader reads it")
    set_health(api, name)  # the agent's fresh report after the reboot
    wait_for(lambda: released(api, name), 30, "closed and released by the new leader")

    late = stale_writes(audit, old, since=takeover(audit, new))

    assert late == [], described(late)
    final = status(api, name)
    assert (final["phase"], final["resolution"]) == ("Closed", "Repaired")
    assert not tainted(api, name)
    assert agent.performed() == ["reboot"]


# Row 10 (F1)
def test_a_leader_frozen_in_quarantine_evicts_nothing_after_it_thaws(
    audited_api, audited_namespace, controllers, agents, audit
):
    api = audited_api
    name = new_node(api)
    agent = agents(name)
    old, new = pair(controllers, {**PROCESS_POLICY, "tolerance_s": 8})
    needs_reboot(api, name)
    wait_for(lambda: tainted(api, name) and phase(api, name) == "Quarantined", 30, "quarantined")
    old.freeze()  # the tolerance still runs: its plan to drain is not carried out yet
    wait_for(lambda: phase(api, name) == "Verifying", TAKEOVER_S, "the new leader reboots")
    set_health(api, name)
    wait_for(lambda: released(api, name), 30, "closed and released by the new leader")
    pods = running_pods(api, audited_namespace, name, 2, "after-repair")  # new work lands
    since = takeover(audit, new)

    late = stale_writes(audit, old, since)

    assert late == [], described(late)
    assert evictions(audit.writes(after=since.received)) == []
    listed = api.list(f"/api/v1/namespaces/{audited_namespace}/pods").items
    left = [p["metadata"]["name"] for p in listed if not p["metadata"].get("deletionTimestamp")]
    assert sorted(left) == pods
    assert not (tainted(api, name) or cordoned(api, name))
    assert agent.performed() == ["reboot"]


# --- F5: the same name on a new machine (row 57) -----------------------------------------
# Row 57 (F5)
def test_a_node_re_registered_under_its_name_is_not_repaired_for_the_old_machine(
    audited_api, controllers, agents
):
    api = audited_api
    name = new_node(api)
    controller = controllers.start("only", PROCESS_POLICY)
    controllers.wait_leading(controller)
    needs_reboot(api, name)  # the old machine's agent never answers
    wait_for(lambda: status(api, name).get("request"), 60, "the REBOOT request")
    (old_episode,) = remediations(api, name)
    old_uid = node(api, name)["metadata"]["uid"]
    controller.freeze()
    api.delete(f"/api/v1/nodes/{name}")
    wait_for(
        lambda: not any(n["metadata"]["name"] == name for n in api.list("/api/v1/nodes").items)
    )
    make_node(api, name, labels={POOL: "h100"})  # the new machine registers, healthy
    set_health(api, name)
    assert node(api, name)["metadata"]["uid"] != old_uid
    new_machine = agents(name)  # its agent starts with the node
    controller.thaw()

    old_path = NODE_REMEDIATIONS.path(old_episode["metadata"]["name"])
    closed = wait_for(
        lambda: new_machine.performed() or api.get(old_path)["status"].get("resolution"),
        30,
        "the old machine's episode to close",
    )

    assert new_machine.performed() == [], "the new machine was repaired for the old one"
    assert closed == "Gone"
    still_open = [r for r in remediations(api, name) if r["status"].get("phase") != "Closed"]
    assert [r["status"].get("request") for r in still_open if r["status"].get("request")] == []
    assert not (tainted(api, name) or cordoned(api, name))


# --- F7: a silent agent (row 58) ---------------------------------------------------------
# Row 58 (F7)
def test_a_silent_agent_has_its_node_tainted_with_an_event_and_never_repaired(
    audited_api, controllers, audit
):
    api = audited_api
    name = new_node(api)  # one healthy report and heartbeat, then nothing
    controller = controllers.start(
        "only", {**PROCESS_POLICY, "agent_timeout_s": 4, "unknown_grace_s": 2}
    )
    controllers.wait_leading(controller)

    wait_for(lambda: tainted(api, name), 30, "the silent node tainted")
    event = wait_for(lambda: agent_silent_event(api, name), 15, "an AgentSilent Event")

    assert name in (event.get("note") or event.get("message") or "")
    destructive = quiet_for(
        THAWED_WINDOW_S,
        lambda: cordons(audit.writes(), name) + repair_requests(audit.writes(), name),
    )
    assert destructive == [], described(destructive)


def agent_silent_event(api: KubeApi, name: str) -> dict[str, Any] | None:
    """An Event about Node ``name`` with reason AgentSilent (core or events.k8s.io)."""
    for event in api.list("/apis/events.k8s.io/v1/events").items:
        regarding = event.get("regarding") or {}
        if event.get("reason") == "AgentSilent" and regarding.get("name") == name:
            return dict(event)
    return None


# --- F14: an operator's uncordon mid-drain (row 55) --------------------------------------
# Row 55 (F14)
def test_an_uncordon_during_the_drain_is_undone(audited_api, audited_namespace, controllers):
    api = audited_api
    name = new_node(api)
    running_pods(api, audited_namespace, name, 1, "training")
    pod_budget(api, audited_namespace, "training")
    controller = controllers.start("only", PROCESS_POLICY)
    controllers.wait_leading(controller)
    needs_reboot(api, name)
    wait_for(
        lambda: phase(api, name) == "Draining" and cordoned(api, name), 30, "draining, cordoned"
    )

    api.patch(f"/api/v1/nodes/{name}", {"spec": {"unschedulable": False}})  # kubectl uncordon

    wait_for(lambda: cordoned(api, name), 10, "cordoned again")
    assert phase(api, name) == "Draining"


# --- held rows ---------------------------------------------------------------------------
# Row 1 (held)
def test_a_leader_killed_after_the_taint_leaves_one_cordon_one_request_one_reboot(
    audited_api, controllers, agents, audit
):
    api = audited_api
    name = new_node(api)
    agent = agents(name)
    old, new = pair(controllers, {**PROCESS_POLICY, "tolerance_s": 5})
    needs_reboot(api, name)
    wait_for(lambda: tainted(api, name), 30, "tainted")
    old.kill()  # the tolerance still runs
    wait_for(lambda: phase(api, name) == "Verifying", TAKEOVER_S, "the standby reboots it")
    set_health(api, name)
    wait_for(lambda: released(api, name), 30, "closed and released")

    by_controllers = [w for w in audit.writes() if w.user in (old.name, new.name)]
    assert len(episodes_created(by_controllers, name)) == 1
    assert len(cordons(by_controllers, name)) == 1
    assert len(repair_requests(by_controllers, name)) == 1
    assert agent.performed() == ["reboot"]
    final = status(api, name)
    assert (final["resolution"], final["attempts"]) == ("Repaired", {"REBOOT": 1})


# Row 8 (held)
def test_a_leader_stopped_mid_drain_releases_the_lease_and_nothing_is_repeated(
    audited_api, audited_namespace, controllers, agents, audit
):
    api = audited_api
    name = new_node(api)
    pods = running_pods(api, audited_namespace, name, 3, "training")
    budget = pod_budget(api, audited_namespace, "training")
    agent = agents(name)
    old, new = pair(controllers, PROCESS_POLICY)
    needs_reboot(api, name)
    wait_for(
        lambda: evictions(audit.writes(user=old.name), succeeded=False), 30, "a refused eviction"
    )

    old.proc.send_signal(signal.SIGTERM)
    assert old.proc.wait(15) == 0
    # Released, the Lease is taken on the standby's next try, long before it could expire.
    wait_for(lambda: controllers.holder() == new.name, LEASE_S - 5, "the standby leads")
    api.delete(budget)
    wait_for(lambda: phase(api, name) == "Verifying", 30, "drained and rebooted")
    set_health(api, name)
    wait_for(lambda: released(api, name), 30, "closed and released")

    lease_writes = audit.writes(user=old.name, resource="leases")
    assert not lease_writes[-1].body["spec"].get("holderIdentity")  # released
    evicted = collections.Counter(w.name for w in evictions(audit.writes()))
    assert evicted == dict.fromkeys(pods, 1)
    assert agent.performed() == ["reboot"]
    assert status(api, name)["resolution"] == "Repaired"


# Row 54 (held)
def test_a_taint_removed_by_an_operator_during_an_episode_comes_back(audited_api, controllers):
    api = audited_api
    name = new_node(api)
    controller = controllers.start("only", {**PROCESS_POLICY, "tolerance_s": 600})
    controllers.wait_leading(controller)
    needs_reboot(api, name)
    wait_for(lambda: tainted(api, name) and phase(api, name) == "Quarantined", 30, "quarantined")

    api.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})

    wait_for(lambda: tainted(api, name), 10, "the taint restored")


# Row 56 (held)
def test_an_episode_deleted_while_verifying_is_not_repaired_twice(
    audited_api, controllers, agents, audit
):
    api = audited_api
    name = new_node(api)
    agent = agents(name)
    controller = controllers.start("only", PROCESS_POLICY)
    controllers.wait_leading(controller)
    needs_reboot(api, name)
    wait_for(lambda: phase(api, name) == "Verifying", 30, "rebooted, verifying")
    (episode,) = remediations(api, name)

    api.delete(NODE_REMEDIATIONS.path(episode["metadata"]["name"]))
    set_health(api, name)  # the fresh report after the reboot

    wait_for(lambda: not (tainted(api, name) or cordoned(api, name)), 30, "released")
    assert agent.performed() == ["reboot"]
    by_controller = audit.writes(user=controller.name)
    assert len(repair_requests(by_controller, name)) == 1
