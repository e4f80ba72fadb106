"""NodeRemediation objects on a real kube-apiserver: the chart's CRD, exact round trips of
an Episode, the kubectl columns, and the request/result exchange with a node's agent."""

from __future__ import annotations

import contextlib
import time
import urllib.request
import uuid
from collections.abc import Iterator

import pytest
import yaml

from gpuguard.contract.errors import ContractError
from gpuguard.kube import remediations
from gpuguard.kube.rest import KubeApi, KubeConflict, KubeRefused, Resource, load_api
from gpuguard.model import Action
from gpuguard.remediation.model import ActionResult, Episode, Phase, Resolution, Step
from tests.support.cluster import wait_for
from tests.support.controlplane import REPO, ControlPlane

CRD_FILE = REPO / "deploy" / "helm" / "gpuguard" / "crds" / "noderemediations.yaml"
CRDS = Resource("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions")
T0 = 1_795_978_800.0  # 2026-11-29T19:00:00Z


@pytest.fixture(scope="module")
def api(control_plane: ControlPlane) -> Iterator[KubeApi]:
    with load_api(control_plane.admin_kubeconfig) as client:
        crd = yaml.safe_load(CRD_FILE.read_text())
        with contextlib.suppress(KubeConflict):  # applied by an earlier module
            client.create(CRDS.path(), crd)
        name = crd["metadata"]["name"]

        def established() -> bool:
            status = client.get(CRDS.path(name)).get("status", {})
            return any(
                c["type"] == "Established" and c["status"] == "True"
                for c in status.get("conditions") or []
            )

        wait_for(established, 20, "the CRD established")
        yield client


def node_name() -> str:
    return f"gpu-{uuid.uuid4().hex[:8]}"


def full_episode(node: str) -> Episode:
    now = time.time()  # a float with every bit used: the round trip must keep them all
    return Episode(
        node=node,
        opened_at=T0 + 0.123456789,
        phase=Phase.VERIFYING,
        rung=Action.REBOOT,
        attempts={Action.RESET_GPU: 2, Action.REBOOT: 1},
        phase_since=now,
        last_action_at=now - 61.5,
        action_result=ActionResult(
            attempt=1, action=Action.REBOOT, succeeded=True, at=now - 1, message="rebooted"
        ),
        cordoned_by_us=True,
        gpus=("0000:91:00.0", "0000:1a:00.0"),
        exhausted=False,
        closed_at=None,
        resolution=None,
        machine="gpu/p5.48xlarge",
        replacement="gpu-replacement",  # never both in life; the round trip keeps each
        position="rack=r1,position=u1",
        signature=("IB_LINK_DOWN@mlx5_0/1",),
        position_fault="position rack=r1,position=u1: gpu-old was replaced there",
        position_fixed_at=now - 30,
        slow_confirmed=True,
        steps=[
            Step(at=T0, phase=Phase.QUARANTINED, message="XID_79 on 0000:91:00.0: tainted"),
            Step(at=now - 62, phase=Phase.DRAINING, message="cordoned; evicting 3 pods"),
            Step(at=now, phase=Phase.VERIFYING, message="reboot done; waiting for a report"),
        ],
    )


def stored(api: KubeApi, ep: Episode) -> dict:
    name = remediations.object_name(ep.node, ep.opened_at)
    return api.get(remediations.NODE_REMEDIATIONS.path(name))


def test_episode_round_trips_exactly_through_the_api_server(api):
    ep = full_episode(node_name())
    assert remediations.episode_from_object(remediations.episode_to_object(ep)) == ep

    remediations.save_episode(api, ep)
    obj = stored(api, ep)
    assert obj["metadata"]["name"] == f"{ep.node}-{int(T0)}"
    assert obj["spec"] == {
        "nodeName": ep.node,
        "openedAt": "2026-11-29T19:00:00.1234567Z",
        "position": "rack=r1,position=u1",
    }
    assert remediations.episode_from_object(obj) == ep

    version = obj["metadata"]["resourceVersion"]
    remediations.save_episode(api, ep)  # idempotent: the same fields, no new version
    assert stored(api, ep)["metadata"]["resourceVersion"] == version

    ep.phase = Phase.CLOSED
    ep.closed_at = time.time()
    ep.resolution = Resolution.REPAIRED
    ep.rung = None  # cleared fields are removed, not left behind
    ep.attempts = {Action.REBOOT: 1}
    ep.last_action_at = None
    ep.gpus = ()
    ep.steps.append(Step(at=ep.closed_at, phase=Phase.CLOSED, message="healthy; untainted"))
    remediations.save_episode(api, ep)
    assert remediations.episode_from_object(stored(api, ep)) == ep


def test_a_minimal_episode_round_trips_too(api):
    node = node_name()
    ep = Episode(node=node, opened_at=T0, position=node)  # no position labels: its name
    remediations.save_episode(api, ep)
    assert remediations.episode_from_object(stored(api, ep)) == ep


def test_an_episode_stored_without_a_position_reads_as_its_nodes():
    """Objects written before positions existed: the node's name stands for it."""
    ep = Episode(node=node_name(), opened_at=T0)
    read = remediations.episode_from_object(remediations.episode_to_object(ep))
    assert read.position == ep.node


def test_list_episodes_splits_open_from_closed(api):
    node = node_name()
    old = Episode(node=node, opened_at=T0, phase=Phase.CLOSED, closed_at=T0 + 60, position=node)
    old.resolution = Resolution.TRANSIENT
    current = Episode(
        node=node, opened_at=T0 + 3600, phase=Phase.DRAINING, rung=Action.REBOOT, position=node
    )
    for ep in (old, current):
        remediations.save_episode(api, ep)

    open_by_node, closed = remediations.list_episodes(api)

    assert open_by_node[node] == current
    assert old in closed


def test_closed_episodes_past_retention_are_deleted_and_nothing_else(api):
    node = node_name()
    day = 86400.0
    long_closed = Episode(node=node, opened_at=T0 - 40 * day, phase=Phase.CLOSED)
    long_closed.closed_at, long_closed.resolution = T0 - 39 * day, Resolution.REPAIRED
    recently_closed = Episode(node=node, opened_at=T0 - 3 * day, phase=Phase.CLOSED)
    recently_closed.closed_at, recently_closed.resolution = T0 - 2 * day, Resolution.TRANSIENT
    # Open for 50 days (waiting for a human): never deleted, however old.
    still_open = Episode(node=node, opened_at=T0 - 50 * day, phase=Phase.QUARANTINED)
    for ep in (long_closed, recently_closed, still_open):
        remediations.save_episode(api, ep)

    deleted = remediations.delete_closed_before(api, T0 - 30 * day)

    assert deleted >= 1  # other tests' old closed episodes may go too
    left = {
        obj["metadata"]["name"]
        for obj in api.list(remediations.NODE_REMEDIATIONS.path()).items
        if obj["spec"]["nodeName"] == node
    }
    name = remediations.object_name
    assert left == {
        name(node, recently_closed.opened_at),
        name(node, still_open.opened_at),
    }


def test_the_controller_keeps_at_least_the_history_its_policy_reads(api):
    from gpuguard.controller.loop import Controller
    from gpuguard.remediation.policy import Policy

    policy = Policy()
    controller = Controller(
        api,
        policy,
        "delete-node",
        namespace="default",
        identity="test",
        keep_closed_s=60,
    )
    assert controller.keep_closed_s == max(policy.lemon_window_s, policy.breaker.window_s)
    assert controller.keep_closed_s >= 7 * 86400


def test_the_schema_rejects_what_the_controller_would_never_write(api):
    ep = Episode(node=node_name(), opened_at=T0)
    remediations.save_episode(api, ep)
    name = remediations.object_name(ep.node, ep.opened_at)
    path = remediations.NODE_REMEDIATIONS.path(name, sub="status")
    with pytest.raises(KubeRefused) as bad_phase:
        api.patch(path, {"status": {"phase": "Rebooting"}})
    assert bad_phase.value.code == 422
    with pytest.raises(KubeRefused, match="date-time"):
        api.patch(path, {"status": {"closedAt": "yesterday"}})
    with pytest.raises(KubeRefused, match="immutable"):
        api.patch(remediations.NODE_REMEDIATIONS.path(name), {"spec": {"nodeName": "other"}})


def test_a_malformed_object_is_one_error_naming_it_and_the_field():
    obj = remediations.episode_to_object(full_episode("gpu-malformed"))
    obj["status"]["steps"][1]["phase"] = "Rebooting"
    with pytest.raises(ContractError) as error:
        remediations.episode_from_object(obj)
    assert error.value.obj == f"NodeRemediation/{obj['metadata']['name']}"
    assert error.value.field == "status.steps[1].phase"


def test_an_object_the_controller_cannot_read_is_skipped_and_kept(api):
    # The schema takes any step phase; the controller reads only its own.
    day = 86400.0
    ep = Episode(node=node_name(), opened_at=T0 - 100 * day, phase=Phase.CLOSED)
    ep.closed_at, ep.resolution = T0 - 100 * day, Resolution.TRANSIENT
    remediations.save_episode(api, ep)
    name = remediations.object_name(ep.node, ep.opened_at)
    step = {"at": "2026-08-21T19:00:00Z", "phase": "Rebooting", "message": "not ours"}
    api.patch(
        remediations.NODE_REMEDIATIONS.path(name, sub="status"), {"status": {"steps": [step]}}
    )

    open_by_node, closed = remediations.list_episodes(api)
    assert ep.node not in open_by_node
    assert all(other.node != ep.node for other in closed)
    remediations.delete_closed_before(api, T0 - 99 * day)
    assert stored(api, ep)["metadata"]["name"] == name  # left for a person to see


def test_kubectl_columns(api, control_plane):
    ep = full_episode(node_name())
    remediations.save_episode(api, ep)
    name = remediations.object_name(ep.node, ep.opened_at)
    request = urllib.request.Request(
        f"{control_plane.url}{remediations.NODE_REMEDIATIONS.path(name)}",
        headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
    )
    with urllib.request.urlopen(request, context=control_plane.ssl_context()) as answer:
        table = yaml.safe_load(answer.read())

    columns = [c["name"] for c in table["columnDefinitions"]]
    assert columns == ["Name", "Node", "Phase", "Rung", "Attempt", "Resolution", "Age", "Last"]
    cells = table["rows"][0]["cells"]
    assert cells[:6] == [name, ep.node, "Verifying", "REBOOT", 1, None]
    assert cells[7] == "reboot done; waiting for a report"


def test_request_and_result_between_controller_and_agent(api):
    ep = Episode(node=node_name(), opened_at=T0, phase=Phase.ACTING, rung=Action.RESET_GPU)
    ep.attempts = {Action.RESET_GPU: 1}
    remediations.save_episode(api, ep)
    name = remediations.object_name(ep.node, ep.opened_at)
    assert remediations.pending_request_for(api, ep.node) is None

    gpus = ("0000:91:00.0",)
    assert remediations.set_request(api, ep, Action.RESET_GPU, 1, gpus, now=T0 + 100.25)
    assert not remediations.set_request(api, ep, Action.RESET_GPU, 1, gpus, now=T0 + 200)
    assert remediations.read_result(api, ep) is None

    pending = remediations.pending_request_for(api, ep.node)
    assert pending == (
        name,
        remediations.ActionRequest(Action.RESET_GPU, 1, gpus, requested_at=T0 + 100.25),
    )
    assert remediations.pending_request_for(api, node_name()) is None  # other nodes: none

    answer = ActionResult(attempt=1, action=Action.RESET_GPU, succeeded=False, at=T0 + 130.5)
    remediations.report_result(api, name, answer)
    assert remediations.pending_request_for(api, ep.node) is None
    assert remediations.read_result(api, ep) == answer

    ep.steps.append(Step(at=T0 + 131, phase=Phase.ACTING, message="reset failed"))
    remediations.save_episode(api, ep)  # the controller's save keeps the agent's answer
    reread = remediations.episode_from_object(stored(api, ep))
    assert reread.action_result == answer
    assert stored(api, ep)["status"]["request"]["requestedAt"] == "2026-11-29T19:01:40.25Z"

    # Next attempt: a new request, the old answer no longer counts for it.
    ep.attempts[Action.RESET_GPU] = 2
    assert remediations.set_request(api, ep, Action.RESET_GPU, 2, gpus, now=T0 + 300)
    assert remediations.read_result(api, ep) is None
    pending = remediations.pending_request_for(api, ep.node)
    assert pending is not None
    assert pending[1].attempt == 2


def test_long_node_names_still_give_valid_object_names():
    node = "n" * 250
    name = remediations.object_name(node, T0)
    assert len(name) <= 253
    assert name.endswith(f"-{int(T0)}")
    assert name != remediations.object_name(node[:-1] + "m", T0)  # differ past the cut


def test_a_huge_answer_is_cut_and_the_episode_stays_writable(api):
    # chaos_findings F11: a 1 MB message, copied by the controller into a step,
    # lastMessage and result, made every later save of the episode fail.
    ep = Episode(node=node_name(), opened_at=T0, phase=Phase.ACTING, rung=Action.RESET_GPU)
    ep.attempts = {Action.RESET_GPU: 1}
    remediations.save_episode(api, ep)
    name = remediations.object_name(ep.node, ep.opened_at)
    assert remediations.set_request(api, ep, Action.RESET_GPU, 1, ("0000:91:00.0",), T0 + 1)
    huge = "nvidia-smi: " + "x" * 1_000_000
    remediations.report_result(api, name, ActionResult(1, Action.RESET_GPU, False, T0 + 2, huge))

    answer = remediations.read_result(api, ep)
    assert answer is not None and not answer.succeeded
    assert answer.message.startswith("nvidia-smi: x") and len(answer.message) <= 1024
    # What the controller does with it (Lifecycle: "<label> failed: <message>").
    ep.action_result = answer
    ep.steps.append(Step(T0 + 3, Phase.ACTING, f"RESET_GPU attempt 1 failed: {huge}"))
    remediations.save_episode(api, ep)
    status = stored(api, ep)["status"]
    assert len(status["lastMessage"]) <= 1024
    assert status["lastMessage"].startswith("RESET_GPU attempt 1 failed: nvidia-smi: x")
    assert status["steps"][-1]["message"] == status["lastMessage"]


def test_an_over_long_message_written_before_the_limits_is_cut_when_read():
    obj = remediations.episode_to_object(full_episode("gpu-old-object"))
    obj["status"]["steps"][0]["message"] = "m" * 100_000
    obj["status"]["lastMessage"] = "m" * 100_000
    obj["status"]["result"]["message"] = "r" * 100_000
    ep = remediations.episode_from_object(obj)
    assert ep.steps[0].message.startswith("mmm") and len(ep.steps[0].message) <= 1024
    assert ep.action_result is not None and len(ep.action_result.message) <= 1024
