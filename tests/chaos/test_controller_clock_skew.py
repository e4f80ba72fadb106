"""A standby whose wall clock is an hour ahead of (or behind) the leader's takes over mid-
REBOOT and mid-drain (issue 28, chaos round 2, defect 1; docs/reliability.md R2-1).

Real ``gpuguard controller`` processes, the standby started with ``--clock-offset-s``; the
API server's audit log (its own, correct clock) says when each write came. The leader is
stopped with SIGTERM, so it hands the Lease over at once and the takeover is the standby's
first write. Before one whole timeout from then, nothing may climb the ladder or force
the drain; after it, the ladder goes on as usual.
"""

from __future__ import annotations

import time

import pytest

from gpuguard.kube.rest import KubeApi
from tests.chaos.conftest import Controllers, Replica, phase, quiet_for, running_pods, status
from tests.chaos.test_controller_faults import described, needs_reboot, new_node, takeover
from tests.support.audit import AuditLog, Write, evictions
from tests.support.cluster import pod_budget, wait_for
from tests.support.controllers import PROCESS_POLICY

HOUR = 3600.0
TIMEOUT_S = 12.0  # the phase timeout under test: short enough to see it end
GAVE_UP = ("not done within", "timed out", "blocked by a PodDisruptionBudget past")


def hand_over(controllers: Controllers, audit: AuditLog, skew: float) -> tuple[Replica, Write]:
    """Stop the leader; the skewed standby leads. Its first write (the Lease) is the
    takeover."""
    leader, standby = controllers.started
    leader.stop()
    controllers.wait_leading(standby, 15)
    wait_for(lambda: audit.first(user=standby.name), 10, "the takeover in the audit log")
    return standby, takeover(audit, standby)


def forced(audit: AuditLog, standby: Replica, name: str) -> list[Write]:
    """What a standby that misread the clocks would write: a pod or the Node deleted, a pod
    evicted, an episode step that gives up on the phase."""
    mine = audit.writes(user=standby.name)
    deleted = [w for w in mine if w.verb == "delete" and w.resource in ("pods", "nodes")]
    return deleted + evictions(mine)


def gave_up(api: KubeApi, name: str) -> list[str]:
    steps = status(api, name).get("steps") or []
    return [s["message"] for s in steps if any(w in s["message"] for w in GAVE_UP)]


@pytest.mark.parametrize("skew", [HOUR, -HOUR], ids=["ahead", "behind"])
def test_a_skewed_standby_taking_over_mid_reboot_waits_a_whole_action_timeout(
    audited_api, controllers, audit, skew
):
    api = audited_api
    name = new_node(api)  # nothing runs there: the drain is instant, the REBOOT is asked
    policy = {**PROCESS_POLICY, "action_timeout_s": TIMEOUT_S}
    controllers.wait_leading(controllers.start("leader", policy))
    controllers.start("standby", policy, clock_offset_s=skew)
    needs_reboot(api, name)  # no agent answers: the REBOOT stays asked
    wait_for(lambda: phase(api, name) == "Acting", 30, "the REBOOT asked")

    standby, took = hand_over(controllers, audit, skew)

    early = quiet_for(TIMEOUT_S - 2, lambda: forced(audit, standby, name) + gave_up(api, name))
    assert early == [], early
    assert status(api, name)["rung"] == "REBOOT"
    # A whole timeout after the takeover, on the API server's clock, the ladder climbs.
    deleted = wait_for(
        lambda: [w for w in forced(audit, standby, name) if w.resource == "nodes"],
        TIMEOUT_S + 30,
        "REPLACE once the REBOOT is a whole action timeout late",
    )
    assert deleted[0].received - took.received >= TIMEOUT_S - 1, described(deleted)


@pytest.mark.parametrize("skew", [HOUR, -HOUR], ids=["ahead", "behind"])
def test_a_skewed_standby_taking_over_mid_drain_forces_nothing_before_the_drain_timeout(
    audited_api, audited_namespace, controllers, audit, skew
):
    api = audited_api
    name = new_node(api)
    running_pods(api, audited_namespace, name, 2, "training")
    pod_budget(api, audited_namespace, "training")  # every eviction refused: the drain waits
    policy = {**PROCESS_POLICY, "drain_timeout_s": TIMEOUT_S}
    controllers.wait_leading(controllers.start("leader", policy))
    controllers.start("standby", policy, clock_offset_s=skew)
    needs_reboot(api, name)
    wait_for(lambda: phase(api, name) == "Draining", 30, "draining")

    standby, took = hand_over(controllers, audit, skew)

    early = quiet_for(TIMEOUT_S - 2, lambda: forced(audit, standby, name) + gave_up(api, name))
    assert early == [], early
    # Past the timeout the drain is held on its rung (a budget is no evidence against the
    # machine), counted from the takeover: still no pod forced out, no REPLACE.
    held = wait_for(lambda: gave_up(api, name), TIMEOUT_S + 30, "the drain held")
    assert time.time() - took.received >= TIMEOUT_S - 1  # the API server's clock, and ours
    assert "blocked by a PodDisruptionBudget" in held[0]
    assert forced(audit, standby, name) == []
    assert (status(api, name)["rung"], phase(api, name)) == ("REBOOT", "Draining")
