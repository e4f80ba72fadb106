"""The agent's repair executor on the real API server: woken by a watch of its node's
NodeRemediations rather than by polling, polling where RBAC refuses the watch, an answer
that could not be written is written later without repeating the repair, a reboot
waits until its answer can be written, one unreadable request silences nothing, and an
agent killed mid-repair answers the repair after its restart instead of repeating it."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuguard.agent.repair import BundleRepair, RepairExecutor
from gpuguard.kube import remediations
from gpuguard.kube.errors import KubeError
from gpuguard.kube.rest import KubeApi, KubeRefused, load_api
from gpuguard.model import Action
from gpuguard.remediation.model import Episode, Phase
from tests.support import controlplane
from tests.support.cluster import CRDS, install_gpuguard_crd, wait_for
from tests.support.controllers import Running, node_name
from tests.support.controlplane import REPO, ControlPlane

GPU = "0000:91:00.0"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
CRD_FILE = REPO / "deploy/helm/gpuguard/crds/noderemediations.yaml"


def request_action(
    api: KubeApi, node: str, action: Action = Action.RESET_GPU, *, age_s: float = 0.0
) -> str:
    """What the controller writes: an episode in ACTING with a request (RESET_GPU of one
    GPU unless told otherwise), opened ``age_s`` ago."""
    opened = time.time() - age_s
    ep = Episode(node=node, opened_at=opened, phase=Phase.ACTING, rung=action)
    ep.attempts = {action: 1}
    gpus = (GPU,) if action is Action.RESET_GPU else ()
    remediations.save_episode(api, ep, new=True)
    assert remediations.set_request(api, ep, action, 1, gpus, now=time.time())
    return remediations.object_name(node, ep.opened_at)


def answer(api: KubeApi, name: str) -> dict[str, object] | None:
    stored = api.get(remediations.NODE_REMEDIATIONS.path(name))
    result = (stored.get("status") or {}).get("result")
    return dict(result) if result else None


def executor_for(client: KubeApi, node: str, repairs: Path, **reads_s: float) -> RepairExecutor:
    """``reads_s``: the executor's ``poll_s`` and ``resync_s``."""
    return RepairExecutor(client, node, BundleRepair(repairs), lambda *_: None, **reads_s)


def failed_reads(caplog: pytest.LogCaptureFixture) -> int:
    return sum("reading repair requests failed" in r.getMessage() for r in caplog.records)


def test_a_request_is_performed_when_it_is_written_not_at_the_next_poll(
    api, control_plane, tmp_path
):
    # Reads an hour apart: only the watch can wake the executor in time.
    node, repairs = node_name(), tmp_path / "repairs.log"
    with load_api(control_plane.admin_kubeconfig) as client:
        executor = executor_for(client, node, repairs, poll_s=3600.0, resync_s=3600.0)
        running = Running(executor.run)
        wait_for(executor.watching.is_set, 5, "the watch open")
        written = time.monotonic()
        name = request_action(api, node)
        wait_for(repairs.exists, 5, "the reset")
        result = wait_for(lambda: answer(api, name), 5, "the answer")
        assert time.monotonic() - written < 5
        running.halt()
    assert repairs.read_text() == f"reset {GPU}\n"
    assert result["action"] == "RESET_GPU" and result["succeeded"] is True


@pytest.fixture
def limited_account(api: KubeApi, namespace: str, control_plane: ControlPlane, tmp_path: Path):
    """A ServiceAccount that may read NodeRemediations but not watch them (an older chart),
    and whose right to answer (patch the status) the test grants when it likes."""
    account = f"old-agent-{uuid.uuid4().hex[:6]}"
    api.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
    )
    created: list[str] = []

    def grant(resource: str, verbs: list[str]) -> None:
        role = f"{account}-{resource.replace('/', '-')}"
        rule = {"apiGroups": ["gpuguard.io"], "resources": [resource], "verbs": verbs}
        api.create(f"{RBAC}/clusterroles", {"metadata": {"name": role}, "rules": [rule]})
        subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
        ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}
        binding = {"metadata": {"name": role}, "subjects": [subject], "roleRef": ref}
        api.create(f"{RBAC}/clusterrolebindings", binding)
        created.append(role)

    grant("noderemediations", ["get", "list"])
    kubeconfig = tmp_path / "old-agent.kubeconfig"
    token = control_plane.service_account_token(namespace, account)
    kubeconfig.write_text(yaml.safe_dump(control_plane.kubeconfig_for_token(token)))
    yield kubeconfig, grant
    for role in created:
        api.delete(f"{RBAC}/clusterrolebindings/{role}")
        api.delete(f"{RBAC}/clusterroles/{role}")


def test_without_watch_rights_it_polls_and_acts_once_it_can_mark_the_attempt(
    api, limited_account, tmp_path, caplog
):
    # The attempt is marked on the object before it begins (a restarted agent must find
    # it): a mark the API server refuses means no reset yet, and a later read tries again.
    kubeconfig, grant = limited_account
    node, repairs = node_name(), tmp_path / "repairs.log"
    name = request_action(api, node)
    with (
        caplog.at_level(logging.INFO, logger="gpuguard.agent"),
        load_api(kubeconfig) as client,
    ):
        running = Running(executor_for(client, node, repairs, poll_s=0.2).run)
        wait_for(lambda: failed_reads(caplog) >= 3, 10, "several polls, each mark refused")
        assert not repairs.exists(), "reset without a mark a restart would find"
        grant("noderemediations/status", ["patch"])
        result = wait_for(lambda: answer(api, name), 10, "the answer, once allowed")
        running.halt()
    assert result["succeeded"] is True
    assert repairs.read_text() == f"reset {GPU}\n"
    warnings = [r.getMessage() for r in caplog.records if "cannot watch" in r.getMessage()]
    assert len(warnings) == 1 and "403" in warnings[0], warnings


def test_a_reboot_waits_until_its_answer_can_be_written(api, limited_account, tmp_path, caplog):
    # Once the reboot starts the agent may not get to write, so it answers first; an
    # answer the API server refuses means no reboot yet, and a later read tries both again.
    kubeconfig, grant = limited_account
    node, repairs = node_name(), tmp_path / "repairs.log"
    name = request_action(api, node, Action.REBOOT)
    with (
        caplog.at_level(logging.INFO, logger="gpuguard.agent"),
        load_api(kubeconfig) as client,
    ):
        running = Running(executor_for(client, node, repairs, poll_s=0.2).run)
        wait_for(lambda: failed_reads(caplog) >= 3, 10, "several reads, each answer refused")
        assert not repairs.exists(), "rebooted without having said so"
        grant("noderemediations/status", ["patch"])
        result = wait_for(lambda: answer(api, name), 10, "the answer, once allowed")
        wait_for(repairs.exists, 5, "the reboot")
        running.halt()
    assert result["action"] == "REBOOT" and result["message"] == "reboot started"
    assert repairs.read_text() == "reboot\n"


@pytest.fixture
def namespace(api: KubeApi) -> Iterator[str]:
    """A namespace for the ServiceAccount (no pods run here: no stand-in kubelet)."""
    name = f"repairs-{uuid.uuid4().hex[:6]}"
    api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    api.delete(f"/api/v1/namespaces/{name}")


# --- one unreadable request, a failing repair hook (chaos_findings F10) ----------------


def without_patterns(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: without_patterns(v) for k, v in schema.items() if k != "pattern"}
    if isinstance(schema, list):
        return [without_patterns(item) for item in schema]
    return schema


def written(api: KubeApi, path: str, status: dict[str, Any]) -> bool:
    try:
        api.patch(path, {"status": status})
    except KubeRefused:
        return False
    return True


COMMA_TIME = "2026-12-01T08:00:00,5Z"


@pytest.fixture
def crd_of_an_older_chart(api: KubeApi) -> Iterator[None]:
    """The CRD as a chart from before the time patterns installed it (Helm never upgrades
    a CRD): the API server stores ``…T08:00:00,5Z``, which gpuguard cannot read."""
    path = CRDS.path(f"{remediations.PLURAL}.gpuguard.io")
    probe = remediations.NODE_REMEDIATIONS.path(request_action(api, node_name()), sub="status")
    tries = iter(range(10**6))

    def comma_time_stored() -> bool:  # a new value each time: an unchanged one is let by
        return written(api, probe, {"phaseSince": f"2026-12-01T08:00:00,{next(tries)}Z"})

    current = api.get(path)
    api.replace(path, {**current, "spec": without_patterns(current["spec"])})
    wait_for(comma_time_stored, 20, "the older schema")
    yield
    current = api.get(path)  # its resourceVersion moved on
    api.replace(path, {**current, "spec": yaml.safe_load(CRD_FILE.read_text())["spec"]})
    wait_for(lambda: not comma_time_stored(), 20, "the schema back")


def unreadable_request(api: KubeApi, node: str, phase: str, age_s: float) -> str:
    name = request_action(api, node, age_s=age_s)
    request = {"action": "RESET_GPU", "attempt": 1, "requestedAt": COMMA_TIME}
    path = remediations.NODE_REMEDIATIONS.path(name, sub="status")
    assert written(api, path, {"phase": phase, "request": request})
    return name


def test_an_unreadable_request_is_skipped_and_the_next_one_answered(
    api, control_plane, crd_of_an_older_chart, tmp_path, caplog
):
    node, repairs = node_name(), tmp_path / "repairs.log"
    closed = unreadable_request(api, node, "Closed", age_s=200)
    odd = unreadable_request(api, node, "Acting", age_s=100)
    with caplog.at_level(logging.WARNING, logger="gpuguard"):
        assert remediations.pending_request_for(api, node) is None
        with load_api(control_plane.admin_kubeconfig) as client:
            running = Running(executor_for(client, node, repairs, poll_s=0.2).run)
            name = request_action(api, node)
            result = wait_for(lambda: answer(api, name), 10, "the good request answered")
            running.halt()
    assert result["succeeded"] is True and repairs.read_text() == f"reset {GPU}\n"
    assert answer(api, odd) is None
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(odd in line and "status.request.requestedAt" in line for line in said), said
    assert not any(closed in line for line in said), "a closed episode is not read at all"


def test_the_repair_thread_outlives_an_exception_and_answers(api, control_plane, tmp_path):
    node, repairs = node_name(), tmp_path / "repairs.log"
    calls: list[Action] = []

    def after_repair(action: Action, *_: object) -> None:
        calls.append(action)
        if len(calls) == 1:
            raise RuntimeError("a bug in what follows a repair")

    with load_api(control_plane.admin_kubeconfig) as client:
        executor = RepairExecutor(client, node, BundleRepair(repairs), after_repair, poll_s=0.2)
        running = Running(executor.run)
        first = request_action(api, node, age_s=100)
        assert wait_for(lambda: answer(api, first), 10, "the first answer")["succeeded"]
        second = request_action(api, node)
        assert wait_for(lambda: answer(api, second), 10, "the next answer")["succeeded"]
        running.halt()
    assert repairs.read_text() == f"reset {GPU}\n" * 2 and len(calls) == 2


# --- a repair is never done twice because of a restart (chaos_findings F6) -------------

AGENT = """
import logging, sys, threading
from gpuguard.agent.repair import NvidiaSmiRepair, RepairExecutor
from gpuguard.kube.rest import load_api
logging.basicConfig(level=logging.INFO)
kubeconfig, node, nvidia_smi = sys.argv[1:]
with load_api(kubeconfig) as api:
    backend = NvidiaSmiRepair(nvidia_smi, None)
    RepairExecutor(api, node, backend, lambda *_: None, poll_s=0.2).run(threading.Event())
"""


def slow_nvidia_smi(directory: Path) -> tuple[Path, Path]:
    """A stand-in for ``nvidia-smi -r`` (4 s on a real GPU): logs its start and its end."""
    tool, log = directory / "nvidia-smi", directory / "resets.log"
    tool.write_text(f'#!/bin/sh\necho "start $*" >> {log}\nsleep 2\necho "done $*" >> {log}\n')
    tool.chmod(0o755)
    return tool, log


def lines(path: Path, word: str) -> int:
    return path.read_text().split().count(word) if path.exists() else 0


def test_an_agent_killed_during_a_reset_answers_it_after_restarting_and_never_repeats_it(
    api, control_plane, tmp_path
):
    node = node_name()
    tool, resets = slow_nvidia_smi(tmp_path)
    name = request_action(api, node)
    argv = [sys.executable, "-c", AGENT, str(control_plane.admin_kubeconfig), node, str(tool)]
    agents = [subprocess.Popen(argv, cwd=REPO)]
    try:
        wait_for(lambda: lines(resets, "start") == 1, 10, "the reset started")
        agents[0].kill()  # SIGKILL mid-reset; the reset itself goes on
        agents[0].wait()
        assert answer(api, name) is None
        agents.append(subprocess.Popen(argv, cwd=REPO))
        result = wait_for(lambda: answer(api, name), 10, "the restarted agent's answer")
        wait_for(lambda: lines(resets, "done") >= 1, 10, "the first reset's end")
    finally:
        for agent in agents:
            agent.kill()
            agent.wait()
    assert lines(resets, "start") == 1, resets.read_text()
    assert result["action"] == "RESET_GPU" and result["succeeded"] is False
    assert "interrupted" in result["message"] and "not repeated" in result["message"]


def begun_reboot(api: KubeApi, node: str, boot_id: str) -> str:
    """A REBOOT request the agent marked as begun (on boot ``boot_id``), never answered."""
    name = request_action(api, node, Action.REBOOT)
    mark = {"action": "REBOOT", "attempt": 1, "at": "2026-12-01T08:00:00Z", "bootID": boot_id}
    api.patch(
        remediations.NODE_REMEDIATIONS.path(name, sub="status"), {"status": {"started": mark}}
    )
    return name


@pytest.mark.parametrize(
    ("boot_now", "succeeded", "words"),
    [("boot-2", True, "boot id changed"), ("boot-1", False, "interrupted")],
)
def test_a_begun_reboot_is_answered_by_the_boot_id(api, tmp_path, boot_now, succeeded, words):
    node, repairs = node_name(), tmp_path / "repairs.log"
    name = begun_reboot(api, node, "boot-1")
    executor = RepairExecutor(api, node, BundleRepair(repairs), lambda *_: None, boot_id=boot_now)
    executor.poll_once()
    result = answer(api, name)
    assert result is not None and result["succeeded"] is succeeded, result
    assert words in result["message"]
    assert not repairs.exists(), "a begun reboot is never started again"
    assert executor.poll_once() is None and not repairs.exists()


# row 57 (F5), the agent's half: the controller may be down when the new machine's agent
# starts, so the agent itself refuses a repair ordered for the machine before it.
@pytest.mark.parametrize("same_machine", [True, False], ids=["same-uid", "new-machine"])
def test_a_repair_ordered_for_the_machine_before_is_not_performed(
    api, control_plane, tmp_path, same_machine
):
    node = node_name()
    control_plane.request(
        "POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
    )
    uid = api.get(f"/api/v1/nodes/{node}")["metadata"]["uid"]
    opened = time.time()
    ep = Episode(
        node=node,
        opened_at=opened,
        phase=Phase.ACTING,
        rung=Action.REBOOT,
        attempts={Action.REBOOT: 1},
        node_uid=uid if same_machine else f"{uid[:-4]}dead",
    )
    remediations.save_episode(api, ep, new=True)
    assert remediations.set_request(api, ep, Action.REBOOT, 1, (), now=time.time())
    repairs = tmp_path / "repairs.log"
    executor_for(api, node, repairs).poll_once()
    performed = repairs.read_text().split() if repairs.exists() else []
    assert performed == (["reboot"] if same_machine else [])
    control_plane.request("DELETE", f"/api/v1/nodes/{node}")


def test_without_the_crd_it_says_so_once_and_asks_less_often_until_it_is_installed(
    tmp_path, caplog
):
    # An agent installed before the chart's CRD: each read is a 404. Said once, and
    # asked again less and less often; once the CRD is there, a request is performed.
    node, repairs = node_name(), tmp_path / "repairs.log"
    with (
        ControlPlane(tmp_path / "plane", controlplane.testenv_bin()) as plane,
        load_api(plane.admin_kubeconfig) as admin,
        load_api(plane.admin_kubeconfig) as client,
        caplog.at_level(logging.INFO, logger="gpuguard.agent"),
    ):
        running = Running(executor_for(client, node, repairs, poll_s=0.2).run)
        wait_for(lambda: not_served(caplog), 10, "the missing CRD said")
        window = time.monotonic() + 2.0  # ten reads at the old cadence, ten warnings
        while time.monotonic() < window and len(not_served(caplog)) + failed_reads(caplog) == 1:
            time.sleep(0.1)
        install_gpuguard_crd(admin)
        name = wait_for(lambda: _requested(admin, node), 30, "the request written")
        result = wait_for(lambda: answer(admin, name), 30, "the answer, once served")
        running.halt()
    assert result["succeeded"] is True
    assert len(not_served(caplog)) == 1, not_served(caplog)
    assert failed_reads(caplog) == 0


def not_served(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "are not served" in r.getMessage()]


def _requested(api: KubeApi, node: str) -> str | None:
    try:
        return request_action(api, node)
    except KubeError:  # the CRD is not established yet
        return None
